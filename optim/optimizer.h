#pragma once
// The optimizer interface shared by SGD and AdamW: parameter groups with their own lr and weight
// decay, per-parameter state, zero_grad, and a state dict for checkpoints. Names and semantics
// follow torch.optim so that a PyTorch training loop reads the same here:
//
//   optim::AdamW opt(optim::weight_decay_groups(model.named_parameters(), lr, 0.05), lr);
//   for (int64_t step = 0; step < total; ++step) {
//     opt.zero_grad();
//     loss(model, batch).backward();
//     optim::clip_grad_norm_(model.parameters(), 1.0);
//     opt.set_lr(schedule.lr(step));
//     opt.step();
//   }
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace octet::optim {

// Parameters that share hyperparameters. An lr or weight_decay left at kInherit takes the value the
// optimizer was constructed with (PyTorch's per-group defaults); after construction every group
// holds real numbers, which may be changed between steps.
struct ParamGroup {
  static constexpr double kInherit = std::numeric_limits<double>::quiet_NaN();
  std::vector<Tensor> params;
  double lr = kInherit;
  double weight_decay = kInherit;
};

// Low-precision parameters (bf16 or f16, after Module::to(DType::bf16)) are trained through f32
// master weights, as apex's O2 and llm.c do: the optimizer updates its f32 master copy and writes the
// rounded value back into the parameter in the same pass, so rounding errors never accumulate in the
// weights. The master copies and the f32 optimizer state are in state_dict(), so a bf16 run resumes
// bitwise. A parameter written by anyone else between steps (new weights loaded into the model, a
// head re-initialised, a clamp) keeps that value, as in PyTorch: the next step sees that the
// parameter's storage version moved and, where its bytes are no longer the master's rounding, takes
// the master again from the parameter (the master's extra bits are then gone, as they must be).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient. Parameters whose grad is undefined are
  // skipped and their state does not advance (as in PyTorch).
  virtual void step() = 0;

  // Sets every parameter's grad to undefined (PyTorch's set_to_none): the next backward writes fresh
  // gradients instead of adding to old ones, and a parameter it does not reach is skipped by step().
  void zero_grad();

  // The groups' lr and weight_decay may be changed between steps. Which tensors are optimized may
  // not: build a new optimizer for that (step() checks).
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // The optimizer's lr, as a schedule gives it: a group that inherited the constructor's lr takes lr,
  // and a group given its own keeps its ratio to the constructor's (a head at 10x stays at 10x), as
  // PyTorch's schedulers scale each group's initial lr. (An optimizer built with lr 0 has no ratio
  // to keep: every group then takes lr.)
  void set_lr(double lr);

  // Everything needed to resume bitwise: per group "param_groups.<g>.lr", ".weight_decay" (f64 [])
  // and ".num_params" (i64 []); per stepped parameter "state.<g>.<i>.step" (i64 [], updates so far)
  // and its state tensors, e.g. "state.<g>.<i>.exp_avg" (the parameter's shape, in its state dtype),
  // plus "state.<g>.<i>.master" for a low-precision parameter. g and i index param_groups() and the
  // group's params. The tensors share storage with the optimizer's state: write them out (or clone
  // them) before the next step().
  virtual std::map<std::string, Tensor> state_dict() const;
  // Copies a state_dict() in, restoring the groups' lr and weight_decay. The optimizer must have the
  // same groups of parameters with the same shapes and dtypes, and the same kind of state (a master
  // copy for each low-precision parameter); anything else throws naming the key and the fix, before
  // anything is changed.
  virtual void load_state_dict(const std::map<std::string, Tensor>& state);

  const std::string& name() const { return name_; }  // "SGD", "AdamW"
  // The dtype of a parameter's master weights and optimizer state: f64 for f64 parameters, else f32.
  static DType state_dtype(const Tensor& param);
  // Whether `param` is trained through an f32 master copy (any floating dtype but f32 and f64).
  static bool needs_master(const Tensor& param);
  // Updates made so far to param_groups()[group].params[index]; 0 before its first step.
  int64_t step_count(size_t group, size_t index) const;

 protected:
  // Checks every group (at least one parameter overall; each one a defined floating leaf, none
  // repeated) and fills lr and weight_decay left at kInherit. `name` prefixes every error.
  Optimizer(std::string name, std::vector<ParamGroup> groups, double lr, double weight_decay);

  struct ParamState {
    int64_t step = 0;                       // updates made so far
    std::map<std::string, Tensor> buffers;  // the parameter's shape in state_dtype(), on its device
    // With a master: the parameter's storage version when the master and the parameter last agreed
    // (after this optimizer wrote it, or loaded or checked the master), to see writes by others.
    uint64_t param_version = 0;
    const Storage* param_storage = nullptr;  // and its storage then (a re-pointed parameter is a write)
    void agree_with(const Tensor& p) {
      param_version = p.version();
      param_storage = p.storage().get();
    }
    bool agrees_with(const Tensor& p) const {
      return p.version() == param_version && p.storage().get() == param_storage;
    }
  };
  // The buffers each stepped parameter holds besides its master copy, e.g. {"exp_avg", "exp_avg_sq"}.
  virtual std::vector<std::string> state_buffer_names() const = 0;

  // One parameter to update and its state. When the parameter is not f32 or f64 (bf16, say),
  // state->buffers["master"] holds its f32 master weights, created from the parameter on its first
  // step, and the optimizer state is f32 too.
  struct ParamToUpdate {
    Tensor param;
    ParamState* state;
  };
  // The parameters of group g whose grad is defined, in order, with their masters created. Throws
  // when the groups changed since construction (build a new optimizer for other tensors).
  std::vector<ParamToUpdate> params_with_grad(size_t group);
  // After the update kernels: counts the step and notes each parameter's version as its own write.
  static void finish_step(const std::vector<ParamToUpdate>& updated);

  // Throws when the hyperparameter is not finite or fails `ok`, naming it and `expected`.
  void check_hyperparameter(const char* what, double value, bool ok, const char* expected) const;

 private:
  void check_groups_unchanged(const char* op) const;

  std::string name_;
  std::vector<ParamGroup> groups_;
  std::vector<double> lr_scales_;               // each group's lr over the constructor's (set_lr)
  std::vector<std::vector<ParamState>> state_;  // state_[g][i] for groups_[g].params[i]
};

}  // namespace octet::optim
