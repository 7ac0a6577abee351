#pragma once
// Activation recompute for a piece of a model: autograd::checkpoint (autograd/checkpoint.h) with what
// the layers above autograd need for the rerun to give the first run's bits.
//
//   y = nn::recompute(*mlp, [&](const Tensor& t) { return mlp->forward(t); }, x);
//
// `fn` runs now without keeping what its backward needs (only x is kept), and again inside backward.
// For that rerun:
//   - every random stream the Dropout and DropPath modules of `module` draw from (those with p > 0; a
//     LoRA adapter's dropout included), and the default generator, are rewound to where the first run
//     found them, and put back afterwards where backward found them;
//   - under FP8 the rerun casts with the scales the first run used and records no amax
//     (Fp8ForwardRecorder and Fp8Replay, nn/fp8.h), so the FP8 state ends as one forward leaves it.
// `fn` must compute the same thing given the same streams and scales, and must not call `module`
// through its hooks (operator()): a wrapper's hooks (FSDP's gathers) run once, around the call that
// recompute is part of. TransformerBlock::recompute uses this; without gradients `fn` simply runs.
#include <functional>

#include "core/tensor.h"
#include "nn/module.h"

namespace octet::nn {

Tensor recompute(Module& module, const std::function<Tensor(const Tensor&)>& fn, const Tensor& x);

}  // namespace octet::nn
