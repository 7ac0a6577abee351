#include "autograd/node.h"

#include <atomic>

#include "autograd/accumulate_grad.h"

namespace octet::autograd {

namespace {
std::atomic<uint64_t> next_sequence_nr{0};
}

Node::Node(std::string name) : name_(std::move(name)), sequence_nr_(next_sequence_nr++) {}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  if (t.grad_fn()) return {t.grad_fn(), t.impl()->autograd->output_nr};
  return {AccumulateGrad::for_leaf(t), 0};
}

}  // namespace octet::autograd
