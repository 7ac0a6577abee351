#pragma once
// Scaled dot-product attention, unfused: the reference the fused GPU kernels are checked against.
//   q, k, v, out: [B, H, S, D]    (k and v may have their own sequence length Sk)
//   out = softmax(q·kᵀ·scale)·v, non-causal.
// Forward saves the per-row log-sum-exp (f32) instead of the probabilities, as fused attention
// does; backward recomputes the probabilities from it.
#include "core/tensor.h"

namespace octet::kernels {

struct AttentionOutput {
  Tensor out;  // q's dtype
  Tensor lse;  // [B, H, S], f32 (f64 for f64 inputs)
};
AttentionOutput attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale);

struct AttentionGrads {
  Tensor dq, dk, dv;
};
AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, double scale);

}  // namespace octet::kernels
