#include "autograd/accumulate_grad.h"

#include "kernels/elementwise.h"

namespace octet::autograd {

AccumulateGrad::AccumulateGrad(Tensor leaf) : Node("AccumulateGrad"), leaf_(std::move(leaf)) {
  output_meta.push_back(TensorMeta::of(leaf_));
  output_hooks.push_back(leaf_.impl()->autograd_meta().hooks);
}

std::shared_ptr<Node> AccumulateGrad::for_leaf(const Tensor& leaf) {
  AutogradMeta& meta = leaf.impl()->autograd_meta();
  if (auto existing = meta.grad_accumulator.lock()) return existing;
  auto node = std::make_shared<AccumulateGrad>(leaf);
  meta.grad_accumulator = node;
  return node;
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor> grad_outputs) {
  Tensor& incoming = grad_outputs[0];
  const Tensor& current = leaf_.grad();
  if (!current.defined()) {
    // Keep the incoming buffer when nothing else can see it; otherwise copy, so two leaves never
    // share one gradient buffer (add's backward hands the same tensor to both inputs).
    const bool exclusive = incoming.use_count() == 1 && incoming.storage().use_count() == 1 &&
                           incoming.dtype() == leaf_.dtype();
    leaf_.set_grad(exclusive ? incoming : incoming.to(leaf_.dtype()).clone());
  } else {
    kernels::add_(current, incoming);
  }
  // Copies: a hook may register another (the list would move under us), and gets its own handle to
  // the leaf (rebinding its argument must not rebind this node's).
  const auto hooks = leaf_.impl()->autograd_meta().post_accumulate_hooks;
  for (const auto& hook : hooks) {
    Tensor leaf = leaf_;
    hook(leaf);
  }
  return {};
}

}  // namespace octet::autograd
