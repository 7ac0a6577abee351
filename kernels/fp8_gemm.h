#pragma once
// The FP8 GEMM: both operands FP8 under per-tensor scales (kernels/fp8.h), f32 accumulation, output
// in bf16 or f32.
//
//   out[m, n] = scale_inv_a · scale_inv_b · Σ_k a[m, k]·b[n, k]   (+ bias[n]) (+ out, with accumulate)
//                                                                  (+ addend[m, n], with an addend)
//
// Layout. Hopper's FP8 tensor cores read both operands K-major: a is [m, k] and b is [n, k], each row
// contiguous over the reduction dim. This is cuBLASLt's "TN" (its A transposed, its B not, in
// column-major terms) and the only layout it offers for FP8. So a Linear's backward GEMMs read the
// transposed casts: dgrad dx = dy·W takes b = Wᵀ [in, out]; wgrad dW = dyᵀ·x takes a = dyᵀ and
// b = xᵀ, both padded with zero columns to a multiple of 16 tokens.
//
// Rules, the same on every device so that what runs on the CPU runs on the GPU: k and n multiples of
// 16 (16-byte aligned FP8 rows, and bf16 output rows); a and b each e4m3 or e5m2 but not both e5m2
// (Hopper has no E5M2×E5M2 kernel); out and bias bf16 or f32; scale_inv_a and scale_inv_b [1] f32.
//
// CUDA: cuBLASLt with CUBLASLT_MATMUL_DESC_{A,B}_SCALE_POINTER set to the scale_inv tensors, the bias
// in the BIAS epilogue (added by a separate kernel where cuBLASLt refuses it: an f32 bias with an f32
// out, as its FP8 type table reads), and with fast_accumulate, CUBLASLT_MATMUL_DESC_FAST_ACCUM (Hopper accumulates
// in its tensor cores' reduced precision for longer before promoting to f32: faster, a little less
// accurate; Transformer Engine uses it for the forward GEMM only).
// CPU, the exact emulation: a and b are decoded to f32 (exact), multiplied by one f32 GEMM, and the
// result is scaled by scale_inv_a·scale_inv_b, the bias and the old out added, and rounded once to
// out's dtype. The scales are applied after the sum, as the GPU does, so CPU and GPU differ only by
// accumulation order. fast_accumulate changes nothing on the CPU.
#include "core/tensor.h"

namespace octet::kernels {

// a: [m, k] FP8, b: [n, k] FP8, out: [m, n] bf16 or f32 (written; read too with accumulate),
// bias: [n] in out's dtype or undefined. All on one device.
// addend: [m, n] in out's dtype, or undefined: out = ... + bias + addend, rounded once, as accumulate
// adds the old out (a residual added in the GEMM: on the GPU cuBLASLt reads it as C, apart from D).
// Not with accumulate.
void fp8_gemm(const Tensor& a, const Tensor& scale_inv_a, const Tensor& b, const Tensor& scale_inv_b, const Tensor& out,
              const Tensor& bias = Tensor(), bool accumulate = false, bool fast_accumulate = false,
              const Tensor& addend = Tensor());

}  // namespace octet::kernels
