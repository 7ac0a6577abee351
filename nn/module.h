#pragma once
// Module: the building block of networks, as in PyTorch. A module owns named parameters (tensors
// that require grad), named buffers (state that is not trained) and named child modules; names
// join into dotted paths ("blocks.0.norm1.weight") in registration order, a module's own tensors
// before its children's. Calling a module runs its forward pre-hooks, forward(), then its forward
// hooks: the seam DDP and FSDP use to gather parameters before a layer runs.
//
//   class Affine : public nn::Module {
//    public:
//     Affine(int64_t n) : Module("Affine") {
//       scale = register_parameter("scale", ones({n}));
//       shift = register_parameter("shift", zeros({n}));
//     }
//     Tensor forward(const Tensor& x) override { return x * scale + shift; }
//     Tensor scale, shift;   // handles sharing the registered tensors
//   };
//
// Layers keep handles (Tensor copies) to what they register. to(Device) and to(DType) retarget the
// registered tensors in place with Tensor::set_data, so those handles, and any optimizer holding
// the parameters, see the moved data.
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace octet::nn {

using NamedTensor = std::pair<std::string, Tensor>;
using StateDict = std::map<std::string, Tensor>;

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string name) : name_(std::move(name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The computation. The default throws: a module that is only a container has no forward.
  virtual Tensor forward(const Tensor& x);
  // Pre-hooks, forward(), post-hooks. Call modules through this, not forward(), so hooks run.
  Tensor operator()(const Tensor& x);

  // ---- what the module holds ---------------------------------------------------------------------
  // Registration order, dotted names, each tensor once even if registered under two names.
  std::vector<NamedTensor> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<NamedTensor> named_buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // This module (named "") and every descendant, pre-order, each once.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules();
  int64_t num_parameters() const;
  const std::string& name() const { return name_; }  // the type name, e.g. "Linear"
  // Adds a child module under `name` (no '.', not taken). Public, as PyTorch's register_module and
  // add_module are, so that code outside a module can extend it: apply_lora (nn/lora.h) hangs adapters
  // under the Linears of a model already built.
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // ---- mode, placement, gradients ------------------------------------------------------------------
  void train(bool on = true);  // this module and every descendant
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Parameters, buffers and their grads, converted in place (floating tensors only for a dtype).
  void to(Device device);
  void to(DType dtype);
  void zero_grad();  // grads set to undefined, as PyTorch's zero_grad(set_to_none=True)
  // fn on every descendant, then on this module (PyTorch's order: children initialise first).
  void apply(const std::function<void(Module&)>& fn);

  // ---- hooks ------------------------------------------------------------------------------------
  // A pre-hook returns the input forward() should see; an undefined Tensor keeps the input.
  // A forward hook returns the output the caller gets; an undefined Tensor keeps the output.
  // Hooks run in registration order. The returned handle removes the hook.
  using ForwardPreHook = std::function<Tensor(Module&, const Tensor& input)>;
  using ForwardHook = std::function<Tensor(Module&, const Tensor& input, const Tensor& output)>;
  size_t register_forward_pre_hook(ForwardPreHook hook);
  size_t register_forward_hook(ForwardHook hook);
  void remove_hook(size_t handle);
  // Whether this module (not counting its children) has a forward pre-hook or forward hook. A module
  // that can also run fused with its caller's work (LayerNorm::add_forward) runs unfused when it has
  // one, so that every hook sees the input and output it would see from operator().
  bool has_forward_hooks() const { return !pre_hooks_.empty() || !post_hooks_.empty(); }

  // ---- checkpoints ------------------------------------------------------------------------------
  // Parameters and persistent buffers by dotted name, detached (sharing storage, not copies).
  StateDict state_dict() const;
  struct LoadResult {
    std::vector<std::string> missing, unexpected;
  };
  // Copies values into the registered tensors (which keep their device). Every check runs before
  // anything is written: a shape or dtype mismatch always throws; missing or unexpected keys throw
  // when strict, and are returned otherwise.
  LoadResult load_state_dict(const StateDict& state, bool strict = true);

 protected:
  // `value` becomes a leaf parameter: itself when it is a leaf (a tensor registered twice, a tied
  // weight, is then one parameter), else a detached handle to its data. The reference stays valid for
  // the module's lifetime; layers usually keep a handle copy: `weight = register_parameter(...)`.
  Tensor& register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  // Non-persistent buffers are left out of state_dict().
  Tensor& register_buffer(const std::string& name, Tensor value, bool persistent = true);

 private:
  struct Buffer {
    std::string name;
    Tensor tensor;
    bool persistent;
  };
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name, const char* what) const;
  // Every registered tensor (parameters, buffers) of this module and its descendants, each once.
  void for_each_tensor(const std::function<void(const Tensor&)>& fn) const;

  std::string name_;
  bool training_ = true;
  std::deque<NamedTensor> parameters_;  // a deque so that references returned by register_* stay valid
  std::deque<Buffer> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<std::pair<size_t, ForwardPreHook>> pre_hooks_;
  std::vector<std::pair<size_t, ForwardHook>> post_hooks_;
};

// A list of modules named "0", "1", ... (timm's `blocks`). It has no forward of its own.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return modules_.size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace octet::nn
