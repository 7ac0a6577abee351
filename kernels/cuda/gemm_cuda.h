#pragma once
// GEMMs on CUDA tensors through cuBLASLt. Plain C++ (no CUDA types): kernels/gemm.cpp and
// kernels/linear.cpp call these after their shape checks.
//
// Operands: a and b share one dtype, f32, bf16 or f16; c is a's dtype or f32 (bf16 inputs with an
// f32 output is the wgrad into an f32 master gradient). Accumulation is always f32
// (CUBLAS_COMPUTE_32F, never TF32), so f32 results match the CPU's to rounding.
#include <cstdint>

#include "core/tensor.h"

namespace octet::kernels::cuda {

// A row-major problem: C[m, n] = alpha · op(A)[m, k] · op(B)[k, n] + beta · C, done `batch` times.
// Strides count elements between consecutive batches; stride_b = 0 shares one b across batches.
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// What cuBLASLt does to the product on its way out, in Octet's row-major terms (C = op(A)·op(B),
// before alpha/beta), with the cuBLASLt epilogue that does it. gelu_tanh is the tanh form of GELU
// (kernels/nn_ops.h GeluApproximation::Tanh): cuBLASLt's GELU epilogues have no erf form.
enum class GemmEpilogue {
  None,
  Bias,           // C[i, j] += bias[j]                                          BIAS
  BiasGradFromA,  // bias[i] = Σ_k op(A)[i, k]: the wgrad's dbias when A = dyᵀ    BGRADB (our A is its B)
  GeluAuxBias,    // aux[i, j] = P[i, j] + bias[j], C[i, j] = gelu_tanh(aux)     GELU_AUX_BIAS
};
// Not here: DGELU_BGRAD (C = P·gelu_tanh'(aux), bias = Σ_i C), for fc2's dgrad. On an H200 with
// cuBLASLt 13.1 it took 697 µs at ViT-H's MLP (12,608 x 1280 -> 5120, bf16), against 336 µs for the
// dgrad GEMM then the GELU backward kernel it replaces (2026-11-28), with no accuracy to show for it:
// its outputs failed a one-rounding bound at the same 209 of 262,144 places as that composition does
// on the CPU, which rounds the product to bf16 before the derivative. Octet uses the composition.

struct GemmEpilogueArgs {
  GemmEpilogue kind = GemmEpilogue::None;
  // Bias, GeluAuxBias: the input [n]. BiasGradFromA: the output [m].
  // In C's dtype (cuBLASLt's bias vectors and bias gradients are C-typed here).
  Tensor bias;
  // GeluAuxBias: the output [m, n], the GELU's input, kept for backward. C's dtype, shape and device.
  Tensor aux = {};
  // Bias: the matrix beta scales when it is not the output itself (cuBLASLt's out-of-place form, C read
  // from here, D written to c): c = alpha·P + beta·addend + bias, rounded once. c's dtype and [m, n].
  // Undefined: C is c.
  Tensor addend = {};
};

// Runs the GEMM on c's device and current stream. Throws an error naming the shapes and dtypes when
// cuBLASLt has no algorithm for it.
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, const GemmProblem& problem,
          double alpha, double beta);

// The same GEMM with a fused epilogue (batch 1 only). Returns false, having written nothing, when the
// epilogue's layout rules do not hold or cuBLASLt offers no algorithm for it at these shapes, dtypes
// and alignments; the caller then runs gemm() and the generic kernels instead.
bool gemm_with_epilogue(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                        const GemmProblem& problem, double alpha, double beta, const GemmEpilogueArgs& epilogue);

}  // namespace octet::kernels::cuda
