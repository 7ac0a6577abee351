#pragma once
// The three GEMMs of a Linear layer with what can ride along in their epilogues, for any device.
//
//   forward  y = x·Wᵀ + b               fprop GEMM, bias fused: cuBLASLt BIAS
//   backward dx = dy·W                  dgrad GEMM
//            dW = dyᵀ·x                 wgrad GEMM, dbias = Σ_rows dy fused: cuBLASLt BGRADB
//
// An MLP's fc1 -> GELU -> fc2 has one more, for the tanh form of GELU (cuBLASLt has no erf form):
//
//   fc1 forward   pre = x·W1ᵀ + b1, act = gelu(pre)          cuBLASLt GELU_AUX_BIAS
//
// and its backward through the GELU is fc2's dgrad GEMM then the GELU backward kernel
// (linear_dgelu_backward): cuBLASLt's DGELU_BGRAD, which would do both in one GEMM, was twice as slow
// on an H200 (kernels/cuda/gemm_cuda.h says by how much). Where that backward also makes the GELU's
// output again (autograd's linear_gelu_linear), its pass sums fc1's bias gradient too
// (kernels::gelu_backward_and_forward), and fc1's wgrad GEMM runs without BGRADB.
//
// The CPU composes kernels::gemm, the bias add and kernels::sum (and the GELU kernels). On the GPU an
// epilogue is used only where its layout rules hold and cuBLASLt offers an algorithm for it;
// otherwise the same composition runs there.
#include "core/tensor.h"
#include "kernels/nn_ops.h"

namespace octet::kernels {

// x [..., in], weight [out, in], bias [out] or undefined. Returns y [..., out] in x's dtype (f32 for
// FP8 x). On the GPU a weight of another dtype than x is converted to x's dtype first (cuBLASLt
// multiplies operands of one dtype; this is what autocast does); the CPU widens both exactly and
// needs no copy.
//
// With a residual (y's shape and dtype), returns residual + x·Wᵀ + b: a pre-norm block's residual
// adds (after attention's projection and after fc2). With a bias the sum is rounded once: on the GPU cuBLASLt reads the residual in the GEMM's
// epilogue, and the CPU, in bf16 and f16, accumulates the product onto residual + b in f32. Without a
// bias, in f32 on the CPU, and where cuBLASLt offers no algorithm for the epilogue:
// add(linear_forward(x, weight, bias), residual), two roundings, bit for bit the two calls.
Tensor linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual = Tensor());

// Where the GPU sums a Linear's bias gradient, dbias = Σ over dy's rows, when linear_backward runs the
// wgrad GEMM (bench_kernels times both; the fourth GPU run, 2026-11-29, chose the column sum: ViT-H's
// qkv, proj and fc2 weight gradients 360.4 µs a block with it, 370.4 with BGRADB):
//   kEpilogue   cuBLASLt's BGRADB epilogue on the wgrad GEMM, which runs a reduction kernel of
//               cuBLASLt's own after the GEMM (on an H200, 14.2 µs for ViT-H's 12,608 × 1280 bf16 dy,
//               39.9 µs for × 3840: 53-59% of a copy's bandwidth);
//   kColumnSum  the wgrad GEMM alone, then Octet's column reduction over dy (kernels/cuda/reduce.cu,
//               16-byte packs: 7.7 and 22.8 µs at a copy's bandwidth).
// Both add the f32 sums in orders of their own and round once to dweight's dtype, so the bits may
// differ in the last place; each repeats bit for bit. Process-wide, kColumnSum unless set. Where
// BGRADB does not apply (no wgrad asked for, no algorithm) the GPU takes the column reduction too; the
// CPU sums in dy's dtype (kernels::sum), then converts to dweight's.
enum class LinearBiasGradDesign { kEpilogue, kColumnSum };
void set_linear_bias_grad_design(LinearBiasGradDesign design);
LinearBiasGradDesign linear_bias_grad_design();

struct LinearGrads {
  Tensor dx;       // x's shape and dtype
  Tensor dweight;  // [out, in] in weight's dtype
  Tensor dbias;    // [out] in dweight's dtype; the caller converts to bias's
};
// dy: y's shape. Gradients not asked for come back undefined.
LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, bool need_dx, bool need_dweight,
                            bool need_dbias);

// A Linear then GELU: pre = linear_forward(x, weight, bias) and act = gelu_forward(pre). Both have
// x's shape with the last dim out, in x's dtype (x not FP8).
//
// On the GPU with the tanh form, bf16 or f16 x, a bias and out a multiple of 8, one cuBLASLt GEMM
// writes both (GELU_AUX_BIAS), where the composition writes pre, reads it back and writes act. Its
// GELU is cuBLASLt's own code, not gelu_forward's: act can differ from gelu_forward(pre) by the
// rounding of a 16-bit result (the GPU tests bound it). Elsewhere, the composition.
struct LinearGeluOutput {
  Tensor pre, act;
};
LinearGeluOutput linear_gelu_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                     GeluApproximation approximation);

// The input gradient of act -> Linear(weight) taken on through the GELU: with dact = dy·weight (the
// Linear's dgrad), dpre = gelu_backward(dact, pre), in pre's shape and dtype. pre [..., in] is the
// GELU's input, dy [..., out]. On every device the dgrad GEMM, then the GELU backward kernel; the
// gradient of the bias that made pre is the caller's (linear_backward of the Linear that made pre
// sums dpre, in its wgrad's epilogue on the GPU).
Tensor linear_dgelu_backward(const Tensor& dy, const Tensor& pre, const Tensor& weight,
                             GeluApproximation approximation);

}  // namespace octet::kernels
