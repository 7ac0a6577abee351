#pragma once
// The backward engine: from the roots, count how many edges point at each node, then run nodes
// whose count has reached zero (Kahn's reverse topological order), summing the gradients that
// several consumers send to the same input.
#include <functional>
#include <vector>

#include "core/tensor.h"

namespace octet::autograd {

// grads[i] is d(something)/d(roots[i]); an undefined entry means ones for a one-element root.
// Without retain_graph, each node frees what it saved once it has run, and a second backward
// through it throws.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads = {}, bool retain_graph = false);
// A backward pass that is part of the one under way, run from inside it: a recompute's backward
// (autograd/checkpoint.h). Callbacks queued in it join the enclosing pass's and run when that pass
// ends, once, as they would without the recompute (an FP8 recipe's gradient-scale update, DDP's
// wait for its last bucket). Frees the graph it runs.
void backward_within_pass(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads);

// Queues `callback` to run once the backward pass now running has processed every node, after all
// gradients are accumulated (PyTorch's queue_callback). For work that must see the whole pass: an FP8
// recipe updating its gradient scales once per step, DDP waiting for its last bucket. Callbacks run in
// the order queued, with grad mode off; one may queue another. Only valid inside a backward pass (from
// a node's closure or a gradient hook); if the pass throws, its queued callbacks are dropped.
void queue_callback(std::function<void()> callback);
bool in_backward();  // whether a backward pass is running on this thread

}  // namespace octet::autograd
