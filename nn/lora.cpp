#include "nn/lora.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "autograd/ops.h"
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

void check_options(const Linear& base, const LoRAOptions& options, const std::string& who) {
  const int64_t max_rank = std::min(base.in_features, base.out_features);
  OCTET_CHECK(options.rank >= 1 && options.rank <= max_rank, who, ": rank ", options.rank,
              " is out of range for Linear(", base.in_features, " -> ", base.out_features,
              "); it must be at least 1 and at most min(in, out) = ", max_rank,
              " (a larger rank adds parameters, not expressiveness)");
  OCTET_CHECK(options.alpha > 0 && std::isfinite(options.alpha), who, ": alpha must be positive and finite, got ",
              options.alpha, "; the update is scaled by alpha / rank (PEFT's default alpha is 8, 16 is common)");
  OCTET_CHECK(options.dropout >= 0 && options.dropout < 1, who, ": dropout must be in [0, 1), got ", options.dropout);
}

// The adapter of `base`: A uniform in ±1/sqrt(in) (PyTorch's Linear default, kaiming_uniform_ with
// a = sqrt(5)), drawn in f64 and rounded once, B zero; both in base's dtype, on base's device.
struct Adapter {
  std::shared_ptr<Linear> lora_A, lora_B;
  std::shared_ptr<Dropout> lora_dropout;
};

Adapter make_adapter(const Linear& base, const LoRAOptions& options) {
  Adapter adapter;
  {
    SkipInitGuard skip_init;  // A is drawn from options.generator below and B zeroed: defaults would be drawn in vain
    adapter.lora_A = std::make_shared<Linear>(base.in_features, options.rank, false);
    adapter.lora_B = std::make_shared<Linear>(options.rank, base.out_features, false);
  }
  adapter.lora_dropout = std::make_shared<Dropout>(options.dropout, options.generator);
  Generator& gen = options.generator != nullptr ? *options.generator : default_generator();
  const double bound = 1.0 / std::sqrt(static_cast<double>(base.in_features));
  uniform_(adapter.lora_A->weight, -bound, bound, gen);
  zeros_(adapter.lora_B->weight);
  for (const auto& linear : {adapter.lora_A, adapter.lora_B}) {
    linear->fp8_allowed = false;
    linear->to(base.weight.device());
    linear->to(base.weight.dtype());
  }
  return adapter;
}

void freeze(const Linear& base) {
  Tensor(base.weight).requires_grad_(false);
  if (base.bias.defined()) Tensor(base.bias).requires_grad_(false);
}

// (alpha / r)·lora_B(lora_A(lora_dropout(x))). The scale goes on the r-wide intermediate rather than
// the out-wide result: r multiplies per row, not out.
Tensor low_rank_update(Linear& lora_A, Linear& lora_B, Dropout& lora_dropout, double scaling, const Tensor& x) {
  return lora_B(lora_A(lora_dropout(x)) * scaling);
}

}  // namespace

LoRALinear::LoRALinear(std::shared_ptr<Linear> base, const LoRAOptions& options)
    : Module("LoRALinear"),
      rank(options.rank),
      alpha(options.alpha),
      scaling(options.alpha / static_cast<double>(options.rank)) {
  OCTET_CHECK(base != nullptr, "LoRALinear: the base Linear is null; pass the constructed Linear to adapt");
  check_options(*base, options, "LoRALinear");
  Adapter adapter = make_adapter(*base, options);
  freeze(*base);
  base_layer = register_module("base_layer", std::move(base));
  lora_A = register_module("lora_A", std::move(adapter.lora_A));
  lora_B = register_module("lora_B", std::move(adapter.lora_B));
  lora_dropout = register_module("lora_dropout", std::move(adapter.lora_dropout));
}

Tensor LoRALinear::forward(const Tensor& x) {
  return (*base_layer)(x) + low_rank_update(*lora_A, *lora_B, *lora_dropout, scaling, x);
}

LoRAFilter lora_targets(std::vector<std::string> names) {
  return [names = std::move(names)](const std::string& name, const Linear&) {
    const std::string last = name.substr(name.rfind('.') + 1);  // npos + 1 == 0: the whole name
    return std::find(names.begin(), names.end(), last) != names.end();
  };
}

std::vector<std::string> apply_lora(Module& root, const LoRAOptions& options, const LoRAFilter& filter,
                                    const std::vector<std::string>& trainable_suffixes) {
  OCTET_CHECK(filter != nullptr, "apply_lora: the filter is empty; pass one, e.g. lora_targets({\"qkv\", \"fc1\"})");
  check_suffixes_match(root.named_parameters(), trainable_suffixes, "apply_lora");
  // Pick every target and check it before changing anything, so an error leaves the model as it was.
  std::vector<std::pair<std::string, std::shared_ptr<Linear>>> targets;
  std::vector<std::string> linear_names;
  for (const auto& [name, module] : root.named_modules()) {
    auto linear = std::dynamic_pointer_cast<Linear>(module);
    const std::string last = name.substr(name.rfind('.') + 1);
    if (linear == nullptr || last == "lora_A" || last == "lora_B") continue;  // adapters are never adapted
    linear_names.push_back(name.empty() ? "(the root)" : name);
    if (!filter(name, *linear)) continue;
    const std::string who = "apply_lora: '" + name + "'";
    for (const auto& [child_name, child] : linear->named_children()) {
      OCTET_CHECK(child_name != "lora_A", who, " has a LoRA adapter already; apply_lora once per model, or "
                  "narrow the filter");
    }
    check_options(*linear, options, who);
    targets.emplace_back(name, linear);
  }
  OCTET_CHECK(!targets.empty(), "apply_lora: the filter picked no Linear of ", root.name(), "; its Linears are [",
              list_names(linear_names, 12), "]");

  const double scaling = options.alpha / static_cast<double>(options.rank);
  std::vector<std::string> adapted;
  for (auto& [name, linear] : targets) {
    Adapter adapter = make_adapter(*linear, options);
    linear->register_module("lora_A", adapter.lora_A);
    linear->register_module("lora_B", adapter.lora_B);
    linear->register_module("lora_dropout", adapter.lora_dropout);
    // The Linear owns its adapter; the hook holds the adapter, never the Linear, so nothing cycles.
    linear->register_forward_hook(
        [adapter, scaling](Module&, const Tensor& input, const Tensor& output) {
          return output + low_rank_update(*adapter.lora_A, *adapter.lora_B, *adapter.lora_dropout, scaling, input);
        });
    adapted.push_back(name);
  }
  mark_only_lora_as_trainable(root, trainable_suffixes);
  return adapted;
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
