#pragma once
// Matrix multiplication. CPU: OpenBLAS sgemm/dgemm; bf16, f16 and FP8 operands are widened to f32
// first, which is an exact emulation of a low-precision GEMM with f32 accumulation. CUDA: cuBLASLt
// with f32 accumulation (kernels/cuda/gemm_cuda.h); there a and b must share one dtype (f32, bf16
// or f16) and c is that dtype or f32.
#include <optional>

#include "core/tensor.h"

namespace octet::kernels {

// c = alpha * op(a) · op(b) + beta * c, where op(x) is x or its transpose over the last two dims.
//   a: [..., M, K] ([..., K, M] if trans_a)     b: [..., K, N] ([..., N, K] if trans_b)
//   c: [..., M, N], already allocated; beta = 1 accumulates into it (wgrad).
// Leading (batch) dims of a and b must match, or b may be 2-D and is then shared by every batch
// (the Linear case) — a 2-D b with batched a is one big GEMM over a's rows.
// Operand dtypes may differ (e4m3 · e5m2); c is f32, f64, bf16 or f16. f64 needs f64 everywhere.
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha = 1.0,
          double beta = 0.0);

// Allocates c and returns op(a) · op(b). out_dtype defaults to a's dtype (f32 for FP8 operands).
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false,
              std::optional<DType> out_dtype = std::nullopt);

}  // namespace octet::kernels
