// Entry points for the FP8 cast, amax and scale updates: argument checks, output allocation, 2^margin
// rounded once to f32 on the host, and dispatch on device to kernels/cpu/ and kernels/cuda/.
#include "kernels/fp8.h"

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "core/float_formats.h"
#include "core/op_ledger.h"
#include "kernels/common.h"
#include "kernels/cpu/fp8_cpu.h"
#include "kernels/cuda/fp8_cuda.h"
#include "kernels/fp8_scale_rule.h"
#include "kernels/nn_ops.h"
#include "kernels/reduce.h"

namespace octet::kernels {
namespace {

bool is_cast_input(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }

void check_fp8_dtype(const char* op, DType fp8_dtype, const std::string& what) {
  OCTET_CHECK(fp8_dtype == DType::e4m3 || fp8_dtype == DType::e5m2, op, ": ", what, " must be e4m3 or e5m2, got ",
              dtype_name(fp8_dtype), "; pick DType::e4m3 (activations, weights) or DType::e5m2 (gradients)");
}

// A one-element f32 slot (a scale or an amax) on x's device.
void check_scalar_slot(const char* op, const char* name, const Tensor& slot, const Tensor& x) {
  OCTET_CHECK(slot.dtype() == DType::f32 && slot.numel() == 1, op, ": ", name, " is ", slot.describe(),
              " but must be a one-element f32 tensor (a [1] slot of the layer's FP8 state)");
  OCTET_CHECK(slot.device() == x.device(), op, ": ", name, " is ", slot.describe(), " but x is ", x.describe(),
              "; FP8 state lives on the device of the data it describes, move it with .to(", x.device().str(), ")");
}

void check_cast_input(const char* op, const Tensor& x) {
  OCTET_CHECK(is_cast_input(x.dtype()), op, ": x is ", x.describe(),
              "; the FP8 cast reads f32, bf16 or f16, convert it with .to(DType::f32)");
}

// 2^margin in f32, the divisor of every new scale.
float two_pow_margin(const char* op, double margin) {
  OCTET_CHECK(std::isfinite(margin) && margin >= -126 && margin <= 127, op,
              ": margin must be finite and within [-126, 127] (the scale is divided by 2^margin in f32), got ",
              margin);
  return static_cast<float>(std::exp2(margin));
}

// amax ← max(amax, bits) compared as unsigned bit patterns, as the GPU's atomicMax does.
void merge_amax_bits(const Tensor& amax, uint32_t bits) {
  float* slot = amax.data<float>();
  uint32_t old_bits;
  std::memcpy(&old_bits, slot, sizeof old_bits);
  if (bits > old_bits) std::memcpy(slot, &bits, sizeof bits);
}

// Calls f.template operator()<X>() with X the host storage type of a cast input.
template <class F>
decltype(auto) with_cast_input_type(DType d, F&& f) {
  if (d == DType::bf16) return f.template operator()<bfloat16>();
  if (d == DType::f16) return f.template operator()<float16>();
  return f.template operator()<float>();
}

// [rows, cols] of x with every leading dim a row (a 0-d x is one element).
void rows_and_cols(const Tensor& x, int64_t& rows, int64_t& cols) {
  cols = x.dim() == 0 ? 1 : x.size(-1);
  rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
}

void check_scaling_group(const char* op, const Fp8ScalingTensors& g, size_t i, const Tensor& first) {
  const std::string prefix = "groups[" + std::to_string(i) + "].";
  const Tensor& h = g.amax_history;
  check_defined(op, {&h, &g.scale, &g.scale_inv});
  OCTET_CHECK(h.dtype() == DType::f32 && h.dim() == 2 && h.size(0) >= 1, op, ": ", prefix, "amax_history is ",
              h.describe(), " but must be f32 [L, n] with L >= 1 (one row per remembered step)");
  const Shape column_shape{h.size(1)};
  for (const auto& [t, name] : {std::pair{&g.scale, "scale"}, std::pair{&g.scale_inv, "scale_inv"}}) {
    OCTET_CHECK(t->dtype() == DType::f32 && t->shape() == column_shape, op, ": ", prefix, name, " is ", t->describe(),
                " but must be f32 [n] with n = ", h.size(1), " (the columns of amax_history ", h.describe(), ")");
  }
  check_fp8_dtype(op, g.fp8_dtype, prefix + "fp8_dtype");
  for (const Tensor* t : {&h, &g.scale, &g.scale_inv}) {
    OCTET_CHECK(t->device() == first.device(), op, ": groups[", i, "] has ", t->describe(), " but groups[0] is on ",
                first.device().str(), "; one call updates the FP8 state of one device, call it once per device");
  }
}

// x read as [rows, cols]; padded_rows is rows rounded up to a multiple of pad_rows_to.
struct CastGeometry {
  int64_t rows = 1, cols = 1, padded_rows = 1;
  int64_t fp8_bytes(bool rowwise, bool transposed) const {
    return (rowwise ? rows * cols : 0) + (transposed ? cols * padded_rows : 0);
  }
};

// The checks fp8_cast and fp8_cast_dbias share.
CastGeometry check_cast(const char* op, const Tensor& x, const Tensor& scale, const Tensor& amax, DType fp8_dtype,
                        bool rowwise, bool transposed, int64_t pad_rows_to) {
  check_defined(op, {&x, &scale});
  check_cast_input(op, x);
  check_scalar_slot(op, "scale", scale, x);
  if (amax.defined()) check_scalar_slot(op, "amax", amax, x);
  check_fp8_dtype(op, fp8_dtype, "fp8_dtype");
  OCTET_CHECK(pad_rows_to >= 1, op, ": pad_rows_to must be >= 1 (1 means no padding), got ", pad_rows_to);
  OCTET_CHECK(rowwise || transposed, op, ": neither rowwise nor transposed asked for x ", x.describe(),
              "; ask for at least one copy (fp8_amax_ measures the amax alone)");
  CastGeometry g;
  rows_and_cols(x, g.rows, g.cols);
  g.padded_rows = (g.rows + pad_rows_to - 1) / pad_rows_to * pad_rows_to;
  return g;
}

// The outputs of a CPU cast, allocated; scale_inv holds 1/scale.
void allocate_cpu_cast(Fp8Cast& out, const CastGeometry& g, DType fp8_dtype, bool rowwise, bool transposed,
                       float scale) {
  if (rowwise) out.data = empty({g.rows, g.cols}, fp8_dtype);
  if (transposed) out.transposed = empty({g.cols, g.padded_rows}, fp8_dtype);
  out.scale_inv = full({1}, fp8_scale_inv(scale));
}

uint8_t* bytes_or_null(const Tensor& t) { return t.defined() ? static_cast<uint8_t*>(t.data_ptr()) : nullptr; }

}  // namespace

float fp8_max(DType fp8_dtype) {
  check_fp8_dtype("fp8_max", fp8_dtype, "the dtype");
  return fp8_dtype == DType::e4m3 ? kE4M3Max : kE5M2Max;
}

Fp8Cast fp8_cast(const Tensor& x, const Tensor& scale, const Tensor& amax, DType fp8_dtype, bool rowwise,
                 bool transposed, int64_t pad_rows_to) {
  const char* op = "fp8_cast";
  const CastGeometry g = check_cast(op, x, scale, amax, fp8_dtype, rowwise, transposed, pad_rows_to);
  LedgerOp ledger(op);
  ledger.read({&x, &scale}).write_bytes(g.fp8_bytes(rowwise, transposed) + 4);
  if (amax.defined()) ledger.read(amax).write(amax);
  if (x.is_cuda()) {
    return cuda::fp8_cast(x, g.rows, g.cols, scale, amax, fp8_dtype, rowwise, transposed, g.padded_rows);
  }
  check_cpu(op, {&x, &scale});
  if (amax.defined()) check_cpu(op, {&amax});
  Fp8Cast out;
  const float s = scale.data<float>()[0];
  allocate_cpu_cast(out, g, fp8_dtype, rowwise, transposed, s);
  const uint32_t bits = with_cast_input_type(x.dtype(), [&]<class X>() {
    return cpu::fp8_cast(static_cast<const X*>(x.data_ptr()), g.rows, g.cols, s, fp8_dtype, bytes_or_null(out.data),
                         bytes_or_null(out.transposed), g.padded_rows);
  });
  if (amax.defined()) merge_amax_bits(amax, bits);
  return out;
}

Fp8CastWithBiasGrad fp8_cast_dbias(const Tensor& x, const Tensor& scale, const Tensor& amax, DType fp8_dtype,
                                   bool rowwise, bool transposed, DType dbias_dtype, int64_t pad_rows_to) {
  const char* op = "fp8_cast_dbias";
  const CastGeometry g = check_cast(op, x, scale, amax, fp8_dtype, rowwise, transposed, pad_rows_to);
  OCTET_CHECK(is_cast_input(dbias_dtype), op, ": dbias_dtype must be f32, bf16 or f16 (the bias's dtype), got ",
              dtype_name(dbias_dtype), " for x ", x.describe(), "; pass bias.dtype()");
  LedgerOp ledger(op);
  ledger.read({&x, &scale})
      .write_bytes(g.fp8_bytes(rowwise, transposed) + 4 + g.cols * static_cast<int64_t>(dtype_size(dbias_dtype)));
  if (amax.defined()) ledger.read(amax).write(amax);
  if (x.is_cuda()) {
    return cuda::fp8_cast_dbias(x, g.rows, g.cols, scale, amax, fp8_dtype, rowwise, transposed, g.padded_rows,
                                dbias_dtype);
  }
  check_cpu(op, {&x, &scale});
  if (amax.defined()) check_cpu(op, {&amax});
  Fp8CastWithBiasGrad out;
  if (g.cols == 1) {
    // kernels::sum reduces a single column as one contiguous row, in another pairwise order than
    // the one the fused sweep follows; this degenerate shape (never an FP8 Linear's) runs the two
    // passes back to back instead.
    static_cast<Fp8Cast&>(out) = fp8_cast(x, scale, amax, fp8_dtype, rowwise, transposed, pad_rows_to);
    out.dbias = sum(x.reshape({g.rows, g.cols}), 0).to(dbias_dtype);
    return out;
  }
  const float s = scale.data<float>()[0];
  allocate_cpu_cast(out, g, fp8_dtype, rowwise, transposed, s);
  const Tensor sums = empty({g.cols}, DType::f32);
  const uint32_t bits = with_cast_input_type(x.dtype(), [&]<class X>() {
    return cpu::fp8_cast_column_sums(static_cast<const X*>(x.data_ptr()), g.rows, g.cols, s, fp8_dtype,
                                     bytes_or_null(out.data), bytes_or_null(out.transposed), g.padded_rows,
                                     sums.data<float>());
  });
  if (amax.defined()) merge_amax_bits(amax, bits);
  // kernels::sum rounds its f32 sums to x's dtype; the caller's .to(dbias_dtype) then rounds again.
  out.dbias = sums.to(x.dtype()).to(dbias_dtype);
  return out;
}

namespace {

// layernorm_fp8_forward and add_layernorm_fp8_forward (y defined): checks, ledger, dispatch.
LayerNormFp8 layernorm_fp8(const char* op, const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,
                           double eps, const Tensor& scale, const Tensor& amax, DType fp8_dtype, bool rowwise,
                           bool transposed, int64_t pad_rows_to) {
  const CastGeometry g = check_cast(op, x, scale, amax, fp8_dtype, rowwise, transposed, pad_rows_to);
  OCTET_CHECK(x.dim() >= 1 && g.cols >= 1, op, ": x must be [..., C] with C >= 1, got ", x.describe());
  for (const Tensor* t : {&weight, &bias}) {
    if (!t->defined()) continue;
    OCTET_CHECK(t->shape() == Shape{g.cols} && t->device() == x.device(), op, ": weight and bias must be [", g.cols,
                "] on x's device (", describe_all({&x, &weight, &bias}), ")");
  }
  OCTET_CHECK(weight.defined() || !bias.defined(), op, ": bias ", bias.describe(),
              " given without weight; pass both, weight alone, or neither");
  if (weight.defined()) {
    check_floating(op, weight);
    check_layernorm_weight_dtype(op, x, weight);
    OCTET_CHECK(!bias.defined() || bias.dtype() == weight.dtype(), op, ": bias must be ",
                dtype_name(weight.dtype()), " like weight (", describe_all({&weight, &bias}), ")");
  }
  OCTET_CHECK(std::isfinite(eps) && eps >= 0.0, op, ": eps must be finite and >= 0, got ", eps);
  if (y.defined()) {
    OCTET_CHECK(y.shape() == x.shape() && y.dtype() == x.dtype() && y.device() == x.device(), op,
                ": x and y must have one shape, dtype and device; the add is not broadcast (", describe_all({&x, &y}),
                ")");
  }
  LedgerOp ledger(op);
  ledger.read({&x, &weight, &bias, &scale}).write_bytes(g.fp8_bytes(rowwise, transposed) + 4 + 2 * g.rows * 4);
  if (y.defined()) ledger.read(y).write(x);  // h
  if (amax.defined()) ledger.read(amax).write(amax);
  if (x.is_cuda()) {
    return cuda::layernorm_fp8_forward(x, y, weight, bias, eps, scale, amax, fp8_dtype, rowwise, transposed,
                                       g.padded_rows);
  }
  // The CPU emulates: the LayerNorm (and the add) as layernorm_forward (add_layernorm_forward) runs
  // it, then the cast of its output, rounded to x's dtype, as fp8_cast runs it. Counted above as the
  // one op it stands for.
  LayerNormFp8 out;
  Tensor normed;
  if (y.defined()) {
    AddLayerNormOutput r = add_layernorm_forward(x, y, weight, bias, eps);
    out.h = r.h;
    normed = r.y;
    out.mean = r.mean;
    out.rstd = r.rstd;
  } else {
    LayerNormOutput r = layernorm_forward(x, weight, bias, eps);
    normed = r.y;
    out.mean = r.mean;
    out.rstd = r.rstd;
  }
  out.cast = fp8_cast(normed, scale, amax, fp8_dtype, rowwise, transposed, pad_rows_to);
  return out;
}

}  // namespace

LayerNormFp8 layernorm_fp8_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                                   const Tensor& scale, const Tensor& amax, DType fp8_dtype, bool rowwise,
                                   bool transposed, int64_t pad_rows_to) {
  return layernorm_fp8("layernorm_fp8_forward", x, Tensor(), weight, bias, eps, scale, amax, fp8_dtype, rowwise,
                       transposed, pad_rows_to);
}

LayerNormFp8 add_layernorm_fp8_forward(const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,
                                       double eps, const Tensor& scale, const Tensor& amax, DType fp8_dtype,
                                       bool rowwise, bool transposed, int64_t pad_rows_to) {
  OCTET_CHECK(y.defined(), "add_layernorm_fp8_forward: y (the residual branch) is undefined; pass it, or call "
                           "layernorm_fp8_forward");
  return layernorm_fp8("add_layernorm_fp8_forward", x, y, weight, bias, eps, scale, amax, fp8_dtype, rowwise,
                       transposed, pad_rows_to);
}

Fp8Cast gelu_fp8_forward(const Tensor& x, GeluApproximation approximation, const Tensor& scale, const Tensor& amax,
                         DType fp8_dtype, bool rowwise, bool transposed, int64_t pad_rows_to) {
  const char* op = "gelu_fp8_forward";
  const CastGeometry g = check_cast(op, x, scale, amax, fp8_dtype, rowwise, transposed, pad_rows_to);
  LedgerOp ledger(op);
  ledger.read({&x, &scale}).write_bytes(g.fp8_bytes(rowwise, transposed) + 4);
  if (amax.defined()) ledger.read(amax).write(amax);
  if (x.is_cuda()) {
    return cuda::gelu_fp8_forward(x, g.rows, g.cols, approximation, scale, amax, fp8_dtype, rowwise, transposed,
                                  g.padded_rows);
  }
  // The CPU emulates: gelu_forward, then the cast of its output as fp8_cast runs it (counted above as
  // the one op it stands for).
  return fp8_cast(gelu_forward(x, approximation), scale, amax, fp8_dtype, rowwise, transposed, pad_rows_to);
}

Fp8CastWithBiasGrad dgelu_fp8_cast_dbias(const Tensor& dact, const Tensor& x, GeluApproximation approximation,
                                         const Tensor& scale, const Tensor& amax, DType fp8_dtype, bool rowwise,
                                         bool transposed, std::optional<DType> dbias_dtype, int64_t pad_rows_to) {
  const char* op = "dgelu_fp8_cast_dbias";
  const CastGeometry g = check_cast(op, x, scale, amax, fp8_dtype, rowwise, transposed, pad_rows_to);
  check_defined(op, {&dact});
  OCTET_CHECK(dact.shape() == x.shape() && dact.dtype() == x.dtype() && dact.device() == x.device(), op,
              ": dact (the GELU output's gradient) must have x's shape, dtype and device (", describe_all({&dact, &x}),
              ")");
  OCTET_CHECK(!dbias_dtype || is_cast_input(*dbias_dtype), op,
              ": dbias_dtype must be f32, bf16 or f16 (the bias's dtype), got ", dtype_name(*dbias_dtype));
  LedgerOp ledger(op);
  ledger.read({&dact, &x, &scale})
      .write_bytes(g.fp8_bytes(rowwise, transposed) + 4 +
                   (dbias_dtype ? g.cols * static_cast<int64_t>(dtype_size(*dbias_dtype)) : 0));
  if (amax.defined()) ledger.read(amax).write(amax);
  if (x.is_cuda()) {
    return cuda::dgelu_fp8_cast_dbias(dact, x, g.rows, g.cols, approximation, scale, amax, fp8_dtype, rowwise,
                                      transposed, dbias_dtype, g.padded_rows);
  }
  // The CPU emulates: gelu_backward, then fp8_cast_dbias (or fp8_cast) of its result (counted above
  // as the one op it stands for).
  const Tensor dy = gelu_backward(dact, x, approximation);
  if (dbias_dtype) return fp8_cast_dbias(dy, scale, amax, fp8_dtype, rowwise, transposed, *dbias_dtype, pad_rows_to);
  Fp8CastWithBiasGrad out;
  static_cast<Fp8Cast&>(out) = fp8_cast(dy, scale, amax, fp8_dtype, rowwise, transposed, pad_rows_to);
  return out;
}

void fp8_amax_(const Tensor& x, const Tensor& amax) {
  const char* op = "fp8_amax_";
  check_defined(op, {&x, &amax});
  check_cast_input(op, x);
  check_scalar_slot(op, "amax", amax, x);
  LedgerOp ledger(op);
  ledger.read({&x, &amax}).write(amax);
  amax.bump_version();
  if (x.is_cuda()) return cuda::fp8_amax_(x, amax);
  check_cpu(op, {&x, &amax});
  const uint32_t bits = with_cast_input_type(x.dtype(), [&]<class X>() {
    return cpu::fp8_amax_bits(static_cast<const X*>(x.data_ptr()), x.numel());
  });
  merge_amax_bits(amax, bits);
}

void fp8_update_scales_(const std::vector<Fp8ScalingTensors>& groups, double margin, AmaxCompute algo) {
  const char* op = "fp8_update_scales_";
  const float divisor = two_pow_margin(op, margin);
  if (groups.empty()) return;
  for (size_t i = 0; i < groups.size(); ++i) check_scaling_group(op, groups[i], i, groups[0].amax_history);
  LedgerOp ledger(op);
  for (const Fp8ScalingTensors& g : groups) {
    ledger.read({&g.amax_history, &g.scale}).write(g.amax_history).write(g.scale).write(g.scale_inv);
  }
  for (const Fp8ScalingTensors& g : groups) {
    for (const Tensor* t : {&g.amax_history, &g.scale, &g.scale_inv}) t->bump_version();
  }
  if (groups[0].amax_history.is_cuda()) return cuda::fp8_update_scales_(groups, divisor, algo);
  for (const Fp8ScalingTensors& g : groups) {
    check_cpu(op, {&g.amax_history, &g.scale, &g.scale_inv});
    cpu::fp8_update_scales(g.amax_history.data<float>(), g.scale.data<float>(), g.scale_inv.data<float>(),
                           g.amax_history.size(0), g.amax_history.size(1), fp8_max(g.fp8_dtype), divisor,
                           algo == AmaxCompute::MostRecent);
  }
}

void fp8_scale_from_amax_(const Tensor& amax, const Tensor& scale, const Tensor& scale_inv, DType fp8_dtype,
                          double margin) {
  const char* op = "fp8_scale_from_amax_";
  const float divisor = two_pow_margin(op, margin);
  check_defined(op, {&amax, &scale, &scale_inv});
  check_fp8_dtype(op, fp8_dtype, "fp8_dtype");
  for (const Tensor* t : {&amax, &scale, &scale_inv}) {
    OCTET_CHECK(t->dtype() == DType::f32 && t->dim() == 1 && t->shape() == amax.shape(), op,
                ": amax, scale and scale_inv must be f32 [n] of one shape (", describe_all({&amax, &scale, &scale_inv}),
                "); allocate the scales with amax's shape");
  }
  check_same_device(op, {&amax, &scale, &scale_inv});
  LedgerOp ledger(op);
  ledger.read({&amax, &scale}).write(scale).write(scale_inv);
  scale.bump_version();
  scale_inv.bump_version();
  if (amax.is_cuda()) return cuda::fp8_scale_from_amax_(amax, scale, scale_inv, fp8_dtype, divisor);
  check_cpu(op, {&amax, &scale, &scale_inv});
  cpu::fp8_scale_from_amax(amax.data<float>(), scale.data<float>(), scale_inv.data<float>(), amax.numel(),
                           fp8_max(fp8_dtype), divisor);
}

}  // namespace octet::kernels
