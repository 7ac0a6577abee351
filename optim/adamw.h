#pragma once
// AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization"), as torch.optim.AdamW: the
// weight decay shrinks the parameter directly (p ← p·(1 - lr·weight_decay)) instead of entering the
// gradient, and the moments are bias-corrected by 1 - beta^step. State (exp_avg, exp_avg_sq) is f32
// (f64 for f64 parameters); bf16 parameters are updated through f32 master weights (optimizer.h).
// Each group is one multi-tensor kernel launch (kernels/optimizers.h) that reads p, g, m, v once and
// writes p, m, v once (and the bf16 working copy beside the master).
#include <vector>

#include "optim/optimizer.h"

namespace octet::optim {

class AdamW : public Optimizer {
 public:
  // lr and weight_decay apply to groups that leave them at ParamGroup::kInherit.
  AdamW(std::vector<ParamGroup> groups, double lr, double beta1 = 0.9, double beta2 = 0.999,
        double eps = 1e-8, double weight_decay = 0.01);
  // One group holding `params`.
  AdamW(std::vector<Tensor> params, double lr, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8,
        double weight_decay = 0.01);

  void step() override;

  double beta1() const { return beta1_; }
  double beta2() const { return beta2_; }
  double eps() const { return eps_; }

 protected:
  std::vector<std::string> state_buffer_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 private:
  double beta1_, beta2_, eps_;
};

}  // namespace octet::optim
