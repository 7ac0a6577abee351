#pragma once
// Stochastic gradient descent with momentum, dampening, Nesterov momentum and (coupled) weight
// decay, as torch.optim.SGD: for each parameter with a gradient g,
//   d = g + weight_decay·p;  buf = d (first step) or momentum·buf + (1 - dampening)·d;
//   d = d + momentum·buf (nesterov) or buf;  p = p - lr·d
// Each group is one multi-tensor kernel launch (kernels/optimizers.h); bf16 parameters are updated
// through f32 master weights and an f32 momentum buffer (optimizer.h).
#include <vector>

#include "optim/optimizer.h"

namespace octet::optim {

class SGD : public Optimizer {
 public:
  // lr and weight_decay apply to groups that leave them at ParamGroup::kInherit.
  SGD(std::vector<ParamGroup> groups, double lr, double momentum = 0, double dampening = 0,
      bool nesterov = false, double weight_decay = 0);
  // One group holding `params`.
  SGD(std::vector<Tensor> params, double lr, double momentum = 0, double dampening = 0, bool nesterov = false,
      double weight_decay = 0);

  void step() override;

  double momentum() const { return momentum_; }
  double dampening() const { return dampening_; }
  bool nesterov() const { return nesterov_; }

 protected:
  // "momentum_buffer" with momentum, nothing without.
  std::vector<std::string> state_buffer_names() const override;

 private:
  double momentum_, dampening_;
  bool nesterov_;
};

}  // namespace octet::optim
