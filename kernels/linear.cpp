#include "kernels/linear.h"

#include "kernels/common.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/nn_ops.h"
#include "kernels/reduce.h"
#if OCTET_HAS_CUDA
#include "kernels/cuda/gemm_cuda.h"
#endif

namespace octet::kernels {

namespace {

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

#if OCTET_HAS_CUDA
// A single row-major GEMM: C[m, n] = op(A)[m, k]·op(B)[k, n].
cuda::GemmProblem single(int64_t m, int64_t n, int64_t k) { return {m, n, k, 1, m * k, k * n, m * n}; }
#endif

void check_linear_shapes(const char* op, const Tensor& x, const Tensor& weight) {
  OCTET_CHECK(x.dim() >= 1 && weight.dim() == 2 && x.size(-1) == weight.size(1), op,
              ": x must be [..., in] and weight [out, in] (", describe_all({&x, &weight}), ")");
  check_floating(op, x);
  check_floating(op, weight);
}

}  // namespace

LinearForward linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, LinearActivation act) {
  constexpr const char* op = "linear_forward";
  check_same_device(op, {&x, &weight});
  check_linear_shapes(op, x, weight);
  if (bias.defined()) {
    check_same_device(op, {&x, &bias});
    OCTET_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), op, ": bias must be [out] = [", weight.size(0),
                "] (", describe_all({&x, &weight, &bias}), ")");
  }
  const int64_t out = weight.size(0), in = weight.size(1);
  const Tensor x2 = rows_of(x);
  const int64_t rows = x2.size(0);
  const Tensor w = as_operand(weight, x);
  Shape y_shape = x.shape();
  y_shape.back() = out;
  const DType y_dtype = writable(x.dtype());
  const bool gelu = act == LinearActivation::GeluTanh;

#if OCTET_HAS_CUDA
  if (x.is_cuda() && (bias.defined() || gelu) && gemm_writes(x.dtype(), y_dtype, x.device())) {
    Tensor y = empty({rows, out}, y_dtype, x.device());
    cuda::GemmEpilogueArgs epilogue;
    if (bias.defined()) epilogue.bias = bias.to(y_dtype);
    if (gelu) {
      epilogue.kind = bias.defined() ? cuda::GemmEpilogue::GeluAuxBias : cuda::GemmEpilogue::GeluAux;
      epilogue.aux = empty({rows, out}, y_dtype, x.device());
    } else {
      epilogue.kind = cuda::GemmEpilogue::Bias;
    }
    if (cuda::gemm_with_epilogue(x2, false, w, true, y, single(rows, out, in), 1.0, 0.0, epilogue)) {
      return {y.reshape(y_shape), gelu ? epilogue.aux.reshape(y_shape) : Tensor()};
    }
  }
#endif

  // The composition: the output starts as the broadcast bias and the GEMM accumulates onto it, so
  // x·Wᵀ + b is rounded once (as the epilogue does); then the activation.
  Tensor z;
  if (bias.defined()) {
    z = broadcast_to(bias.to(y_dtype), {rows, out});
    gemm_into(x2, false, w, true, z, true);
  } else {
    z = empty({rows, out}, y_dtype, x.device());
    gemm_into(x2, false, w, true, z, false);
  }
  if (!gelu) return {z.reshape(y_shape), Tensor()};
  return {gelu_forward(z, GeluApproximation::Tanh).reshape(y_shape), z.reshape(y_shape)};
}

LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& pre_activation,
                            LinearActivation act, bool need_dx, bool need_dweight, bool need_dbias,
                            const Tensor& dweight_accumulate) {
  constexpr const char* op = "linear_backward";
  check_same_device(op, {&dy, &x, &weight});
  check_linear_shapes(op, x, weight);
  const int64_t out = weight.size(0), in = weight.size(1);
  OCTET_CHECK(dy.dim() >= 1 && dy.size(-1) == out && dy.numel() * in == x.numel() * out, op,
              ": dy must be x's rows by out = ", out, " (", describe_all({&dy, &x, &weight}), ")");
  const bool gelu = act == LinearActivation::GeluTanh;
  if (gelu) {
    OCTET_CHECK(pre_activation.defined(), op, ": the GELU activation needs pre_activation (",
                describe_all({&dy, &x, &weight}), "); pass LinearForward::pre_activation");
    check_same_device(op, {&dy, &pre_activation});
    OCTET_CHECK(pre_activation.shape() == dy.shape(), op, ": pre_activation must have dy's shape (",
                describe_all({&dy, &pre_activation}), "); pass LinearForward::pre_activation");
  }
  if (dweight_accumulate.defined()) {
    check_same_device(op, {&weight, &dweight_accumulate});
    OCTET_CHECK(dweight_accumulate.shape() == weight.shape(), op, ": dweight_accumulate must have weight's shape (",
                describe_all({&weight, &dweight_accumulate}), ")");
  }

  const Tensor dz = gelu ? gelu_backward(dy, pre_activation.to(dy.dtype()), GeluApproximation::Tanh) : dy;
  const Tensor dz2 = rows_of(dz), x2 = rows_of(x);
  const int64_t rows = dz2.size(0);
  LinearGrads grads;

  if (need_dx) {
    Tensor dx = empty({rows, in}, x.dtype(), x.device());
    gemm_into(dz2, false, as_operand(weight, dz), false, dx, false);
    grads.dx = dx.reshape(x.shape());
  }

  const bool accumulate = dweight_accumulate.defined();
  const DType grad_dtype = writable(accumulate ? dweight_accumulate.dtype() : weight.dtype());
  if (need_dweight) {
    Tensor dweight = accumulate ? dweight_accumulate : empty({out, in}, weight.dtype(), weight.device());
    const Tensor xs = as_operand(x2, dz2);
    bool fused_dbias = false;
#if OCTET_HAS_CUDA
    if (need_dbias && dweight.is_cuda() && gemm_writes(dz2.dtype(), dweight)) {
      Tensor dbias = empty({out}, dweight.dtype(), dweight.device());
      const cuda::GemmEpilogueArgs epilogue{cuda::GemmEpilogue::BiasGradFromA, dbias, Tensor()};
      fused_dbias = cuda::gemm_with_epilogue(dz2, true, xs, false, dweight, single(out, in, rows), 1.0,
                                             accumulate ? 1.0 : 0.0, epilogue);
      if (fused_dbias) grads.dbias = dbias;
    }
#endif
    if (!fused_dbias) gemm_into(dz2, true, xs, false, dweight, accumulate);
    grads.dweight = dweight;
  }
  if (need_dbias && !grads.dbias.defined()) grads.dbias = sum(dz2, 0).to(grad_dtype);
  return grads;
}

GeluDgrad linear_dgrad_gelu(const Tensor& dz, const Tensor& weight, const Tensor& x_pre_activation, bool need_dbias) {
  constexpr const char* op = "linear_dgrad_gelu";
  check_same_device(op, {&dz, &weight, &x_pre_activation});
  check_linear_shapes(op, x_pre_activation, weight);
  const int64_t out = weight.size(0), in = weight.size(1);
  OCTET_CHECK(dz.dim() >= 1 && dz.size(-1) == out && dz.numel() * in == x_pre_activation.numel() * out, op,
              ": dz must be x_pre_activation's rows by out = ", out, " (",
              describe_all({&dz, &weight, &x_pre_activation}), ")");
  const Tensor dz2 = rows_of(dz), pre2 = rows_of(x_pre_activation);
  const int64_t rows = dz2.size(0);
  const Tensor w = as_operand(weight, dz);

#if OCTET_HAS_CUDA
  if (dz.is_cuda()) {
    Tensor d_pre = empty({rows, in}, x_pre_activation.dtype(), dz.device());
    if (gemm_writes(dz2.dtype(), d_pre)) {
      cuda::GemmEpilogueArgs epilogue;
      epilogue.kind = need_dbias ? cuda::GemmEpilogue::DGeluBiasGrad : cuda::GemmEpilogue::DGelu;
      if (need_dbias) epilogue.bias = empty({in}, d_pre.dtype(), dz.device());
      epilogue.aux = pre2;
      if (cuda::gemm_with_epilogue(dz2, false, w, false, d_pre, single(rows, in, out), 1.0, 0.0, epilogue)) {
        return {d_pre.reshape(x_pre_activation.shape()), epilogue.bias};
      }
    }
  }
#endif

  Tensor dx = empty({rows, in}, x_pre_activation.dtype(), dz.device());
  gemm_into(dz2, false, w, false, dx, false);
  const Tensor d_pre = gelu_backward(dx, pre2, GeluApproximation::Tanh);
  return {d_pre.reshape(x_pre_activation.shape()), need_dbias ? sum(d_pre, 0) : Tensor()};
}

}  // namespace octet::kernels
