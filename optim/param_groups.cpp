#include "optim/param_groups.h"

#include <array>
#include <string_view>

namespace octet::optim {

bool is_weight_decayed(const std::string& name, const Tensor& param) {
  static constexpr std::array<std::string_view, 2> kNoWeightDecay = {"pos_embed", "cls_token"};
  if (param.dim() <= 1) return false;
  for (std::string_view suffix : kNoWeightDecay) {
    if (std::string_view(name).ends_with(suffix)) return false;
  }
  return true;
}

std::vector<ParamGroup> weight_decay_groups(const std::vector<std::pair<std::string, Tensor>>& named,
                                            double lr, double weight_decay) {
  ParamGroup no_decay{{}, lr, 0.0};
  ParamGroup decay{{}, lr, weight_decay};
  for (const auto& [name, param] : named) {
    OCTET_CHECK(param.defined(), "weight_decay_groups: parameter '", name, "' is undefined");
    if (!param.requires_grad()) continue;
    (is_weight_decayed(name, param) ? decay : no_decay).params.push_back(param);
  }
  std::vector<ParamGroup> groups;
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  return groups;
}

}  // namespace octet::optim
