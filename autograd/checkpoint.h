#pragma once
// Activation recompute (PyTorch's torch.utils.checkpoint, the reentrant kind): run a function now
// without keeping what its backward needs, and run it again inside backward to rebuild that.
//
//   outputs = checkpoint(fn, inputs)
//
// The forward runs fn with grad mode off, so nothing inside fn is saved: the node recorded here keeps
// only the inputs. Its backward runs `restore` (which puts back whatever fn's randomness depends on,
// so dropout draws the same masks), runs fn again with grad mode on from detached copies of the
// inputs, `release` (which undoes `restore`), then backpropagates the outputs' gradients through that
// fresh graph in a pass that is part of the one under way (autograd::backward_within_pass). Gradients
// of tensors fn reaches other than its inputs (a module's parameters) accumulate in that nested pass,
// as they would have; the inputs' gradients are returned to the outer graph.
//
// Because those gradients accumulate in the nested pass, a parameter that fn uses and that is also
// used outside fn (or inside two checkpoints) receives its gradient in two passes, and its
// post-accumulate hooks fire in each with part of it. DDP and FSDP hang their reductions on those
// hooks and refuse a gradient that arrives twice, so such a parameter must not be shared across the
// recompute boundary under them (PyTorch's reentrant checkpoint has the same limit). A
// TransformerBlock's parameters are its own, so per-block recompute (nn/recompute.h) never meets it.
//
// The node checks its inputs' versions as any node checks what it saved (autograd/function.h); what
// fn reads besides them (a module's parameters) is read as it is when backward reruns fn.
//
// fn must be deterministic given what `restore` restores, and must not depend on grad mode for its
// values. When no input requires grad there is no node to hang the recompute on: fn then runs
// normally, keeping its graph (as PyTorch's reentrant checkpoint does, minus its warning).
#include <functional>
#include <vector>

#include "core/tensor.h"

namespace octet::autograd {

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                               std::function<void()> restore = nullptr, std::function<void()> release = nullptr);

}  // namespace octet::autograd
