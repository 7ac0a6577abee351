#include "kernels/gemm.h"

#include <algorithm>

#include "core/op_ledger.h"
#include "kernels/common.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cuda/gemm_cuda.h"

namespace octet::kernels {

namespace {

struct GemmDims {
  int64_t m, n, k, batch;
  bool b_shared;  // b is 2-D and used by every batch
  bool fold_a;    // a's batch folds into M: one GEMM over all rows of a
};

GemmDims gemm_dims(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const char* op) {
  OCTET_CHECK(a.dim() >= 2 && b.dim() >= 2, op, ": operands need at least 2 dims (",
              describe_all({&a, &b}), ")");
  const int64_t a_rows = a.size(-2), a_cols = a.size(-1);
  const int64_t b_rows = b.size(-2), b_cols = b.size(-1);
  GemmDims d{};
  d.m = trans_a ? a_cols : a_rows;
  d.k = trans_a ? a_rows : a_cols;
  const int64_t bk = trans_b ? b_cols : b_rows;
  d.n = trans_b ? b_rows : b_cols;
  OCTET_CHECK(d.k == bk, op, ": inner dims differ: op(a) is [", d.m, ", ", d.k, "] and op(b) is [", bk, ", ", d.n,
              "] (", describe_all({&a, &b}), ", trans_a=", trans_a, ", trans_b=", trans_b, ")");
  // The product of the leading dims (not numel / (rows·cols), which is 0 for an empty matrix).
  const int64_t a_batch = Shape(a.shape().begin(), a.shape().end() - 2).numel();
  d.b_shared = b.dim() == 2;
  if (!d.b_shared) {
    OCTET_CHECK(Shape(a.shape().begin(), a.shape().end() - 2) == Shape(b.shape().begin(), b.shape().end() - 2), op,
                ": batch dims differ (", describe_all({&a, &b}), "); they must match, or b must be 2-D");
  }
  d.batch = a_batch;
  d.fold_a = d.b_shared && !trans_a && a_batch > 1;
  if (d.fold_a) {
    d.m *= a_batch;
    d.batch = 1;
  }
  return d;
}

Shape output_shape(const Tensor& a, const GemmDims& d, bool trans_a) {
  Shape s(a.shape().begin(), a.shape().end() - 2);
  s.push_back(trans_a ? a.size(-1) : a.size(-2));
  s.push_back(d.n);
  return s;
}

}  // namespace

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha, double beta) {
  constexpr const char* op = "gemm";
  check_same_device(op, {&a, &b, &c});
  check_floating(op, a);
  check_floating(op, b);
  check_floating(op, c);
  const GemmDims d = gemm_dims(a, trans_a, b, trans_b, op);
  const Shape expected = output_shape(a, d, trans_a);
  OCTET_CHECK(c.shape() == expected, op, ": output ", c.describe(), " should have shape ", expected, " (",
              describe_all({&a, &b}), ")");
  const bool f64 = a.dtype() == DType::f64 || b.dtype() == DType::f64 || c.dtype() == DType::f64;
  if (f64) check_same_dtype("gemm (f64 needs f64 everywhere)", {&a, &b, &c});
  OCTET_CHECK(!is_fp8(c.dtype()), op, ": FP8 output is not supported; write to bf16 or f32 (", c.describe(), ")");
  const int64_t stride_a = d.m * d.k, stride_b = d.b_shared ? 0 : d.k * d.n, stride_c = d.m * d.n;
  LedgerOp ledger(op, OpClass::kMatmul);
  ledger.read({&a, &b}).write(c).flops(2.0 * static_cast<double>(d.m) * static_cast<double>(d.n) *
                                       static_cast<double>(d.k) * static_cast<double>(d.batch));
  if (beta != 0.0) ledger.read(c);
  c.bump_version();
  if (c.is_cuda()) {
    cuda::gemm(a, trans_a, b, trans_b, c, cuda::GemmProblem{d.m, d.n, d.k, d.batch, stride_a, stride_b, stride_c}, alpha,
               beta);
    return;
  }
  check_cpu(op, {&a, &b, &c});

  // Low-precision operands widen to f32 exactly; a non-f32 output is computed in f32 and rounded once
  // (C widened first only when beta reads it). A bf16 C the tiles take in one pass is rounded as
  // they store it: the same bits without an f32 C in memory.
  const Tensor a32 = to_compute(a), b32 = to_compute(b);
  if (c.dtype() == DType::bf16 && beta == 0.0 && d.batch == 1 && a32.dtype() == DType::f32 &&
      cpu::gemm_tiled_to_bf16(trans_a, trans_b, d.m, d.n, d.k, static_cast<float>(alpha), a32.data<float>(),
                              b32.data<float>(), static_cast<uint16_t*>(c.data_ptr()))) {
    return;
  }
  const bool direct = c.dtype() == compute_dtype(c.dtype());
  Tensor acc = direct ? c : beta != 0.0 ? to_compute(c) : empty(c.shape(), compute_dtype(c.dtype()), c.device());
  with_compute_type(a32.dtype(), [&]<class T>() {
    cpu::gemm_strided_batched<T>(trans_a, trans_b, d.m, d.n, d.k, static_cast<T>(alpha), a32.data<T>(), stride_a,
                                 b32.data<T>(), stride_b, static_cast<T>(beta), acc.data<T>(), stride_c, d.batch);
  });
  if (!direct) c.copy_(acc);
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, std::optional<DType> out_dtype) {
  // Counted as the gemm it runs.
  check_defined("matmul", {&a, &b});
  const GemmDims d = gemm_dims(a, trans_a, b, trans_b, "matmul");
  const DType dtype = out_dtype.value_or(is_fp8(a.dtype()) ? DType::f32 : a.dtype());
  Tensor c = empty(output_shape(a, d, trans_a), dtype, a.device());
  gemm(a, trans_a, b, trans_b, c, 1.0, 0.0);
  return c;
}

}  // namespace octet::kernels
