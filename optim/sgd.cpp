#include "optim/sgd.h"

#include <map>

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
  for (size_t g = 0; g < param_groups().size(); ++g) {
    const std::vector<ParamToUpdate> todo = params_with_grad(g);
    // The first step copies the gradient into the momentum buffer instead of decaying it: one launch
    // for parameters on their first step, one for the rest.
    std::vector<kernels::SgdTensors> first, later;
    for (const ParamToUpdate& u : todo) {
      std::map<std::string, Tensor>& b = u.state->buffers;
      Tensor buffer;
      if (momentum_ != 0) {
        Tensor& m = b["momentum_buffer"];
        // The first step writes all of it.
        if (!m.defined()) m = empty(u.param.shape(), state_dtype(u.param), u.param.device());
        buffer = m;
      }
      const auto master = b.find("master");
      (u.state->step == 0 ? first : later)
          .push_back({u.param, u.param.grad(), buffer, master != b.end() ? master->second : Tensor()});
    }
    const ParamGroup& group = param_groups()[g];
    for (const bool first_step : {true, false}) {
      const std::vector<kernels::SgdTensors>& tensors = first_step ? first : later;
      if (tensors.empty()) continue;
      kernels::sgd_step_multi_(tensors, group.lr, momentum_, dampening_, nesterov_, group.weight_decay,
                               first_step);
    }
    finish_step(todo);
  }
}

}  // namespace octet::optim
