#include "autograd/function.h"

#include "autograd/node.h"
#include "core/grad_mode.h"
#include "core/host_sync.h"

namespace octet::autograd {

namespace {

// A tensor the closure reads, and its storage's version when forward saved it.
struct SavedVersion {
  Tensor tensor;
  uint64_t version = 0;
};

class FunctionNode : public Node {
 public:
  FunctionNode(std::string name, BackwardFn backward) : Node(std::move(name)), backward_(std::move(backward)) {}

  void save(const std::vector<Tensor>& saved) {
    for (const Tensor& t : saved) {
      // Detached: an op's own output, saved, must not hold this node through its grad_fn (a cycle
      // that would keep the graph alive whenever backward does not run to the end). The version is
      // the storage's, which the detached handle shares.
      if (t.defined()) saved_.push_back({t.detach(), t.version()});
    }
  }

  std::vector<Tensor> apply(std::vector<Tensor> grad_outputs) override {
    OCTET_CHECK(backward_ != nullptr, "backward: the graph through '", name(),
                "' was already freed by an earlier backward(); pass retain_graph=true to the first call "
                "to backpropagate through it twice");
    for (size_t i = 0; i < saved_.size(); ++i) {
      const uint64_t now = saved_[i].tensor.version();
      OCTET_CHECK(now == saved_[i].version, "backward: a tensor that '", name(), "' saved for its gradient (",
                  saved_[i].tensor.describe(), ", saved tensor ", i, ") was modified in place after the forward (its ",
                  "storage is at version ", now, "; the forward saw version ", saved_[i].version,
                  "), so the gradient would be computed from the new values. Modify a clone() instead, or modify ",
                  "it after backward()");
    }
    // The closure runs the op's backward kernels. On the CPU such a kernel may read a scalar operand
    // with item() (cross_entropy_backward reads the loss gradient) where its CUDA twin reads it on the
    // device: not a host read of the step's values (core/host_sync.h). GPU reads still count, and so
    // does everything outside the closure (tensor hooks, AccumulateGrad's hooks, DDP, FSDP).
    const host_sync::CpuKernelScope kernels_run_here;
    return backward_(grad_outputs);
  }
  void release_saved() override {
    backward_ = nullptr;
    saved_.clear();
  }

 private:
  BackwardFn backward_;
  std::vector<SavedVersion> saved_;
};

}  // namespace

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  for (const Tensor& t : inputs) {
    if (t.requires_grad()) return true;
  }
  return false;
}

std::vector<Tensor> record(std::string name, std::vector<Tensor> outputs, const std::vector<Tensor>& inputs,
                           BackwardFn backward, const std::vector<Tensor>& saved) {
  if (!GradMode::is_enabled() || !any_requires_grad(inputs)) return outputs;
  auto node = std::make_shared<FunctionNode>(std::move(name), std::move(backward));
  for (const Tensor& input : inputs) {
    node->next_edges.push_back(gradient_edge(input));
    node->input_meta.push_back(input.defined() ? TensorMeta::of(input) : TensorMeta{});
  }
  for (uint32_t i = 0; i < outputs.size(); ++i) {
    Tensor& out = outputs[i];
    OCTET_CHECK(out.defined() && is_floating(out.dtype()), "record(", node->name(), "): output ", i, " is ",
                out.describe(), "; only floating outputs can carry gradients");
    // An output that already has autograd state belongs to someone else (an op that returned its
    // input unchanged); give this op its own handle to the same data.
    if (out.impl()->autograd) out = out.detach();
    AutogradMeta& meta = out.impl()->autograd_meta();
    meta.requires_grad = true;
    meta.grad_fn = node;
    meta.output_nr = i;
    node->output_meta.push_back(TensorMeta::of(out));
    node->output_hooks.push_back(meta.hooks);
  }
  node->save(saved);  // after the forward wrote the outputs: their versions as backward must find them
  return outputs;
}

Tensor record(std::string name, Tensor output, const std::vector<Tensor>& inputs, BackwardFn backward,
              const std::vector<Tensor>& saved) {
  return record(std::move(name), std::vector<Tensor>{std::move(output)}, inputs, std::move(backward), saved)[0];
}

}  // namespace octet::autograd
