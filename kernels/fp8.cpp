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

}  // namespace

float fp8_max(DType fp8_dtype) {
  check_fp8_dtype("fp8_max", fp8_dtype, "the dtype");
  return fp8_dtype == DType::e4m3 ? kE4M3Max : kE5M2Max;
}

Fp8Cast fp8_cast(const Tensor& x, const Tensor& scale, const Tensor& amax, DType fp8_dtype, bool rowwise,
                 bool transposed, int64_t pad_rows_to) {
  const char* op = "fp8_cast";
  check_defined(op, {&x, &scale});
  check_cast_input(op, x);
  check_scalar_slot(op, "scale", scale, x);
  if (amax.defined()) check_scalar_slot(op, "amax", amax, x);
  check_fp8_dtype(op, fp8_dtype, "fp8_dtype");
  OCTET_CHECK(pad_rows_to >= 1, op, ": pad_rows_to must be >= 1 (1 means no padding), got ", pad_rows_to);
  OCTET_CHECK(rowwise || transposed, op, ": neither rowwise nor transposed asked for x ", x.describe(),
              "; ask for at least one copy (fp8_amax_ measures the amax alone)");
  int64_t rows, cols;
  rows_and_cols(x, rows, cols);
  const int64_t padded_rows = (rows + pad_rows_to - 1) / pad_rows_to * pad_rows_to;
  LedgerOp ledger(op);
  ledger.read({&x, &scale}).write_bytes((rowwise ? rows * cols : 0) + (transposed ? cols * padded_rows : 0) + 4);
  if (amax.defined()) ledger.read(amax).write(amax);
  if (x.is_cuda()) return cuda::fp8_cast(x, rows, cols, scale, amax, fp8_dtype, rowwise, transposed, padded_rows);
  check_cpu(op, {&x, &scale});
  if (amax.defined()) check_cpu(op, {&amax});
  Fp8Cast out;
  if (rowwise) out.data = empty({rows, cols}, fp8_dtype);
  if (transposed) out.transposed = empty({cols, padded_rows}, fp8_dtype);
  const float s = scale.data<float>()[0];
  out.scale_inv = full({1}, fp8_scale_inv(s));
  auto* data = rowwise ? static_cast<uint8_t*>(out.data.data_ptr()) : nullptr;
  auto* transposed_data = transposed ? static_cast<uint8_t*>(out.transposed.data_ptr()) : nullptr;
  const uint32_t bits = with_cast_input_type(x.dtype(), [&]<class X>() {
    return cpu::fp8_cast(static_cast<const X*>(x.data_ptr()), rows, cols, s, fp8_dtype, data, transposed_data,
                         padded_rows);
  });
  if (amax.defined()) merge_amax_bits(amax, bits);
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
