// Entry points for LayerNorm, GELU, cross-entropy and dropout: argument checks, then dispatch on
// device to kernels/cuda/ or to the CPU implementations in kernels/cpu/. The CPU kernels compute in
// T = float or double (kernels/common.h): inputs are widened once on the way in, outputs rounded
// once on the way out. The CUDA kernels read and write the tensors' own dtypes and compute in f32.
#include "kernels/nn_ops.h"

#include <cmath>

#include "core/op_ledger.h"
#include "kernels/common.h"
#include "kernels/cpu/nn_ops_cpu.h"
#include "kernels/cuda/nn_ops_cuda.h"
#include "kernels/reduce.h"

namespace octet::kernels {
namespace {

// x's shape without its last dim: the shape of LayerNorm's mean and rstd.
Shape row_shape(const Tensor& x) { return Shape(x.shape().begin(), x.shape().end() - 1); }

template <class T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// x is floating with a non-empty last dim C; weight and bias, where given, are [C] of one dtype, f32
// or x's. Bias alone is refused: backward, which only sees weight, could not tell.
int64_t check_layernorm_args(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_defined(op, {&x});
  check_floating(op, x);
  OCTET_CHECK(x.dim() >= 1, op, ": x must have at least one dim (LayerNorm normalizes the last), got ", x.describe());
  const int64_t C = x.size(-1);
  OCTET_CHECK(C > 0, op, ": x has an empty last dim, nothing to normalize: ", x.describe());
  OCTET_CHECK(weight.defined() || !bias.defined(), op, ": bias ", bias.describe(),
              " given without weight; pass both, weight alone, or neither");
  if (weight.defined()) {
    check_floating(op, weight);
    OCTET_CHECK(weight.shape() == Shape{C}, op, ": weight must be [", C, "] to match the last dim of x (",
                describe_all({&x, &weight}), ")");
    check_layernorm_weight_dtype(op, x, weight);
    check_same_device(op, {&x, &weight});
  }
  if (bias.defined()) {
    OCTET_CHECK(bias.shape() == Shape{C} && bias.dtype() == weight.dtype(), op, ": bias must be ",
                dtype_name(weight.dtype()), "[", C, "] like weight (", describe_all({&x, &weight, &bias}), ")");
    check_same_device(op, {&x, &bias});
  }
  return C;
}

// logits [N, C] floating, targets [N] i64 or i32, label_smoothing in [0, 1], one device.
void check_cross_entropy_args(const char* op, const Tensor& logits, const Tensor& targets, double label_smoothing) {
  check_defined(op, {&logits, &targets});
  check_floating(op, logits);
  check_dim(op, logits, 2);
  check_dim(op, targets, 1);
  OCTET_CHECK(targets.dtype() == DType::i64 || targets.dtype() == DType::i32, op,
              ": targets must be i64 or i32 class indices (", describe_all({&logits, &targets}), ")");
  const int64_t N = logits.size(0), C = logits.size(1);
  OCTET_CHECK(targets.size(0) == N, op, ": logits have ", N, " rows but there are ", targets.size(0), " targets (",
              describe_all({&logits, &targets}), ")");
  OCTET_CHECK(C > 0, op, ": logits have no classes (", describe_all({&logits, &targets}), ")");
  OCTET_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op, ": label_smoothing must be in [0, 1], got ",
              label_smoothing);
  check_same_device(op, {&logits, &targets});
}

// CPU only: the targets as i64, each checked to be a class index in [0, C) or ignore_index; also
// counts the rows that are not ignored. Checked here, before any parallel loop, so the error can
// name the row. (The GPU kernels cannot read the values without waiting; see nn_ops_cuda.h.)
Tensor checked_targets_cpu(const char* op, const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                           int64_t* counted) {
  check_cpu(op, {&logits, &targets});
  const int64_t N = logits.size(0), C = logits.size(1);
  Tensor t64 = targets.detach().to(DType::i64);
  const int64_t* t = t64.data<int64_t>();
  *counted = 0;
  for (int64_t r = 0; r < N; ++r) {
    if (t[r] == ignore_index) continue;
    OCTET_CHECK(t[r] >= 0 && t[r] < C, op, ": target ", t[r], " in row ", r, " is not a class index in [0, C) for C = ",
                C, " (", describe_all({&logits, &targets}), "); use ignore_index (", ignore_index,
                ") to skip a row");
    ++*counted;
  }
  return t64;
}

void check_dropout_p(const char* op, const Tensor& x, double p) {
  check_defined(op, {&x});
  check_floating(op, x);
  // Written so that NaN fails too. p = 1 would drop everything and divide by zero.
  OCTET_CHECK(p >= 0.0 && p < 1.0, op, ": p must be in [0, 1), got ", p, " (", x.describe(), ")");
}

}  // namespace

// ---- LayerNorm ----------------------------------------------------------------------------------------

LayerNormOutput layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  constexpr const char* op = "layernorm_forward";
  LedgerOp ledger(op);
  const int64_t C = check_layernorm_args(op, x, weight, bias);
  const int64_t stat_bytes = 2 * (C > 0 ? x.numel() / C : 0) * static_cast<int64_t>(dtype_size(compute_dtype(x.dtype())));
  ledger.read({&x, &weight, &bias}).write(x).write_bytes(stat_bytes);
  OCTET_CHECK(std::isfinite(eps) && eps >= 0.0, op, ": eps must be finite and >= 0, got ", eps);
  if (x.is_cuda()) return cuda::layernorm_forward(x, weight, bias, eps);
  check_cpu(op, {&x});
  const int64_t rows = x.numel() / C;
  if (x.dtype() == DType::bf16) {  // a row at a time in f32, no f32 copy of x or y (kernels/cpu/nn_ops_cpu.h)
    const Tensor wc = weight.defined() ? weight.detach().to(DType::f32) : Tensor();
    const Tensor bc = bias.defined() ? bias.detach().to(DType::f32) : Tensor();
    Tensor y = empty(x.shape(), DType::bf16), mean = empty(row_shape(x)), rstd = empty(row_shape(x));
    cpu::layernorm_forward_bf16(static_cast<const bfloat16*>(x.data_ptr()), data_or_null<float>(wc),
                                data_or_null<float>(bc), static_cast<bfloat16*>(y.data_ptr()), mean.data<float>(),
                                rstd.data<float>(), rows, C, static_cast<float>(eps));
    return {y, mean, rstd};
  }

  return with_compute_type(x.dtype(), [&]<class T>() -> LayerNormOutput {
    const DType cd = dtype_of<T>();
    const Tensor xc = to_compute(x);
    const Tensor wc = weight.defined() ? weight.detach().to(cd) : Tensor();
    const Tensor bc = bias.defined() ? bias.detach().to(cd) : Tensor();
    Tensor y = empty(x.shape(), cd), mean = empty(row_shape(x), cd), rstd = empty(row_shape(x), cd);
    cpu::layernorm_forward<T>(xc.data<T>(), data_or_null<T>(wc), data_or_null<T>(bc), y.data<T>(), mean.data<T>(),
                              rstd.data<T>(), rows, C, static_cast<T>(eps));
    return {y.to(x.dtype()), mean, rstd};
  });
}

namespace {

// The CPU backward of bf16 tensors a row at a time in f32 (kernels/cpu/nn_ops_cpu.h): the bits of the
// widened tensors through the f32 kernel, rounded once, without their f32 copies.
LayerNormGrads layernorm_backward_bf16(const Tensor& dy, const Tensor& dresidual, const Tensor& x, const Tensor& weight,
                                       const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t C) {
  const Tensor wc = weight.defined() ? weight.detach().to(DType::f32) : Tensor();
  Tensor dx = empty(x.shape(), DType::bf16), dweight, dbias;
  if (weight.defined()) {
    dweight = empty({C});
    dbias = empty({C});
  }
  cpu::add_layernorm_backward_bf16(static_cast<const bfloat16*>(dy.data_ptr()),
                                   dresidual.defined() ? static_cast<const bfloat16*>(dresidual.data_ptr()) : nullptr,
                                   static_cast<const bfloat16*>(x.data_ptr()), data_or_null<float>(wc),
                                   mean.data<float>(), rstd.data<float>(), static_cast<bfloat16*>(dx.data_ptr()),
                                   data_or_null<float>(dweight), data_or_null<float>(dbias), rows, C);
  if (!weight.defined()) return {dx, Tensor(), Tensor()};
  return {dx, dweight.to(weight.dtype()), dbias.to(weight.dtype())};
}

}  // namespace

LayerNormGrads layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                  const Tensor& rstd) {
  constexpr const char* op = "layernorm_backward";
  LedgerOp ledger(op);
  ledger.read({&dy, &x, &weight, &mean, &rstd}).write(x);
  if (weight.defined()) ledger.write(weight).write(weight);  // dweight, dbias
  const int64_t C = check_layernorm_args(op, x, weight, Tensor());
  check_defined(op, {&dy, &x, &mean, &rstd});
  check_same_dtype(op, {&dy, &x});
  OCTET_CHECK(dy.shape() == x.shape(), op, ": dy and x differ in shape (", describe_all({&dy, &x}), ")");
  const DType cd = compute_dtype(x.dtype());
  for (const Tensor* stat : {&mean, &rstd}) {
    OCTET_CHECK(stat->shape() == row_shape(x) && stat->dtype() == cd, op, ": mean and rstd must be ", dtype_name(cd),
                row_shape(x), " as layernorm_forward returns them for x ", x.describe(), " (",
                describe_all({&mean, &rstd}), ")");
  }
  check_same_device(op, {&x, &dy, &mean, &rstd});
  if (x.is_cuda()) return cuda::layernorm_backward(dy, x, weight, mean, rstd);
  check_cpu(op, {&dy, &x, &mean, &rstd});
  const int64_t rows = x.numel() / C;
  if (x.dtype() == DType::bf16) return layernorm_backward_bf16(dy, Tensor(), x, weight, mean, rstd, rows, C);

  return with_compute_type(x.dtype(), [&]<class T>() -> LayerNormGrads {
    const Tensor dyc = to_compute(dy), xc = to_compute(x);
    const Tensor wc = weight.defined() ? weight.detach().to(cd) : Tensor();
    Tensor dx = empty(x.shape(), cd), dweight, dbias;
    if (weight.defined()) {
      dweight = empty({C}, cd);
      dbias = empty({C}, cd);
    }
    cpu::layernorm_backward<T>(dyc.data<T>(), xc.data<T>(), data_or_null<T>(wc), mean.data<T>(), rstd.data<T>(),
                               dx.data<T>(), data_or_null<T>(dweight), data_or_null<T>(dbias), rows, C);
    if (!weight.defined()) return {dx.to(x.dtype()), Tensor(), Tensor()};
    return {dx.to(x.dtype()), dweight.to(weight.dtype()), dbias.to(weight.dtype())};
  });
}

// ---- residual add fused into LayerNorm ----------------------------------------------------------------

AddLayerNormOutput add_layernorm_forward(const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,
                                         double eps) {
  constexpr const char* op = "add_layernorm_forward";
  LedgerOp ledger(op);
  const int64_t C = check_layernorm_args(op, x, weight, bias);
  const int64_t stat_bytes = 2 * (C > 0 ? x.numel() / C : 0) * static_cast<int64_t>(dtype_size(compute_dtype(x.dtype())));
  ledger.read({&x, &y, &weight, &bias}).write(x).write(x).write_bytes(stat_bytes);  // h, the output, mean, rstd
  check_defined(op, {&y});
  // The add is elementwise over the rows it normalizes: no broadcasting, no promotion.
  OCTET_CHECK(y.shape() == x.shape(), op, ": x and y must have one shape, the add is not broadcast (",
              describe_all({&x, &y}), "); broadcast y first with broadcast_to, or call add and layernorm_forward");
  OCTET_CHECK(y.dtype() == x.dtype(), op, ": x and y must have one dtype (", describe_all({&x, &y}),
              "); Octet does not promote, convert one with .to(dtype)");
  check_same_device(op, {&x, &y});
  OCTET_CHECK(std::isfinite(eps) && eps >= 0.0, op, ": eps must be finite and >= 0, got ", eps);
  if (x.is_cuda()) return cuda::add_layernorm_forward(x, y, weight, bias, eps);
  check_cpu(op, {&x, &y});
  const int64_t rows = x.numel() / C;
  if (x.dtype() == DType::bf16) {  // a row at a time in f32, as layernorm_forward
    const Tensor wc = weight.defined() ? weight.detach().to(DType::f32) : Tensor();
    const Tensor bc = bias.defined() ? bias.detach().to(DType::f32) : Tensor();
    Tensor h = empty(x.shape(), DType::bf16), out = empty(x.shape(), DType::bf16);
    Tensor mean = empty(row_shape(x)), rstd = empty(row_shape(x));
    cpu::add_layernorm_forward_bf16(static_cast<const bfloat16*>(x.data_ptr()),
                                    static_cast<const bfloat16*>(y.data_ptr()), data_or_null<float>(wc),
                                    data_or_null<float>(bc), static_cast<bfloat16*>(h.data_ptr()),
                                    static_cast<bfloat16*>(out.data_ptr()), mean.data<float>(), rstd.data<float>(),
                                    rows, C, static_cast<float>(eps));
    return {h, out, mean, rstd};
  }

  return with_compute_type(x.dtype(), [&]<class T>() -> AddLayerNormOutput {
    const DType cd = dtype_of<T>();
    const Tensor xc = to_compute(x), yc = to_compute(y);
    const Tensor wc = weight.defined() ? weight.detach().to(cd) : Tensor();
    const Tensor bc = bias.defined() ? bias.detach().to(cd) : Tensor();
    Tensor h = empty(x.shape(), cd), out = empty(x.shape(), cd);
    Tensor mean = empty(row_shape(x), cd), rstd = empty(row_shape(x), cd);
    cpu::add_layernorm_forward<T>(xc.data<T>(), yc.data<T>(), data_or_null<T>(wc), data_or_null<T>(bc), h.data<T>(),
                                  out.data<T>(), mean.data<T>(), rstd.data<T>(), rows, C, static_cast<T>(eps),
                                  x.dtype());
    // h already holds values of x's dtype (the kernel rounded it), so this conversion is exact.
    return {h.to(x.dtype()), out.to(x.dtype()), mean, rstd};
  });
}

AddLayerNormGrads add_layernorm_backward(const Tensor& dy_ln, const Tensor& dh_residual, const Tensor& h,
                                         const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  constexpr const char* op = "add_layernorm_backward";
  LedgerOp ledger(op);
  ledger.read({&dy_ln, &dh_residual, &h, &weight, &mean, &rstd}).write(h);
  if (weight.defined()) ledger.write(weight).write(weight);  // dweight, dbias
  const int64_t C = check_layernorm_args(op, h, weight, Tensor());
  check_defined(op, {&dy_ln, &h, &mean, &rstd});
  OCTET_CHECK(dy_ln.shape() == h.shape() && dy_ln.dtype() == h.dtype(), op,
              ": dy_ln, the gradient of the LayerNorm output, must have h's shape and dtype (",
              describe_all({&dy_ln, &h}), ")");
  if (dh_residual.defined()) {
    OCTET_CHECK(dh_residual.shape() == h.shape() && dh_residual.dtype() == h.dtype(), op,
                ": dh_residual, the gradient h received from its other consumer, must have h's shape and dtype (",
                describe_all({&dh_residual, &h}), "); pass an undefined Tensor when there is none");
  }
  const DType cd = compute_dtype(h.dtype());
  for (const Tensor* stat : {&mean, &rstd}) {
    OCTET_CHECK(stat->shape() == row_shape(h) && stat->dtype() == cd, op, ": mean and rstd must be ", dtype_name(cd),
                row_shape(h), " as add_layernorm_forward returns them for h ", h.describe(), " (",
                describe_all({&mean, &rstd}), ")");
  }
  check_same_device(op, {&h, &dy_ln, &mean, &rstd});
  if (dh_residual.defined()) check_same_device(op, {&h, &dh_residual});
  if (h.is_cuda()) return cuda::add_layernorm_backward(dy_ln, dh_residual, h, weight, mean, rstd);
  check_cpu(op, {&dy_ln, &h, &mean, &rstd});
  const int64_t rows = h.numel() / C;
  if (h.dtype() == DType::bf16) {
    const LayerNormGrads g = layernorm_backward_bf16(dy_ln, dh_residual, h, weight, mean, rstd, rows, C);
    return {g.dx, g.dweight, g.dbias};
  }

  return with_compute_type(h.dtype(), [&]<class T>() -> AddLayerNormGrads {
    const Tensor dyc = to_compute(dy_ln), hc = to_compute(h);
    const Tensor drc = dh_residual.defined() ? to_compute(dh_residual) : Tensor();
    const Tensor wc = weight.defined() ? weight.detach().to(cd) : Tensor();
    Tensor dh = empty(h.shape(), cd), dweight, dbias;
    if (weight.defined()) {
      dweight = empty({C}, cd);
      dbias = empty({C}, cd);
    }
    cpu::add_layernorm_backward<T>(dyc.data<T>(), data_or_null<T>(drc), hc.data<T>(), data_or_null<T>(wc),
                                   mean.data<T>(), rstd.data<T>(), dh.data<T>(), data_or_null<T>(dweight),
                                   data_or_null<T>(dbias), rows, C);
    if (!weight.defined()) return {dh.to(h.dtype()), Tensor(), Tensor()};
    return {dh.to(h.dtype()), dweight.to(weight.dtype()), dbias.to(weight.dtype())};
  });
}

// ---- GELU ---------------------------------------------------------------------------------------------

Tensor gelu_forward(const Tensor& x, GeluApproximation approximation) {
  constexpr const char* op = "gelu_forward";
  LedgerOp ledger(op);
  ledger.read(x).write(x);
  check_defined(op, {&x});
  check_floating(op, x);
  if (x.is_cuda()) return cuda::gelu_forward(x, approximation);
  check_cpu(op, {&x});
  if (x.dtype() == DType::bf16) {
    Tensor y = empty(x.shape(), DType::bf16);
    cpu::gelu_forward_bf16(static_cast<const bfloat16*>(x.data_ptr()), static_cast<bfloat16*>(y.data_ptr()), x.numel(),
                           approximation);
    return y;
  }
  return with_compute_type(x.dtype(), [&]<class T>() -> Tensor {
    const Tensor xc = to_compute(x);
    Tensor y = empty(x.shape(), dtype_of<T>());
    cpu::gelu_forward<T>(xc.data<T>(), y.data<T>(), x.numel(), approximation);
    return y.to(x.dtype());
  });
}

Tensor gelu_backward(const Tensor& dy, const Tensor& x, GeluApproximation approximation) {
  constexpr const char* op = "gelu_backward";
  LedgerOp ledger(op);
  ledger.read({&dy, &x}).write(x);
  check_defined(op, {&dy, &x});
  check_floating(op, x);
  check_same_dtype(op, {&dy, &x});
  OCTET_CHECK(dy.shape() == x.shape(), op, ": dy and x differ in shape (", describe_all({&dy, &x}), ")");
  check_same_device(op, {&dy, &x});
  if (x.is_cuda()) return cuda::gelu_backward(dy, x, approximation);
  check_cpu(op, {&dy, &x});
  if (x.dtype() == DType::bf16) {
    Tensor dx = empty(x.shape(), DType::bf16);
    cpu::gelu_backward_bf16(static_cast<const bfloat16*>(dy.data_ptr()), static_cast<const bfloat16*>(x.data_ptr()),
                            static_cast<bfloat16*>(dx.data_ptr()), x.numel(), approximation);
    return dx;
  }
  return with_compute_type(x.dtype(), [&]<class T>() -> Tensor {
    const Tensor dyc = to_compute(dy), xc = to_compute(x);
    Tensor dx = empty(x.shape(), dtype_of<T>());
    cpu::gelu_backward<T>(dyc.data<T>(), xc.data<T>(), dx.data<T>(), x.numel(), approximation);
    return dx.to(x.dtype());
  });
}

GeluGradAndOutput gelu_backward_and_forward(const Tensor& dy, const Tensor& x, GeluApproximation approximation,
                                            bool may_overwrite_dy, std::optional<DType> dbias_dtype) {
  constexpr const char* op = "gelu_backward_and_forward";
  check_defined(op, {&dy, &x});
  check_floating(op, x);
  check_same_dtype(op, {&dy, &x});
  OCTET_CHECK(dy.shape() == x.shape(), op, ": dy and x differ in shape (", describe_all({&dy, &x}), ")");
  check_same_device(op, {&dy, &x});
  if (dbias_dtype) {
    OCTET_CHECK(is_floating(*dbias_dtype) && !is_fp8(*dbias_dtype), op, ": the bias gradient's dtype must be a "
                "floating dtype other than FP8, got ", dtype_name(*dbias_dtype), "; ask for bf16 or f32 and convert");
    OCTET_CHECK(!x.is_cuda() || *dbias_dtype == DType::f32 || *dbias_dtype == DType::bf16 ||
                    *dbias_dtype == DType::f16,
                op, ": on the GPU the bias gradient is f32, bf16 or f16, got ", dtype_name(*dbias_dtype),
                "; ask for f32 and convert");
  }
  // The bias gradient sums dx over its rows: [rows, cols] with cols = x's last dim (1 for a scalar).
  const int64_t cols = x.dim() == 0 ? 1 : x.size(-1);
  if (!x.is_cuda()) {
    // The CPU: the two calls (each in the op ledger under its own name), and the sum.
    GeluGradAndOutput r{gelu_backward(dy, x, approximation), gelu_forward(x, approximation), Tensor()};
    if (dbias_dtype) {  // no columns: the empty bias gradient, as the GPU returns (reshape cannot infer rows of 0)
      r.dbias = cols == 0 ? empty({0}, *dbias_dtype) : sum(r.dx.reshape({-1, cols}), 0).to(*dbias_dtype);
    }
    return r;
  }
  LedgerOp ledger(op);
  ledger.read({&dy, &x}).write(x).write(x);
  if (dbias_dtype) ledger.write_bytes(cols * static_cast<int64_t>(dtype_size(*dbias_dtype)));
  return cuda::gelu_backward_and_forward(dy, x, approximation, may_overwrite_dy, dbias_dtype);
}

// ---- softmax cross-entropy ------------------------------------------------------------------------------

CrossEntropyOutput cross_entropy_forward(const Tensor& logits, const Tensor& targets, double label_smoothing,
                                         int64_t ignore_index) {
  constexpr const char* op = "cross_entropy_forward";
  LedgerOp ledger(op);
  ledger.read({&logits, &targets}).write_bytes((logits.dim() > 0 ? logits.size(0) + 1 : 1) * 4);  // lse, loss
  check_cross_entropy_args(op, logits, targets, label_smoothing);
  if (logits.is_cuda()) return cuda::cross_entropy_forward(logits, targets, label_smoothing, ignore_index);
  int64_t counted = 0;
  const Tensor t64 = checked_targets_cpu(op, logits, targets, ignore_index, &counted);
  const int64_t N = logits.size(0), C = logits.size(1);

  return with_compute_type(logits.dtype(), [&]<class T>() -> CrossEntropyOutput {
    const Tensor zc = to_compute(logits);
    Tensor loss = empty(Shape{}, dtype_of<T>()), lse = empty({N}, dtype_of<T>());
    loss.data<T>()[0] = cpu::cross_entropy_forward<T>(zc.data<T>(), t64.data<int64_t>(), lse.data<T>(), N, C,
                                                      static_cast<T>(label_smoothing), ignore_index);
    return {loss, lse};
  });
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dloss,
                              double label_smoothing, int64_t ignore_index) {
  constexpr const char* op = "cross_entropy_backward";
  LedgerOp ledger(op);
  ledger.read({&logits, &targets, &lse, &dloss}).write(logits);
  check_cross_entropy_args(op, logits, targets, label_smoothing);
  const int64_t N = logits.size(0), C = logits.size(1);
  const DType cd = compute_dtype(logits.dtype());
  check_defined(op, {&lse});
  OCTET_CHECK(lse.shape() == Shape{N} && lse.dtype() == cd, op, ": lse must be ", dtype_name(cd), "[", N,
              "] as cross_entropy_forward returns it for logits ", logits.describe(), ", got ", lse.describe());
  check_defined(op, {&dloss});
  OCTET_CHECK(dloss.numel() == 1 && is_floating(dloss.dtype()), op, ": dloss must be a one-element floating tensor, got ",
              dloss.describe());
  check_same_device(op, {&logits, &lse, &dloss});
  if (logits.is_cuda()) {
    return cuda::cross_entropy_backward(logits, targets, lse, dloss, label_smoothing, ignore_index);
  }
  int64_t counted = 0;
  const Tensor t64 = checked_targets_cpu(op, logits, targets, ignore_index, &counted);
  check_cpu(op, {&lse, &dloss});

  return with_compute_type(logits.dtype(), [&]<class T>() -> Tensor {
    const Tensor zc = to_compute(logits);
    Tensor dlogits = empty(logits.shape(), cd);
    // The loss is a mean over counted rows; with none counted every row is ignored and gets 0.
    const T grad_scale = counted == 0 ? T(0) : static_cast<T>(dloss.item() / static_cast<double>(counted));
    cpu::cross_entropy_backward<T>(zc.data<T>(), t64.data<int64_t>(), lse.data<T>(), dlogits.data<T>(), N, C,
                                   grad_scale, static_cast<T>(label_smoothing), ignore_index);
    return dlogits.to(logits.dtype());
  });
}

// ---- dropout -----------------------------------------------------------------------------------------------

namespace {

Tensor dropout_dispatch(const char* op, const Tensor& in, double p, uint64_t seed, uint64_t offset) {
  LedgerOp ledger(op);
  ledger.read(in).write(in);  // the mask is drawn, never stored
  // p = 0 keeps everything and scales by 1: skip the generator, but still return a fresh tensor.
  if (p == 0.0) return in.detach().clone();
  if (in.is_cuda()) return cuda::dropout_apply(in, p, seed, offset);
  check_cpu(op, {&in});
  return with_compute_type(in.dtype(), [&]<class T>() -> Tensor {
    const Tensor ic = to_compute(in);
    Tensor out = empty(in.shape(), dtype_of<T>());
    cpu::dropout_apply<T>(ic.data<T>(), out.data<T>(), in.numel(), p, seed, offset);
    return out.to(in.dtype());
  });
}

}  // namespace

Tensor dropout_forward(const Tensor& x, double p, uint64_t seed, uint64_t offset) {
  check_dropout_p("dropout_forward", x, p);
  return dropout_dispatch("dropout_forward", x, p, seed, offset);
}

Tensor dropout_backward(const Tensor& dy, double p, uint64_t seed, uint64_t offset) {
  check_dropout_p("dropout_backward", dy, p);
  return dropout_dispatch("dropout_backward", dy, p, seed, offset);
}

}  // namespace octet::kernels
