#include "optim/adamw.h"

#include <map>

#include "kernels/optimizers.h"

namespace octet::optim {

AdamW::AdamW(std::vector<ParamGroup> groups, double lr, double beta1, double beta2, double eps,
             double weight_decay)
    : Optimizer("AdamW", std::move(groups), lr, weight_decay), beta1_(beta1), beta2_(beta2), eps_(eps) {
  check_hyperparameter("beta1", beta1, beta1 >= 0 && beta1 < 1, "in [0, 1)");
  check_hyperparameter("beta2", beta2, beta2 >= 0 && beta2 < 1, "in [0, 1)");
  check_hyperparameter("eps", eps, eps >= 0, "finite and >= 0");
}

AdamW::AdamW(std::vector<Tensor> params, double lr, double beta1, double beta2, double eps,
             double weight_decay)
    : AdamW(std::vector<ParamGroup>{ParamGroup{std::move(params)}}, lr, beta1, beta2, eps, weight_decay) {}

void AdamW::step() {
  for (size_t g = 0; g < param_groups().size(); ++g) {
    const std::vector<ParamToUpdate> todo = params_with_grad(g);
    // One multi-tensor launch per distinct step count (the bias corrections depend on it); all of a
    // group's parameters share it unless some missed gradients in earlier steps.
    std::map<int64_t, std::vector<kernels::AdamWTensors>> by_step;
    for (const ParamToUpdate& u : todo) {
      std::map<std::string, Tensor>& b = u.state->buffers;
      if (u.state->step == 0) {
        b["exp_avg"] = zeros(u.param.shape(), state_dtype(u.param), u.param.device());
        b["exp_avg_sq"] = zeros(u.param.shape(), state_dtype(u.param), u.param.device());
      }
      const auto master = b.find("master");
      by_step[u.state->step + 1].push_back({u.param, u.param.grad(), b.at("exp_avg"), b.at("exp_avg_sq"),
                                            master != b.end() ? master->second : Tensor()});
    }
    const ParamGroup& group = param_groups()[g];
    for (const auto& [step, tensors] : by_step) {
      kernels::adamw_step_multi_(tensors, group.lr, beta1_, beta2_, eps_, group.weight_decay, step);
    }
    finish_step(todo);
  }
}

}  // namespace octet::optim
