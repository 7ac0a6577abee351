#include "kernels/linear.h"

#include <atomic>

#include "core/op_ledger.h"
#include "kernels/common.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cuda/gemm_cuda.h"
#include "kernels/cuda/reduce_cuda.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/reduce.h"

namespace octet::kernels {

namespace {

std::atomic<LinearBiasGradDesign> bias_grad_design{LinearBiasGradDesign::kColumnSum};

// x as [rows, last]: a view, since tensors are contiguous.
Tensor rows_of(const Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// The dtype a GEMM result stored as `dtype` is computed in: GEMMs cannot write FP8, so f32.
DType writable(DType dtype) { return is_fp8(dtype) ? DType::f32 : dtype; }

// cuBLASLt multiplies operands of one dtype, so on the GPU `t` is converted to `like`'s dtype. The
// CPU GEMM widens both operands exactly and takes them as they are.
Tensor as_operand(const Tensor& t, const Tensor& like) {
  return t.is_cuda() && t.dtype() != like.dtype() ? t.to(like.dtype()) : t;
}

// Whether a GEMM with operands of dtype `operand` writes `out` on `device` directly (kernels/gemm.h).
bool gemm_writes(DType operand, DType out, Device device) {
  if (is_fp8(out)) return false;
  return !device.is_cuda() || out == operand || out == DType::f32;
}
bool gemm_writes(DType operand, const Tensor& out) { return gemm_writes(operand, out.dtype(), out.device()); }

// out = op(a)·op(b), or out += op(a)·op(b), through an f32 temporary when the GEMM cannot write
// out's dtype.
void gemm_into(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& out, bool accumulate) {
  if (gemm_writes(a.dtype(), out)) {
    gemm(a, trans_a, b, trans_b, out, 1.0, accumulate ? 1.0 : 0.0);
    return;
  }
  Tensor product = empty(out.shape(), DType::f32, out.device());
  gemm(a, trans_a, b, trans_b, product, 1.0, 0.0);
  if (accumulate) {
    add_(out, product);
  } else {
    out.copy_(product);
  }
}

// A single row-major GEMM: C[m, n] = op(A)[m, k]·op(B)[k, n].
cuda::GemmProblem single(int64_t m, int64_t n, int64_t k) { return {m, n, k, 1, m * k, k * n, m * n}; }

void check_linear_shapes(const char* op, const Tensor& x, const Tensor& weight) {
  OCTET_CHECK(x.dim() >= 1 && weight.dim() == 2 && x.size(-1) == weight.size(1), op,
              ": x must be [..., in] and weight [out, in] (", describe_all({&x, &weight}), ")");
  check_floating(op, x);
  check_floating(op, weight);
}

void check_linear_forward(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_same_device(op, {&x, &weight});
  check_linear_shapes(op, x, weight);
  if (bias.defined()) {
    check_same_device(op, {&x, &bias});
    OCTET_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), op, ": bias must be [out] = [", weight.size(0),
                "] (", describe_all({&x, &weight, &bias}), ")");
  }
}

// Whether the tanh GELU epilogues may run for activations of `dtype` on `device` (the GEMM may still
// refuse: gemm_with_epilogue then returns false).
bool gelu_epilogue_candidate(DType dtype, Device device, GeluApproximation approximation) {
  return device.is_cuda() && approximation == GeluApproximation::Tanh &&
         (dtype == DType::bf16 || dtype == DType::f16);
}

}  // namespace

Tensor linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual) {
  constexpr const char* op = "linear_forward";
  check_linear_forward(op, x, weight, bias);
  const int64_t out = weight.size(0);
  const Tensor x2 = rows_of(x);
  const int64_t rows = x2.size(0);
  Shape y_shape = x.shape();
  y_shape.back() = out;
  const DType y_dtype = writable(x.dtype());
  if (residual.defined()) {
    check_same_device(op, {&x, &residual});
    OCTET_CHECK(residual.shape() == y_shape && residual.dtype() == y_dtype, op, ": the residual must have y's shape ",
                y_shape, " and dtype ", dtype_name(y_dtype), " (", describe_all({&x, &weight, &residual}), ")");
  }
  LedgerOp ledger(op, OpClass::kMatmul);
  ledger.read({&x, &weight, &bias, &residual})
      .write_bytes(rows * out * static_cast<int64_t>(dtype_size(y_dtype)))
      .flops(2.0 * static_cast<double>(rows) * static_cast<double>(out) * static_cast<double>(weight.size(1)));
  const Tensor w = as_operand(weight, x);

  if (x.is_cuda() && bias.defined() && gemm_writes(x.dtype(), y_dtype, x.device())) {
    Tensor y = empty({rows, out}, y_dtype, x.device());
    // With a residual, cuBLASLt reads it as C (beta = 1) and writes y apart: x·Wᵀ + b + residual rounded
    // once. Bytes: the residual read in the epilogue (ViT-H's fc2 at batch 64, bf16: 32.3 MB) where the
    // add after the GEMM read y and the residual and wrote the sum (96.8 MB, 23 µs at 4.3 TB/s).
    const cuda::GemmEpilogueArgs epilogue{cuda::GemmEpilogue::Bias, bias.to(y_dtype), {},
                                          residual.defined() ? rows_of(residual) : Tensor()};
    if (cuda::gemm_with_epilogue(x2, false, w, true, y, single(rows, out, weight.size(1)), 1.0,
                                 residual.defined() ? 1.0 : 0.0, epilogue)) {
      return y.reshape(y_shape);
    }
  }
  if (residual.defined()) {
    // On the CPU with a bias and a bf16/f16 y, the GPU's one rounding (the CPU emulates the GPU's
    // rounding points, kernels/gemm.h): the residual and the bias widened and summed in f32, the
    // product accumulated onto them in f32, y rounded once. Not the tile kernels' path: they take no
    // addend. (In f32 the sum is rounded to f32 either way, and the composition below keeps it bit
    // for bit the modules' h + fc2(...).)
    if (!x.is_cuda() && bias.defined() && (y_dtype == DType::bf16 || y_dtype == DType::f16)) {
      Tensor c = add(to_compute(rows_of(residual)), broadcast_to(to_compute(bias.to(y_dtype)), {rows, out}));
      gemm(x2, false, w, true, c, 1.0, 1.0);
      return c.to(y_dtype).reshape(y_shape);
    }
    // Elsewhere the residual is added after the product: y rounded, then the sum rounded (and y read
    // back and the sum written: the add's traffic, counted here since the calls inside are not).
    const int64_t y_bytes = rows * out * static_cast<int64_t>(dtype_size(y_dtype));
    ledger.read_bytes(y_bytes).write_bytes(y_bytes);
    return add(linear_forward(x, weight, bias), residual);
  }

  // On the CPU, a product the tile kernels take adds the bias as it stores y, in f32: low-precision
  // operands widened exactly first, the bias rounded to y's dtype as the composition below adds it,
  // and y rounded once at the end, so the same bits as that composition. For bf16 it saves what the
  // composition moves besides: y written as the broadcast bias, widened to f32 and read back by the GEMM.
  if (!x.is_cuda() && bias.defined() && compute_dtype(x.dtype()) == DType::f32 &&
      compute_dtype(w.dtype()) == DType::f32 && compute_dtype(bias.dtype()) == DType::f32 &&
      cpu::linear_forward_takes_tiles(out)) {
    const Tensor x32 = to_compute(x2), w32 = to_compute(w), bias32 = to_compute(bias.to(y_dtype));
    if (y_dtype == DType::bf16) {  // rounded as the tiles store it, where they take K in one pass
      Tensor y = empty({rows, out}, y_dtype, x.device());
      if (cpu::gemm_tiled_to_bf16(false, true, rows, out, weight.size(1), 1.0f, x32.data<float>(), w32.data<float>(),
                                  static_cast<uint16_t*>(y.data_ptr()), bias32.data<float>())) {
        return y.reshape(y_shape);
      }
    }
    Tensor y = empty({rows, out}, DType::f32, x.device());
    if (cpu::linear_forward_tiled(rows, out, weight.size(1), x32.data<float>(), w32.data<float>(),
                                  bias32.data<float>(), y.data<float>())) {
      return y.to(y_dtype).reshape(y_shape);
    }
  }

  // The composition: the output starts as the broadcast bias and the GEMM accumulates onto it, so
  // x·Wᵀ + b is rounded once (as the epilogue does).
  Tensor y;
  if (bias.defined()) {
    y = broadcast_to(bias.to(y_dtype), {rows, out});
    gemm_into(x2, false, w, true, y, true);
  } else {
    y = empty({rows, out}, y_dtype, x.device());
    gemm_into(x2, false, w, true, y, false);
  }
  return y.reshape(y_shape);
}

void set_linear_bias_grad_design(LinearBiasGradDesign design) {
  bias_grad_design.store(design, std::memory_order_relaxed);
}
LinearBiasGradDesign linear_bias_grad_design() { return bias_grad_design.load(std::memory_order_relaxed); }

LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, bool need_dx, bool need_dweight,
                            bool need_dbias) {
  constexpr const char* op = "linear_backward";
  check_same_device(op, {&dy, &x, &weight});
  check_linear_shapes(op, x, weight);
  const int64_t out = weight.size(0), in = weight.size(1);
  OCTET_CHECK(dy.dim() >= 1 && dy.size(-1) == out && dy.numel() * in == x.numel() * out, op,
              ": dy must be x's rows by out = ", out, " (", describe_all({&dy, &x, &weight}), ")");

  const Tensor dy2 = rows_of(dy), x2 = rows_of(x);
  const int64_t rows = dy2.size(0);
  LinearGrads grads;
  LedgerOp ledger(op, OpClass::kMatmul);
  const double gemm_flops = 2.0 * static_cast<double>(rows) * static_cast<double>(out) * static_cast<double>(in);
  ledger.read(dy);
  if (need_dx) ledger.read(weight).write(x).flops(gemm_flops);
  if (need_dweight) ledger.read(x).write(weight).flops(gemm_flops);
  if (need_dbias) ledger.write_bytes(out * static_cast<int64_t>(dtype_size(writable(weight.dtype()))));

  // The CPU computes in f32 from a bf16 or f16 dy, which each GEMM and the bias sum would widen again:
  // widened once here when two or more of them read it (exact, so the same bits; the op ledger counts
  // this call, not its inner ones).
  const DType dy_compute = compute_dtype(dy2.dtype());
  const bool widen_once = !dy2.is_cuda() && dy_compute != dy2.dtype() &&
                          static_cast<int>(need_dx) + static_cast<int>(need_dweight) + static_cast<int>(need_dbias) >= 2;
  const Tensor dyc = widen_once ? dy2.to(dy_compute) : dy2;

  if (need_dx) {
    Tensor dx = empty({rows, in}, x.dtype(), x.device());
    gemm_into(dyc, false, as_operand(weight, dy), false, dx, false);
    grads.dx = dx.reshape(x.shape());
  }

  if (need_dweight) {
    Tensor dweight = empty({out, in}, weight.dtype(), weight.device());
    const Tensor xs = as_operand(x2, dy2);
    bool fused_dbias = false;
    if (need_dbias && dweight.is_cuda() && gemm_writes(dy2.dtype(), dweight) &&
        linear_bias_grad_design() == LinearBiasGradDesign::kEpilogue) {
      Tensor dbias = empty({out}, dweight.dtype(), dweight.device());
      const cuda::GemmEpilogueArgs epilogue{cuda::GemmEpilogue::BiasGradFromA, dbias};
      fused_dbias = cuda::gemm_with_epilogue(dy2, true, xs, false, dweight, single(out, in, rows), 1.0, 0.0, epilogue);
      if (fused_dbias) grads.dbias = dbias;
    }
    if (!fused_dbias) gemm_into(dyc, true, xs, false, dweight, false);
    grads.dweight = dweight;
  }
  if (need_dbias && !grads.dbias.defined()) {
    const DType dbias_dtype = writable(weight.dtype());
    if (dy2.is_cuda()) {
      // The f32 column sums rounded once to the gradient's dtype, as BGRADB writes them (an f32
      // gradient of bf16 dy keeps the f32 sums). Bytes: reads dy, writes dbias (kernels/cuda/reduce.cu:
      // 32.3 MB for ViT-H's 12,608 × 1280 bf16, 7.7 µs at 4.3 TB/s).
      grads.dbias = cuda::sum(dy2, 1, rows, out, 1.f, dbias_dtype, op);
    } else {
      // The CPU sums in f32 and rounds to dy's dtype (what sum() of dy2 returns), then converts.
      grads.dbias = sum(dyc, 0).to(dy2.dtype()).to(dbias_dtype);
    }
  }
  return grads;
}

LinearGeluOutput linear_gelu_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                     GeluApproximation approximation) {
  constexpr const char* op = "linear_gelu_forward";
  check_linear_forward(op, x, weight, bias);
  if (bias.defined() && gelu_epilogue_candidate(x.dtype(), x.device(), approximation)) {
    const int64_t out = weight.size(0), in = weight.size(1);
    const Tensor x2 = rows_of(x);
    const int64_t rows = x2.size(0);
    Tensor pre = empty({rows, out}, x.dtype(), x.device()), act = empty({rows, out}, x.dtype(), x.device());
    const cuda::GemmEpilogueArgs epilogue{cuda::GemmEpilogue::GeluAuxBias, bias.to(x.dtype()), pre};
    // Bytes (ViT-H's fc1 at batch 64, bf16): x 32.3 MB and the weight 13.1 MB read, pre and act
    // 129.1 MB each written; the composition also reads pre back for the GELU (129.1 MB more).
    if (cuda::gemm_with_epilogue(x2, false, as_operand(weight, x), true, act, single(rows, out, in), 1.0, 0.0,
                                 epilogue)) {
      LedgerOp ledger(op, OpClass::kMatmul);
      ledger.read({&x, &weight, &bias}).write(pre).write(act).flops(2.0 * static_cast<double>(rows) *
                                                                    static_cast<double>(out) * static_cast<double>(in));
      Shape shape = x.shape();
      shape.back() = out;
      return {pre.reshape(shape), act.reshape(shape)};
    }
  }
  const Tensor pre = linear_forward(x, weight, bias);
  return {pre, gelu_forward(pre, approximation)};
}

Tensor linear_dgelu_backward(const Tensor& dy, const Tensor& pre, const Tensor& weight,
                             GeluApproximation approximation) {
  constexpr const char* op = "linear_dgelu_backward";
  check_same_device(op, {&dy, &pre, &weight});
  check_linear_shapes(op, pre, weight);
  const int64_t out = weight.size(0), in = weight.size(1);
  OCTET_CHECK(dy.dim() >= 1 && dy.size(-1) == out && dy.numel() * in == pre.numel() * out, op,
              ": dy must be pre's rows by out = ", out, " (", describe_all({&dy, &pre, &weight}), ")");
  // Bytes (ViT-H's fc2 dgrad at batch 64, bf16): the GEMM reads dy 32.3 MB and the weight 13.1 MB
  // and writes dact 129.1 MB; the GELU backward reads dact and pre and writes dpre, 387.3 MB.
  const Tensor dact = linear_backward(dy, pre, weight, true, false, false).dx;
  return gelu_backward(dact, pre, approximation);
}

}  // namespace octet::kernels
