#pragma once
// The backward engine: from the roots, count how many edges point at each node, then run nodes
// whose count has reached zero (Kahn's reverse topological order), summing the gradients that
// several consumers send to the same input.
#include <vector>

#include "core/tensor.h"

namespace octet::autograd {

// grads[i] is d(something)/d(roots[i]); an undefined entry means ones for a one-element root.
// Without retain_graph, each node frees what it saved once it has run, and a second backward
// through it throws.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads = {}, bool retain_graph = false);

}  // namespace octet::autograd
