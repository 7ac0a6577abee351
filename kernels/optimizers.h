#pragma once
// Fused optimizer updates: one pass per parameter reads the gradient and the optimizer state and
// writes the new parameter and state in place. Parameters and state are f32 (the master weights;
// f64 for references and tests); the gradient is the parameter's dtype or, for an f32 parameter,
// bf16, widened on the fly instead of through a converted copy. Hyperparameters arrive as doubles
// and are rounded once to the compute type, as PyTorch's fused kernels do.
//
// Bytes moved per element (f32): AdamW reads p, g, m, v and writes p, m, v: 28 bytes;
// SGD with momentum reads p, g, buf and writes p, buf: 20 bytes.
#include <cstdint>

#include "core/tensor.h"

namespace octet::kernels {

// AdamW (Loshchilov & Hutter; PyTorch's torch.optim.AdamW), for the `step`-th update (from 1):
//   p ← p · (1 - lr·weight_decay)                     (decoupled decay, before the moment update)
//   m ← beta1·m + (1 - beta1)·g
//   v ← beta2·v + (1 - beta2)·g²
//   p ← p - lr / (1 - beta1^step) · m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// exp_avg (m) and exp_avg_sq (v) have param's shape and dtype; start them at zero.
void adamw_step_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step);

// SGD with momentum (PyTorch's torch.optim.SGD):
//   d ← g + weight_decay·p
//   with momentum: buf ← d on the first step, else momentum·buf + (1 - dampening)·d;
//                  d ← d + momentum·buf (nesterov) or d ← buf
//   p ← p - lr·d
// momentum_buffer has param's shape and dtype, and may be undefined when momentum is 0.
void sgd_step_(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr,
               double momentum, double dampening, bool nesterov, double weight_decay, bool first_step);

// Σ t², accumulated in double over fixed blocks of elements and then the block sums in order, so the
// result is bitwise the same for any thread count. Any floating dtype. For gradient-norm clipping.
double sum_of_squares(const Tensor& t);

}  // namespace octet::kernels
