#include "optim/adamw.h"

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
  for_each_param_with_grad([&](const ParamGroup& group, const Tensor& p, ParamState& s) {
    if (s.step == 0) {
      s.buffers["exp_avg"] = zeros(p.shape(), p.dtype(), p.device());
      s.buffers["exp_avg_sq"] = zeros(p.shape(), p.dtype(), p.device());
    }
    kernels::adamw_step_(p, p.grad(), s.buffers.at("exp_avg"), s.buffers.at("exp_avg_sq"), group.lr, beta1_,
                         beta2_, eps_, group.weight_decay, s.step + 1);
    ++s.step;
  });
}

}  // namespace octet::optim
