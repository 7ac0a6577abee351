#pragma once
// The three GEMMs of a Linear layer with what can ride along in their epilogues, for any device.
//
//   forward  y = act(x·Wᵀ + b)         fprop GEMM, bias (and GELU) fused: cuBLASLt BIAS / GELU_AUX_BIAS
//   backward dz = dy ⊙ act'(pre)        (dz = dy without an activation)
//            dx = dz·W                  dgrad GEMM
//            dW = dzᵀ·x (+= with beta 1) wgrad GEMM, dbias = Σ_rows dz fused: cuBLASLt BGRADB
//
// The CPU composes kernels::gemm, the bias add, kernels::gelu_* (tanh form) and kernels::sum. On the
// GPU an epilogue is used only where its layout rules hold and cuBLASLt offers an algorithm for it
// (the GELU ones need `out` to be a multiple of 8); otherwise the same composition runs there.
//
// The activation is GELU's tanh approximation only: that is the one cuBLASLt fuses. timm's ViT uses
// the erf GELU, which has no epilogue, so its Mlp keeps GELU as a separate op.
#include "core/tensor.h"

namespace octet::kernels {

enum class LinearActivation { None, GeluTanh };

struct LinearForward {
  Tensor y;               // [..., out] in x's dtype (f32 for FP8 x)
  Tensor pre_activation;  // x·Wᵀ + b, y's shape and dtype; only with an activation (backward needs it)
};
// x [..., in], weight [out, in], bias [out] or undefined. On the GPU a weight of another dtype than
// x is converted to x's dtype first (cuBLASLt multiplies operands of one dtype; this is what
// autocast does); the CPU widens both exactly and needs no copy.
LinearForward linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             LinearActivation act = LinearActivation::None);

struct LinearGrads {
  Tensor dx;       // x's shape and dtype
  Tensor dweight;  // [out, in] in weight's dtype, or dweight_accumulate itself
  Tensor dbias;    // [out] in dweight's dtype (f32 for f32 master weights); the caller converts to bias's
};
// dy: y's shape. pre_activation: LinearForward::pre_activation (undefined when act is None).
// With dweight_accumulate defined ([out, in]) the wgrad adds into it (beta = 1) and returns it as
// dweight, and dbias takes its dtype. Gradients not asked for come back undefined.
LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& pre_activation,
                            LinearActivation act, bool need_dx, bool need_dweight, bool need_dbias,
                            const Tensor& dweight_accumulate = Tensor());

// The dgrad of a Linear whose input was gelu_tanh(x_pre_activation), the output of a Linear before it
// with LinearActivation::GeluTanh (an MLP run as fc1 + GELU → fc2). dz is this layer's dz ([..., out]).
// Returns the gradient of x_pre_activation, (dz·W) ⊙ gelu_tanh'(x_pre_activation), and when asked the
// previous layer's dbias, its sum over rows. On the GPU this is one GEMM with cuBLASLt's DGELU or
// DGELU_BGRAD epilogue; run the previous layer's linear_backward on d_pre_activation with
// LinearActivation::None and need_dbias = false.
struct GeluDgrad {
  Tensor d_pre_activation;  // x_pre_activation's shape and dtype
  Tensor dbias;             // [in] in d_pre_activation's dtype; undefined unless need_dbias
};
GeluDgrad linear_dgrad_gelu(const Tensor& dz, const Tensor& weight, const Tensor& x_pre_activation, bool need_dbias);

}  // namespace octet::kernels
