#include "autograd/checkpoint.h"

#include <utility>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "core/grad_mode.h"

namespace octet::autograd {

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs, std::function<void()> restore,
                               std::function<void()> release) {
  if (!GradMode::is_enabled() || !any_requires_grad(inputs)) return fn(inputs);
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    outputs = fn(inputs);
  }
  std::vector<Tensor> saved;
  saved.reserve(inputs.size());
  for (const Tensor& t : inputs) saved.push_back(t.defined() ? t.detach() : Tensor());
  std::vector<bool> needs;
  for (const Tensor& t : inputs) needs.push_back(t.defined() && t.requires_grad());
  return record("checkpoint", outputs, inputs,
                [fn, saved, needs, restore = std::move(restore), release = std::move(release)](const Grads& g) -> Grads {
                  std::vector<Tensor> leaves;
                  for (size_t i = 0; i < saved.size(); ++i) {
                    Tensor leaf = saved[i].defined() ? saved[i].detach() : Tensor();
                    if (needs[i]) leaf.requires_grad_();
                    leaves.push_back(leaf);
                  }
                  std::vector<Tensor> rerun;
                  {
                    EnableGradGuard grad_on;
                    if (restore) restore();
                    try {
                      rerun = fn(leaves);
                    } catch (...) {
                      if (release) release();
                      throw;
                    }
                    if (release) release();
                  }
                  std::vector<Tensor> roots, root_grads;
                  for (size_t i = 0; i < rerun.size(); ++i) {
                    if (rerun[i].defined() && rerun[i].requires_grad()) {
                      roots.push_back(rerun[i]);
                      root_grads.push_back(g[i]);
                    }
                  }
                  if (!roots.empty()) backward_within_pass(roots, root_grads);
                  Grads out;
                  for (size_t i = 0; i < leaves.size(); ++i) {
                    if (!needs[i]) {
                      out.emplace_back();
                    } else if (leaves[i].grad().defined()) {
                      out.push_back(leaves[i].grad());
                    } else {  // fn's outputs do not depend on this input
                      out.push_back(zeros(leaves[i].shape(), leaves[i].dtype(), leaves[i].device()));
                    }
                  }
                  return out;
                },
                saved);  // the rerun reads the inputs as forward saw them
}

}  // namespace octet::autograd
