#include "optim/sgd.h"

#include "kernels/optimizers.h"

namespace octet::optim {

SGD::SGD(std::vector<ParamGroup> groups, double lr, double momentum, double dampening, bool nesterov,
         double weight_decay)
    : Optimizer("SGD", std::move(groups), lr, weight_decay),
      momentum_(momentum),
      dampening_(dampening),
      nesterov_(nesterov) {
  check_hyperparameter("momentum", momentum, momentum >= 0, "finite and >= 0");
  check_hyperparameter("dampening", dampening, true, "finite");
  OCTET_CHECK(!nesterov || (momentum > 0 && dampening == 0),
              "SGD: nesterov needs momentum > 0 and dampening 0, got ", "momentum ", momentum,
              " and dampening ", dampening, "; set them so or turn nesterov off");
}

SGD::SGD(std::vector<Tensor> params, double lr, double momentum, double dampening, bool nesterov,
         double weight_decay)
    : SGD(std::vector<ParamGroup>{ParamGroup{std::move(params)}}, lr, momentum, dampening, nesterov,
          weight_decay) {}

std::vector<std::string> SGD::state_buffer_names() const {
  if (momentum_ == 0) return {};
  return {"momentum_buffer"};
}

void SGD::step() {
  for_each_param_with_grad([&](const ParamGroup& group, const Tensor& p, ParamState& s) {
    Tensor buffer;
    if (momentum_ != 0) {
      Tensor& b = s.buffers["momentum_buffer"];
      if (!b.defined()) b = empty(p.shape(), p.dtype(), p.device());  // the first step writes all of it
      buffer = b;
    }
    kernels::sgd_step_(p, p.grad(), buffer, group.lr, momentum_, dampening_, nesterov_, group.weight_decay,
                       /*first_step=*/s.step == 0);
    ++s.step;
  });
}

}  // namespace octet::optim
