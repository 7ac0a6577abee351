#include "nn/lora.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "autograd/ops.h"
#include "core/grad_mode.h"
#include "nn/init.h"

namespace octet::nn {

namespace {

bool ends_with_at_boundary(const std::string& name, const std::string& suffix) {
  if (name == suffix) return true;
  return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
         name[name.size() - suffix.size() - 1] == '.';
}

bool matches_any(const std::string& name, const std::vector<std::string>& suffixes) {
  return std::any_of(suffixes.begin(), suffixes.end(),
                     [&](const std::string& s) { return ends_with_at_boundary(name, s); });
}

// "a, b, c" for the first few names, then how many more.
std::string list_names(const std::vector<std::string>& names, size_t limit = 8) {
  std::ostringstream os;
  for (size_t i = 0; i < names.size() && i < limit; ++i) os << (i ? ", " : "") << names[i];
  if (names.size() > limit) os << ", and " << names.size() - limit << " more";
  return os.str();
}

// Every suffix must name at least one parameter of `root`; `caller` heads the error.
void check_suffixes_match(const std::vector<NamedTensor>& params, const std::vector<std::string>& suffixes,
                          const char* caller) {
  for (const std::string& suffix : suffixes) {
    const bool found = std::any_of(params.begin(), params.end(),
                                   [&](const NamedTensor& p) { return ends_with_at_boundary(p.first, suffix); });
    if (found) continue;
    std::vector<std::string> names;
    for (const auto& p : params) names.push_back(p.first);
    OCTET_FAIL(caller, ": no parameter name ends in '", suffix, "'; the parameters are [", list_names(names, 12),
               "]. Name a parameter by its dotted name or a tail of it (\"head.weight\")");
  }
}

}  // namespace

LoRALinear::LoRALinear(std::shared_ptr<Linear> base, const LoRAOptions& options)
    : Module("LoRALinear"),
      rank(options.rank),
      alpha(options.alpha),
      scaling(options.alpha / static_cast<double>(options.rank)) {
  OCTET_CHECK(base != nullptr, "LoRALinear: the base Linear is null; pass the constructed Linear to adapt");
  OCTET_CHECK(rank >= 1 && rank <= std::min(base->in_features, base->out_features), "LoRALinear: rank ", rank,
              " is out of range for Linear(", base->in_features, " -> ", base->out_features,
              "); it must be at least 1 and at most min(in, out) = ",
              std::min(base->in_features, base->out_features), " (a larger rank adds parameters, not expressiveness)");
  OCTET_CHECK(alpha > 0 && std::isfinite(alpha), "LoRALinear: alpha must be positive and finite, got ", alpha,
              "; the update is scaled by alpha / rank (PEFT's default alpha is 8, 16 is common)");
  OCTET_CHECK(options.dropout >= 0 && options.dropout < 1, "LoRALinear: dropout must be in [0, 1), got ",
              options.dropout);
  Generator& gen = options.generator != nullptr ? *options.generator : default_generator();
  base_layer = register_module("base_layer", std::move(base));
  {
    SkipInitGuard skip_init;  // A is initialised below from `gen`, B is zeroed: the defaults would be drawn in vain
    lora_A = register_module("lora_A", std::make_shared<Linear>(base_layer->in_features, rank, false));
    lora_B = register_module("lora_B", std::make_shared<Linear>(rank, base_layer->out_features, false));
  }
  lora_dropout = register_module("lora_dropout", std::make_shared<Dropout>(options.dropout, options.generator));
  lora_A->fp8_allowed = false;
  lora_B->fp8_allowed = false;
  // A with PyTorch's Linear default, kaiming_uniform_(a = sqrt(5)): uniform in ±1/sqrt(in), drawn in
  // f64 and rounded once; B zero, so the update starts at exactly zero.
  const double bound = 1.0 / std::sqrt(static_cast<double>(base_layer->in_features));
  uniform_(lora_A->weight, -bound, bound, gen);
  zeros_(lora_B->weight);
  for (const auto& adapter : {lora_A, lora_B}) {
    adapter->to(base_layer->weight.device());
    adapter->to(base_layer->weight.dtype());
  }
  base_layer->weight.requires_grad_(false);
  if (base_layer->bias.defined()) base_layer->bias.requires_grad_(false);
}

Tensor LoRALinear::forward(const Tensor& x) {
  // The scale goes on the r-wide intermediate rather than the out-wide result: r multiplies, not out.
  return (*base_layer)(x) + (*lora_B)((*lora_A)((*lora_dropout)(x)) * scaling);
}

bool is_lora_parameter_name(const std::string& name) {
  return ends_with_at_boundary(name, "lora_A.weight") || ends_with_at_boundary(name, "lora_B.weight");
}

void mark_only_lora_as_trainable(Module& root, const std::vector<std::string>& trainable_suffixes) {
  const std::vector<NamedTensor> params = root.named_parameters();
  check_suffixes_match(params, trainable_suffixes, "mark_only_lora_as_trainable");
  for (const auto& [name, p] : params) {
    Tensor(p).requires_grad_(is_lora_parameter_name(name) || matches_any(name, trainable_suffixes));
  }
}

StateDict lora_state_dict(const Module& root, const std::vector<std::string>& extra_suffixes) {
  const std::vector<NamedTensor> params = root.named_parameters();
  check_suffixes_match(params, extra_suffixes, "lora_state_dict");
  StateDict out;
  bool has_adapter = false;
  for (const auto& [name, p] : params) {
    const bool adapter = is_lora_parameter_name(name);
    has_adapter |= adapter;
    if (adapter || matches_any(name, extra_suffixes)) out.emplace(name, p.detach());
  }
  OCTET_CHECK(has_adapter, "lora_state_dict: ", root.name(),
              " holds no LoRA adapter (no parameter named *.lora_A.weight or *.lora_B.weight); adapt it first "
              "(apply_lora, or LoRALinear layers)");
  return out;
}

void load_lora_state_dict(Module& root, const StateDict& state, const std::vector<std::string>& extra_suffixes) {
  const StateDict expected = lora_state_dict(root, extra_suffixes);
  std::vector<std::string> missing, unexpected;
  for (const auto& [key, t] : expected) {
    if (!state.contains(key)) missing.push_back(key);
  }
  for (const auto& [key, t] : state) {
    if (!expected.contains(key)) unexpected.push_back(key);
  }
  OCTET_CHECK(missing.empty() && unexpected.empty(), "load_lora_state_dict: the adapter state does not match ",
              root.name(), ": missing keys [", list_names(missing), "], unexpected keys [", list_names(unexpected),
              "]. Adapt the model as it was when saved (the same target layers), and pass the same extra "
              "suffixes (", list_names(extra_suffixes), ") as lora_state_dict");
  // Keys now match; Module::load_state_dict checks shapes (a different rank) and dtypes before it
  // writes anything, and leaves the frozen base, absent from `state`, as it is.
  root.load_state_dict(state, /*strict=*/false);
}

}  // namespace octet::nn
