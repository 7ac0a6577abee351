#pragma once
// Splitting a model's parameters into decayed and non-decayed groups, as timm's
// param_groups_weight_decay does for ViTs.
#include <string>
#include <utility>
#include <vector>

#include "optim/optimizer.h"

namespace octet::optim {

// Two groups, both at `lr`: first the parameters that are not decayed (weight_decay 0), then the rest
// (weight_decay). Not decayed: tensors with at most one dim (LayerNorm weights, biases) and those whose
// name ends in pos_embed or cls_token (timm's VisionTransformer.no_weight_decay(), also when nested).
// Parameters that do not require grad are left out (frozen), and an empty group is dropped.
// `named` is what nn::Module::named_parameters() returns.
// (is_weight_decayed is the rule, for code that groups parameters itself: FSDP's flat parameters.)
std::vector<ParamGroup> weight_decay_groups(const std::vector<std::pair<std::string, Tensor>>& named,
                                            double lr, double weight_decay);

bool is_weight_decayed(const std::string& name, const Tensor& param);

}  // namespace octet::optim
