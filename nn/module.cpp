#include "nn/module.h"

#include <atomic>
#include <set>
#include <sstream>

#include "core/grad_mode.h"

namespace octet::nn {

namespace {

// Handles are unique across all modules, so removing one can never hit another module's hook.
std::atomic<size_t> next_hook_handle{1};

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// "a, b, c" for the first `limit` names, then how many more.
std::string list_names(const std::vector<std::string>& names, size_t limit = 12) {
  std::ostringstream os;
  for (size_t i = 0; i < names.size() && i < limit; ++i) os << (i ? ", " : "") << names[i];
  if (names.size() > limit) os << ", and " << names.size() - limit << " more";
  return os.str();
}

// Visits `module` and its descendants pre-order with their dotted paths, each module once.
void visit_modules(const Module& module, const std::string& prefix, std::set<const Module*>& seen,
                   const std::function<void(const std::string&, const Module&)>& fn) {
  if (!seen.insert(&module).second) return;
  fn(prefix, module);
  for (const auto& [name, child] : module.named_children()) {
    visit_modules(*child, join(prefix, name), seen, fn);
  }
}

}  // namespace

Tensor Module::forward(const Tensor&) {
  OCTET_FAIL(name_, ": forward() is not implemented; call the modules it holds, or override forward()");
}

Tensor Module::operator()(const Tensor& x) {
  Tensor input = x;
  // Iterate over copies: a hook may remove itself (FSDP's one-shot hooks do).
  const auto pre_hooks = pre_hooks_;
  for (const auto& [handle, hook] : pre_hooks) {
    Tensor replaced = hook(*this, input);
    if (replaced.defined()) input = std::move(replaced);
  }
  Tensor output = forward(input);
  const auto post_hooks = post_hooks_;
  for (const auto& [handle, hook] : post_hooks) {
    Tensor replaced = hook(*this, input, output);
    if (replaced.defined()) output = std::move(replaced);
  }
  return output;
}

// ---- what the module holds ---------------------------------------------------------------------------

std::vector<NamedTensor> Module::named_parameters(bool recurse) const {
  std::vector<NamedTensor> out;
  std::set<const TensorImpl*> seen_tensors;
  std::set<const Module*> seen_modules;
  auto collect = [&](const std::string& prefix, const Module& m) {
    for (const auto& [name, t] : m.parameters_) {
      if (seen_tensors.insert(t.impl()).second) out.emplace_back(join(prefix, name), t);
    }
  };
  if (recurse) {
    visit_modules(*this, "", seen_modules, collect);
  } else {
    collect("", *this);
  }
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<NamedTensor> Module::named_buffers(bool recurse) const {
  std::vector<NamedTensor> out;
  std::set<const TensorImpl*> seen_tensors;
  std::set<const Module*> seen_modules;
  auto collect = [&](const std::string& prefix, const Module& m) {
    for (const Buffer& b : m.buffers_) {
      if (seen_tensors.insert(b.tensor.impl()).second) out.emplace_back(join(prefix, b.name), b.tensor);
    }
  };
  if (recurse) {
    visit_modules(*this, "", seen_modules, collect);
  } else {
    collect("", *this);
  }
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  return children_;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() {
  // A module made with make_shared hands out a shared owner; one on the stack a non-owning pointer.
  std::shared_ptr<Module> self = weak_from_this().lock();
  if (!self) self = std::shared_ptr<Module>(std::shared_ptr<Module>(), this);
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out = {{"", self}};
  std::set<const Module*> seen = {this};
  using Walk = std::function<void(const std::string&, const Module&)>;
  Walk walk = [&](const std::string& prefix, const Module& m) {
    for (const auto& [name, child] : m.children_) {
      if (!seen.insert(child.get()).second) continue;
      out.emplace_back(join(prefix, name), child);
      walk(join(prefix, name), *child);
    }
  };
  walk("", *this);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t total = 0;
  for (const Tensor& p : parameters()) total += p.numel();
  return total;
}

void Module::for_each_tensor(const std::function<void(const Tensor&)>& fn) const {
  for (const auto& [name, t] : named_parameters()) fn(t);
  for (const auto& [name, t] : named_buffers()) fn(t);
}

// ---- mode, placement, gradients --------------------------------------------------------------------

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::to(Device device) {
  NoGradGuard no_grad;
  for_each_tensor([&](const Tensor& t) {
    t.set_data(t.detach().to(device));
    if (t.grad().defined()) Tensor(t).set_grad(t.grad().to(device));
  });
}

void Module::to(DType dtype) {
  OCTET_CHECK(is_floating(dtype), name_, ".to(", dtype_name(dtype),
              "): modules convert floating parameters and buffers; pass a floating dtype (f32, bf16, f64)");
  NoGradGuard no_grad;
  for_each_tensor([&](const Tensor& t) {
    if (!is_floating(t.dtype())) return;  // integer buffers (counters, indices) keep their type
    t.set_data(t.detach().to(dtype));
    if (t.grad().defined()) Tensor(t).set_grad(t.grad().to(dtype));
  });
}

void Module::zero_grad() {
  for (Tensor& p : parameters()) p.set_grad(Tensor());
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& [name, child] : children_) child->apply(fn);
  fn(*this);
}

// ---- hooks ------------------------------------------------------------------------------------------

size_t Module::register_forward_pre_hook(ForwardPreHook hook) {
  const size_t handle = next_hook_handle++;
  pre_hooks_.emplace_back(handle, std::move(hook));
  return handle;
}

size_t Module::register_forward_hook(ForwardHook hook) {
  const size_t handle = next_hook_handle++;
  post_hooks_.emplace_back(handle, std::move(hook));
  return handle;
}

void Module::remove_hook(size_t handle) {
  auto has_handle = [handle](const auto& entry) { return entry.first == handle; };
  const size_t removed = std::erase_if(pre_hooks_, has_handle) + std::erase_if(post_hooks_, has_handle);
  OCTET_CHECK(removed == 1, name_, ".remove_hook: no hook with handle ", handle,
              " on this module; it was removed already, or was registered on another module");
}

// ---- checkpoints ------------------------------------------------------------------------------------

StateDict Module::state_dict() const {
  StateDict out;
  for (const auto& [name, t] : named_parameters()) out.emplace(name, t.detach());
  std::set<const Module*> seen_modules;
  visit_modules(*this, "", seen_modules, [&](const std::string& prefix, const Module& m) {
    for (const Buffer& b : m.buffers_) {
      if (b.persistent) out.emplace(join(prefix, b.name), b.tensor.detach());
    }
  });
  return out;
}

Module::LoadResult Module::load_state_dict(const StateDict& state, bool strict) {
  const StateDict own = state_dict();
  LoadResult result;
  for (const auto& [key, target] : own) {
    auto it = state.find(key);
    if (it == state.end()) {
      result.missing.push_back(key);
      continue;
    }
    const Tensor& source = it->second;
    OCTET_CHECK(source.defined(), "load_state_dict: '", key,
                "' is an undefined tensor in the state dict; fill it, or remove the key and load with "
                "strict = false");
    OCTET_CHECK(source.shape() == target.shape(), "load_state_dict: '", key, "' has shape ", source.shape(),
                " in the state dict but ", target.shape(), " in ", name_,
                "; the checkpoint was saved from a different configuration: build the model with that "
                "configuration");
    OCTET_CHECK(source.dtype() == target.dtype(), "load_state_dict: '", key, "' is ",
                dtype_name(source.dtype()), " in the state dict but ", dtype_name(target.dtype()), " in ",
                name_, "; convert the checkpoint (tensor.to(", dtype_name(target.dtype()),
                ")) or the model (model.to(", dtype_name(source.dtype()), ")) first");
  }
  for (const auto& [key, source] : state) {
    if (!own.contains(key)) result.unexpected.push_back(key);
  }
  if (strict) {
    OCTET_CHECK(result.missing.empty() && result.unexpected.empty(),
                "load_state_dict: the state dict does not match ", name_, ": missing keys [",
                list_names(result.missing), "], unexpected keys [", list_names(result.unexpected),
                "]. Load a checkpoint of this model and configuration, rename its "
                "keys, or pass strict = false to load only the keys that match");
  }
  NoGradGuard no_grad;
  for (const auto& [key, target] : own) {
    auto it = state.find(key);
    if (it != state.end()) target.copy_(it->second);
  }
  return result;
}

// ---- registration -----------------------------------------------------------------------------------

void Module::check_new_name(const std::string& name, const char* what) const {
  OCTET_CHECK(!name.empty() && name.find('.') == std::string::npos, name_, ": cannot register ", what, " '",
              name, "'; names must be non-empty and contain no '.' (dots join the names of nested modules)");
  bool taken = false;
  for (const auto& [n, t] : parameters_) taken |= n == name;
  for (const Buffer& b : buffers_) taken |= b.name == name;
  for (const auto& [n, m] : children_) taken |= n == name;
  OCTET_CHECK(!taken, name_, ": cannot register ", what, " '", name,
              "'; a parameter, buffer or child of that name exists already. Pick another name");
}

Tensor& Module::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  check_new_name(name, "parameter");
  OCTET_CHECK(value.defined(), name_, ": parameter '", name,
              "' is undefined; register a tensor holding its values");
  // Registered parameters are leaves: a parameter computed by an op must not carry that op's graph.
  // A leaf is registered as itself, so that one tensor registered twice (a tied weight, under two
  // names or in two modules) is one parameter, listed once, whose gradient sums both uses; and the
  // caller's own handle is the parameter the optimizer steps.
  Tensor leaf = value.grad_fn() ? value.detach() : value;
  leaf.requires_grad_(requires_grad);
  parameters_.emplace_back(name, std::move(leaf));
  return parameters_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor value, bool persistent) {
  check_new_name(name, "buffer");
  OCTET_CHECK(value.defined(), name_, ": buffer '", name,
              "' is undefined; register a tensor holding its values");
  buffers_.push_back({name, value.detach(), persistent});
  return buffers_.back().tensor;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name, "module");
  OCTET_CHECK(module != nullptr, name_, ": child module '", name, "' is null; register a constructed module");
  children_.emplace_back(name, std::move(module));
}

// ---- ModuleList -------------------------------------------------------------------------------------

void ModuleList::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

const std::shared_ptr<Module>& ModuleList::operator[](size_t i) const {
  OCTET_CHECK(i < modules_.size(), "ModuleList: index ", i, " is out of range for a list of ",
              modules_.size(), " modules");
  return modules_[i];
}

}  // namespace octet::nn
