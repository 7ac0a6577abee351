#include "optim/optimizer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <sstream>
#include <string_view>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/optimizers.h"
#include "kernels/reduce.h"

namespace octet::optim {
namespace {

// "[3, 5]": the group sizes, for layout mismatch errors.
std::string sizes_str(const std::vector<size_t>& sizes) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < sizes.size(); ++i) os << (i ? ", " : "") << sizes[i];
  os << "]";
  return os.str();
}

std::vector<std::string_view> split_dots(std::string_view key) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) return parts;
    start = dot + 1;
  }
}

bool parse_index(std::string_view s, size_t* out) {
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

Tensor scalar_tensor(double value, DType dtype) { return full(Shape{}, value, dtype); }

bool is_scalar_of(const Tensor& t, DType dtype) {
  return t.defined() && t.dtype() == dtype && t.numel() == 1;
}

}  // namespace

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups, double lr, double weight_decay)
    : name_(std::move(name)), groups_(std::move(groups)) {
  check_hyperparameter("lr", lr, lr >= 0, "finite and >= 0");
  check_hyperparameter("weight_decay", weight_decay, weight_decay >= 0, "finite and >= 0");
  std::set<const TensorImpl*> seen;
  size_t total = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    ParamGroup& group = groups_[g];
    // A group's lr relative to the optimizer's, which set_lr keeps: 1 for a group that inherits it
    // (and for every group of an optimizer built with lr 0, where no ratio exists).
    lr_scales_.push_back(std::isnan(group.lr) || lr == 0 ? 1.0 : group.lr / lr);
    if (std::isnan(group.lr)) group.lr = lr;
    if (std::isnan(group.weight_decay)) group.weight_decay = weight_decay;
    check_hyperparameter("a group's lr", group.lr, group.lr >= 0, "finite and >= 0");
    check_hyperparameter("a group's weight_decay", group.weight_decay, group.weight_decay >= 0,
                         "finite and >= 0");
    for (size_t i = 0; i < group.params.size(); ++i) {
      const Tensor& p = group.params[i];
      OCTET_CHECK(p.defined(), name_, ": parameter ", i, " of group ", g,
                  " is undefined; pass the model's tensors");
      OCTET_CHECK(
          p.is_leaf(), name_, ": parameter ", i, " of group ", g, " (", p.describe(),
          ") is not a leaf but the result of an operation, so updating it would not change the model; "
          "optimize the leaf tensors (model.parameters())");
      OCTET_CHECK(is_floating(p.dtype()) && !is_fp8(p.dtype()), name_, ": parameter ", i, " of group ", g,
                  " is ", p.describe(),
                  "; optimizers update f32, f64, bf16 or f16 parameters (the last two through f32 master "
                  "weights); FP8 is a compute format, keep the parameter in bf16 or f32");
      OCTET_CHECK(seen.insert(p.impl()).second, name_, ": parameter ", i, " of group ", g, " (", p.describe(),
                  ") appears more than once; give each tensor to exactly one group");
    }
    total += group.params.size();
    state_.emplace_back(group.params.size());
  }
  OCTET_CHECK(total > 0, name_,
              ": got no parameters to optimize; pass model.parameters() or weight_decay_groups(...)");
}

void Optimizer::check_hyperparameter(const char* what, double value, bool ok, const char* expected) const {
  OCTET_CHECK(std::isfinite(value) && ok, name_, ": ", what, " must be ", expected, ", got ", value);
}

void Optimizer::zero_grad() {
  for (ParamGroup& group : groups_) {
    for (Tensor& p : group.params) p.set_grad(Tensor());
  }
}

void Optimizer::set_lr(double lr) {
  check_hyperparameter("lr", lr, lr >= 0, "finite and >= 0");
  check_groups_unchanged("set_lr");
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].lr = lr * lr_scales_[g];
}

int64_t Optimizer::step_count(size_t group, size_t index) const {
  OCTET_CHECK(group < state_.size() && index < state_[group].size(), name_,
              ".step_count: there is no parameter ", index, " in group ", group);
  return state_[group][index].step;
}

void Optimizer::check_groups_unchanged(const char* op) const {
  OCTET_CHECK(groups_.size() == state_.size(), name_, ".", op, ": param_groups() went from ", state_.size(),
              " to ", groups_.size(), " groups; build a new optimizer to optimize other tensors");
  for (size_t g = 0; g < groups_.size(); ++g) {
    OCTET_CHECK(groups_[g].params.size() == state_[g].size(), name_, ".", op, ": group ", g, " went from ",
                state_[g].size(), " to ", groups_[g].params.size(),
                " parameters; build a new optimizer to optimize other tensors");
  }
}

DType Optimizer::state_dtype(const Tensor& param) {
  return param.dtype() == DType::f64 ? DType::f64 : DType::f32;
}

bool Optimizer::needs_master(const Tensor& param) {
  return param.dtype() != DType::f32 && param.dtype() != DType::f64;
}

std::vector<Optimizer::ParamToUpdate> Optimizer::params_with_grad(size_t group) {
  check_groups_unchanged("step");
  std::vector<ParamToUpdate> out;
  const ParamGroup& g = groups_[group];
  // The first step in low precision (or the first after Module::to(bf16)): each master starts as
  // its parameter's exact value, widened. All of a device's masters are made by one multi-tensor
  // call (one launch on a GPU rather than one conversion per parameter), and enter the state only
  // once it has succeeded.
  struct NewMasters {
    Device device;
    std::vector<size_t> index;  // into the group's params
    std::vector<Tensor> sources, masters;
  };
  std::vector<NewMasters> new_masters;  // one per device, almost always one
  for (size_t i = 0; i < g.params.size(); ++i) {
    const Tensor& p = g.params[i];
    if (!p.grad().defined() || !needs_master(p) || state_[group][i].buffers.count("master") != 0) continue;
    auto on_device = std::find_if(new_masters.begin(), new_masters.end(),
                                  [&](const NewMasters& m) { return m.device == p.device(); });
    if (on_device == new_masters.end()) on_device = new_masters.insert(on_device, NewMasters{p.device(), {}, {}, {}});
    on_device->index.push_back(i);
    on_device->sources.push_back(p.detach());
    on_device->masters.push_back(empty(p.shape(), DType::f32, p.device()));
  }
  for (const NewMasters& m : new_masters) kernels::widen_to_f32_multi_(m.sources, m.masters);
  for (const NewMasters& m : new_masters) {
    for (size_t k = 0; k < m.index.size(); ++k) {
      ParamState& s = state_[group][m.index[k]];
      s.buffers["master"] = m.masters[k];
      s.agree_with(m.sources[k]);
    }
  }
  // A parameter written by someone else since the last step (its version moved): where its bytes are
  // no longer its master's rounding, the master is taken again from it. Loading the same bytes (a
  // checkpoint's model after its optimizer state) keeps the master and its extra bits.
  for (size_t i = 0; i < g.params.size(); ++i) {
    const Tensor& p = g.params[i];
    ParamState& s = state_[group][i];
    const auto master = s.buffers.find("master");
    if (!p.grad().defined() || master == s.buffers.end()) continue;
    if (s.agrees_with(p)) continue;
    if (master->second.shape() == p.shape() && master->second.device() == p.device()) {
      // Σ |round(master) - p| is 0 only where every element agrees; a NaN or an inf on either side
      // makes it NaN or inf, which counts as a change.
      const Tensor rounded = master->second.to(p.dtype());
      const bool same = kernels::sum(kernels::abs(kernels::sub(rounded.to(DType::f32), p.detach().to(DType::f32))))
                            .item() == 0.0;
      if (!same) kernels::widen_to_f32_multi_({p.detach()}, {master->second});
    }
    s.agree_with(p);
  }
  for (size_t i = 0; i < g.params.size(); ++i) {
    const Tensor& p = g.params[i];
    if (!p.grad().defined()) continue;
    ParamState& s = state_[group][i];
    OCTET_CHECK(needs_master(p) || s.buffers.count("master") == 0, name_, ".step: parameter ", i, " of group ",
                group, " is ", p.describe(), " but was trained through an f32 master copy, which converting the "
                "model back discarded; keep the model in the dtype it was optimized in, or build a new optimizer");
    out.push_back({p, &s});
  }
  return out;
}

void Optimizer::finish_step(const std::vector<ParamToUpdate>& updated) {
  for (const ParamToUpdate& u : updated) {
    ++u.state->step;
    u.state->agree_with(u.param);
  }
}

std::map<std::string, Tensor> Optimizer::state_dict() const {
  check_groups_unchanged("state_dict");
  std::map<std::string, Tensor> out;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string group_prefix = "param_groups." + std::to_string(g) + ".";
    out[group_prefix + "lr"] = scalar_tensor(groups_[g].lr, DType::f64);
    out[group_prefix + "weight_decay"] = scalar_tensor(groups_[g].weight_decay, DType::f64);
    out[group_prefix + "num_params"] =
        scalar_tensor(static_cast<double>(groups_[g].params.size()), DType::i64);
    for (size_t i = 0; i < state_[g].size(); ++i) {
      const ParamState& s = state_[g][i];
      if (s.step == 0) continue;
      const std::string prefix = "state." + std::to_string(g) + "." + std::to_string(i) + ".";
      out[prefix + "step"] = scalar_tensor(static_cast<double>(s.step), DType::i64);
      for (const auto& [buffer, t] : s.buffers) out[prefix + buffer] = t.detach();
    }
  }
  return out;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& dict) {
  check_groups_unchanged("load_state_dict");
  const std::string op = name_ + ".load_state_dict";
  const std::string same_groups =
      "; build the optimizer over the same parameter groups, in the same order, as the one that saved "
      "this state";

  // The group layout first: everything else is indexed by it.
  std::vector<size_t> saved_sizes;
  while (true) {
    const auto it = dict.find("param_groups." + std::to_string(saved_sizes.size()) + ".num_params");
    if (it == dict.end()) break;
    OCTET_CHECK(is_scalar_of(it->second, DType::i64) && it->second.item() >= 0, op, ": ", it->first,
                " must be a non-negative i64 scalar, got ", it->second.describe());
    saved_sizes.push_back(static_cast<size_t>(it->second.item<int64_t>()));
  }
  std::vector<size_t> sizes;
  for (const ParamGroup& group : groups_) sizes.push_back(group.params.size());
  OCTET_CHECK(saved_sizes == sizes, op, ": the saved state has ", saved_sizes.size(),
              " parameter groups of sizes ", sizes_str(saved_sizes), ", this optimizer has ", sizes.size(),
              " of sizes ", sizes_str(sizes), same_groups);

  // Validate every key into a new state; nothing changes until all of it checks out.
  const std::vector<std::string> buffer_names = state_buffer_names();
  std::string expected_names = "step";
  for (const std::string& b : buffer_names) expected_names += ", " + b;
  std::vector<double> lrs(groups_.size(), ParamGroup::kInherit), wds(groups_.size(), ParamGroup::kInherit);
  std::vector<std::vector<ParamState>> state(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) state[g].resize(groups_[g].params.size());

  for (const auto& [key, value] : dict) {
    const std::vector<std::string_view> parts = split_dots(key);
    size_t g = 0, i = 0;
    if (parts.size() == 3 && parts[0] == "param_groups" && parse_index(parts[1], &g) && g < groups_.size()) {
      if (parts[2] == "num_params") continue;  // checked above
      OCTET_CHECK(parts[2] == "lr" || parts[2] == "weight_decay", op, ": unexpected key '", key,
                  "'; a group holds lr, weight_decay and num_params");
      OCTET_CHECK(is_scalar_of(value, DType::f64), op, ": ", key, " must be an f64 scalar, got ",
                  value.describe());
      const double v = value.item();
      OCTET_CHECK(std::isfinite(v) && v >= 0, op, ": ", key, " must be finite and >= 0, got ", v);
      (parts[2] == "lr" ? lrs : wds)[g] = v;
      continue;
    }
    OCTET_CHECK(parts.size() == 4 && parts[0] == "state" && parse_index(parts[1], &g) &&
                    parse_index(parts[2], &i) && g < groups_.size() && i < groups_[g].params.size(),
                op, ": unexpected key '", key, "'; keys are param_groups.<g>.<field> and ",
                "state.<g>.<i>.<name> for the groups and parameters of this optimizer", same_groups);
    const Tensor& p = groups_[g].params[i];
    const std::string buffer(parts[3]);
    if (buffer == "step") {
      OCTET_CHECK(is_scalar_of(value, DType::i64) && value.item() >= 1, op, ": ", key,
                  " must be an i64 scalar >= 1, got ", value.describe());
      state[g][i].step = value.item<int64_t>();
      continue;
    }
    if (buffer == "master") {
      OCTET_CHECK(needs_master(p), op, ": ", key, " is an f32 master copy but its parameter is ", p.describe(),
                  ", which needs none; convert the model to the dtype it was saved in (--precision) before "
                  "loading");
    } else {
      OCTET_CHECK(std::find(buffer_names.begin(), buffer_names.end(), buffer) != buffer_names.end(), op,
                  ": unexpected key '", key, "'; ", name_, " state holds ", expected_names,
                  " (was it saved by another optimizer, or with other settings such as momentum?)");
    }
    const DType dtype = state_dtype(p);
    OCTET_CHECK(value.defined() && value.shape() == p.shape() && value.dtype() == dtype, op, ": ", key, " is ",
                value.defined() ? value.describe() : std::string("undefined"), " but its parameter is ",
                p.describe(), ", whose state is ", dtype_name(dtype), same_groups);
    Tensor copy = empty(p.shape(), dtype, p.device());
    copy.copy_(value);
    state[g][i].buffers[buffer] = copy;
  }

  for (size_t g = 0; g < groups_.size(); ++g) {
    OCTET_CHECK(!std::isnan(lrs[g]) && !std::isnan(wds[g]), op, ": param_groups.", g,
                ".lr or .weight_decay is missing; pass the whole dict that state_dict() returned");
    for (size_t i = 0; i < state[g].size(); ++i) {
      const ParamState& s = state[g][i];
      const std::string prefix = "state." + std::to_string(g) + "." + std::to_string(i) + ".";
      if (s.step == 0) {
        OCTET_CHECK(s.buffers.empty(), op, ": ", prefix,
                    "step is missing while its state tensors are present; pass the whole dict that "
                    "state_dict() returned");
        continue;
      }
      for (const std::string& b : buffer_names) {
        OCTET_CHECK(s.buffers.count(b), op, ": ", prefix, b, " is missing (", name_, " state holds ",
                    expected_names,
                    "); was the state saved by another optimizer, or with other settings such as momentum?");
      }
      OCTET_CHECK(!needs_master(groups_[g].params[i]) || s.buffers.count("master"), op, ": ", prefix,
                  "master is missing for ", groups_[g].params[i].describe(),
                  "; the state was saved while the parameter was f32, resume with the precision the "
                  "checkpoint was written with");
    }
  }

  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].lr = lrs[g];
    groups_[g].weight_decay = wds[g];
    // The loaded masters and the parameters as they are now: a model loaded after this state (or
    // written after it) is compared with the masters at the next step.
    for (size_t i = 0; i < state[g].size(); ++i) state[g][i].agree_with(groups_[g].params[i]);
  }
  state_ = std::move(state);
}

}  // namespace octet::optim
