#include "distributed/fsdp.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "autograd/engine.h"
#include "core/error.h"
#include "core/grad_mode.h"
#include "core/log.h"
#include "distributed/fsdp_fp8.h"
#include "distributed/fsdp_gather.h"
#include "distributed/fsdp_hybrid.h"
#include "distributed/fsdp_layout.h"
#include "distributed/fsdp_reduce.h"
#include "distributed/fsdp_units.h"
#include "kernels/elementwise.h"
#include "kernels/optimizers.h"
#include "nn/fp8.h"
#include "nn/layers.h"

namespace octet::distributed {

ShardingStrategy parse_sharding(const std::string& name) {
  if (name == "full") return ShardingStrategy::FullShard;
  if (name == "grad-op") return ShardingStrategy::ShardGradOp;
  if (name == "none") return ShardingStrategy::NoShard;
  if (name == "hybrid") return ShardingStrategy::HybridShard;
  if (name == "hybrid-grad-op") return ShardingStrategy::HybridShardGradOp;
  OCTET_FAIL("unknown sharding strategy '", name, "'; use full, grad-op, none, hybrid or hybrid-grad-op");
}

// The orchestration: the module hooks call in here, and this decides the order of events (docs/fsdp.md
// walks through one step). The roles it drives are UnitGatherer (gathers, frees, prefetches),
// GradientReducer (reduce-scatters gradients into the shards) and Fp8AllGather (the E4M3 shards).
struct FullyShardedDataParallel::State {
  FsdpOptions options;
  bool sharded = true;
  // The group the units are sharded over; under HYBRID_SHARD the ranks of this one's shard group,
  // and the replicate group across which the reducer all-reduces the gradient shards (fsdp_hybrid.h).
  std::shared_ptr<ProcessGroup> shard_group, replicate_group;
  std::vector<fsdp::Flat> flats;
  std::vector<fsdp::Unit> units;  // units[0] is the root
  fsdp::GatheredBytes bytes;
  Fp8AllGather fp8_gather;
  std::unique_ptr<fsdp::UnitGatherer> gatherer;
  std::unique_ptr<fsdp::GradientReducer> reducer;
  std::vector<int> forward_order, recording;  // unit indices in the order their forward ran
  int backward_current = -1;                  // the unit whose backward started last
  std::weak_ptr<State> self;

  bool prefetch_in_backward_pre() const { return options.backward_prefetch == BackwardPrefetch::BackwardPre; }

  // In backward: the unit after the one whose backward started last, in reverse forward order.
  void prefetch_next_in_backward() {
    if (backward_current < 0) return;
    gatherer->prefetch_after(backward_current, {forward_order.rbegin(), forward_order.rend()});
  }

  // ---- forward ------------------------------------------------------------------------------------

  void on_root_forward_start(ProcessGroup& group) {
    // A new step: whatever is still gathered (an evaluation's root, a pass without backward) is
    // stale once the optimizer has stepped.
    gatherer->release_all();
    // FP8 flats go as E4M3 when fp8_all_gather is on and this forward runs in an enabled FP8 scope
    // (the Linears then get their weight casts from those buffers), with the transposes a backward needs.
    const std::shared_ptr<const nn::Fp8Config> config = options.fp8_all_gather ? nn::fp8_config() : nullptr;
    gatherer->set_fp8(config != nullptr, GradMode::is_enabled());
    fp8_gather.begin_pass(config ? &config->recipe : nullptr, GradMode::is_enabled(), options.compute_dtype,
                          sharded ? &group : nullptr);
    recording = {0};
    gatherer->ensure(0);
    // The first block's gather, from the last forward's order: issued now, it overlaps the root's
    // own modules (the patch embedding) instead of waiting for blocks.0's pre-hook.
    if (options.forward_prefetch && !forward_order.empty()) gatherer->prefetch_after(0, forward_order);
  }

  void on_unit_forward_start(int u, const Tensor& input) {
    gatherer->ensure(u);
    recording.push_back(u);
    // The gradient of the unit's input is complete once every node of the unit's backward has run:
    // only then may its gathered parameters go (a frozen weight's node can run after every trainable
    // gradient of the unit is in). Without such a hook (the input needs no gradient) the unit goes
    // at the end of backward.
    if (GradMode::is_enabled() && input.requires_grad()) {
      Tensor(input).register_hook([weak = self, u](const Tensor&) {
        if (auto s = weak.lock()) s->on_unit_backward_end(u);
        return Tensor();
      });
    }
    if (options.forward_prefetch && !forward_order.empty()) gatherer->prefetch_after(u, forward_order);
  }

  void on_unit_forward_end(int u, const Tensor& output) {
    const bool training = GradMode::is_enabled() && output.requires_grad();
    if (!training || options.sharding == ShardingStrategy::FullShard) gatherer->release(u);
    if (!training) return;
    Tensor(output).register_hook([weak = self, u](const Tensor&) {
      if (auto s = weak.lock()) s->on_unit_backward_start(u);
      return Tensor();
    });
  }

  void on_root_forward_end(const Tensor& output) {
    forward_order = recording;
    if (!GradMode::is_enabled() || !output.requires_grad()) return gatherer->release_all();
    // The first unit of backward (the last of forward, just freed under FULL_SHARD) is needed as soon
    // as the loss and the root's last modules are differentiated: gather it while they run.
    const int first = forward_order.back();
    if (first != 0 && gatherer->room_for_another()) gatherer->start(first);
  }

  // ---- backward -----------------------------------------------------------------------------------

  void begin_backward() {
    backward_current = -1;
    reducer->begin_pass();
    autograd::queue_callback([weak = self] {
      if (auto s = weak.lock()) s->finish_backward();
    });
  }

  void on_unit_backward_start(int u) {
    if (!reducer->pass_active()) begin_backward();
    backward_current = u;
    gatherer->ensure(u);
    if (prefetch_in_backward_pre()) prefetch_next_in_backward();
  }

  void on_unit_backward_end(int u) {
    if (options.sharding != ShardingStrategy::NoShard) gatherer->release(u);
    if (prefetch_in_backward_pre()) prefetch_next_in_backward();
  }

  void on_gradient(int f, int s) {
    if (!reducer->pass_active()) begin_backward();
    reducer->on_gradient(f, s);
  }

  void finish_backward() {
    if (!reducer->pass_active()) return;
    reducer->finish_pass();
    if (options.sharding != ShardingStrategy::NoShard) gatherer->release_all();
  }
};

namespace {

void check_options(const FsdpOptions& options) {
  OCTET_CHECK(options.wrap_policy != nullptr, "FullyShardedDataParallel: wrap_policy is null; pass a predicate, "
              "e.g. wrap_modules_of_type<nn::TransformerBlock>(), or one that returns false to keep one unit");
  OCTET_CHECK(options.compute_dtype == DType::f32 || options.compute_dtype == DType::bf16,
              "FullyShardedDataParallel: compute_dtype ", dtype_name(options.compute_dtype), " is not supported; "
              "use f32 or bf16");
  OCTET_CHECK(options.reduce_dtype == DType::f32 || options.reduce_dtype == DType::bf16,
              "FullyShardedDataParallel: reduce_dtype ", dtype_name(options.reduce_dtype), " is not supported; "
              "use f32 or bf16");
  OCTET_CHECK(options.limit_all_gathers >= 1, "FullyShardedDataParallel: limit_all_gathers must be at least 1");
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<nn::Module> module,
                                                   std::shared_ptr<ProcessGroup> group, FsdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), state_(std::make_shared<State>()) {
  OCTET_CHECK(module_ != nullptr && group_ != nullptr, "FullyShardedDataParallel: the module or the process group "
              "is null; pass both");
  check_options(options);
  State& s = *state_;
  s.self = state_;
  s.options = options;
  s.sharded = options.sharding != ShardingStrategy::NoShard;
  const fsdp::FsdpGroups groups = fsdp::make_fsdp_groups(group_, options.sharding, options.shard_group_size);
  s.shard_group = groups.shard;
  s.replicate_group = groups.replicate;
  // Within its shard group HYBRID_SHARD is FULL_SHARD (and HYBRID_SHARD_GRAD_OP SHARD_GRAD_OP): the
  // orchestration below sees no difference, only the groups the roles are given do.
  if (options.sharding == ShardingStrategy::HybridShard) s.options.sharding = ShardingStrategy::FullShard;
  if (options.sharding == ShardingStrategy::HybridShardGradOp) s.options.sharding = ShardingStrategy::ShardGradOp;
  const int world = s.sharded ? s.shard_group->size() : 1, rank = s.sharded ? s.shard_group->rank() : 0;

  // The layout, from names and sizes.
  std::vector<std::string> wrapped;
  for (const auto& [name, child] : module_->named_modules()) {
    if (!name.empty() && options.wrap_policy(name, *child)) wrapped.push_back(name);
  }
  const std::vector<nn::NamedTensor> params = module_->named_parameters();
  const auto fp8_weights = options.fp8_all_gather ? fsdp::fp8_linears(*module_, options.compute_dtype)
                                                  : std::map<std::string, std::shared_ptr<nn::Linear>>{};
  std::vector<LayoutParameter> described;
  for (const auto& [name, p] : params) {
    described.push_back({name, p.numel(), options.flat_param_key ? options.flat_param_key(name, p) : 0,
                         p.requires_grad(), fp8_weights.count(name) > 0});
  }
  const FsdpLayout layout = plan_fsdp_layout(wrapped, described, world);
  const auto modules = module_->named_modules();
  for (const std::string& name : layout.units) {
    const auto it = std::find_if(modules.begin(), modules.end(), [&](const auto& m) { return m.first == name; });
    s.units.push_back({name, it->second, layout.unit_flats[s.units.size()]});
  }

  // The flats, from rank 0's values; the module's parameters become views of their gathered buffers.
  for (size_t f = 0; f < layout.flats.size(); ++f) {
    const fsdp::Flat& flat = s.flats.emplace_back(
        fsdp::make_flat(layout.flats[f], params, fp8_weights, *group_, rank, options.compute_dtype));
    if (flat.fp8) s.fp8_gather.add(flat.fp8, flat.shard, rank * flat.shard_numel);
    for (size_t i = 0; flat.trainable && i < flat.slots.size(); ++i) {
      Tensor(flat.slots[i].parameter).register_post_accumulate_grad_hook([weak = s.self, f = static_cast<int>(f),
                                                                         i = static_cast<int>(i)](Tensor&) {
        if (auto st = weak.lock()) st->on_gradient(f, i);
      });
    }
  }
  s.gatherer = std::make_unique<fsdp::UnitGatherer>(s.flats, s.units, *s.shard_group, s.sharded,
                                                    options.compute_dtype, options.limit_all_gathers, s.bytes);
  s.reducer = std::make_unique<fsdp::GradientReducer>(
      s.flats, s.units, layout.reduce_order, *s.shard_group, s.replicate_group.get(), s.sharded, options.reduce_dtype,
      options.limit_all_gathers, s.bytes, [weak = s.self](int) {
        auto st = weak.lock();
        if (st && !st->prefetch_in_backward_pre()) st->prefetch_next_in_backward();
      });

  // Forward hooks: the root's open and close the step; each other unit gathers before it runs.
  module_->register_forward_pre_hook([weak = s.self, group = s.shard_group.get()](nn::Module&, const Tensor&) {
    if (auto st = weak.lock()) st->on_root_forward_start(*group);
    return Tensor();
  });
  module_->register_forward_hook([weak = s.self](nn::Module&, const Tensor&, const Tensor& output) {
    if (auto st = weak.lock()) st->on_root_forward_end(output);
    return Tensor();
  });
  for (size_t u = 1; u < s.units.size(); ++u) {
    nn::Module& unit = *s.units[u].module;
    unit.register_forward_pre_hook([weak = s.self, u = static_cast<int>(u)](nn::Module&, const Tensor& input) {
      if (auto st = weak.lock()) st->on_unit_forward_start(u, input);
      return Tensor();
    });
    unit.register_forward_hook([weak = s.self, u = static_cast<int>(u)](nn::Module&, const Tensor&, const Tensor& out) {
      if (auto st = weak.lock()) st->on_unit_forward_end(u, out);
      return Tensor();
    });
  }
  logging::debug("FullyShardedDataParallel: {} units, {} flat parameters over {} ranks", s.units.size(),
                 s.flats.size(), world);
}

FullyShardedDataParallel::~FullyShardedDataParallel() = default;  // the roles wait for their collectives

const std::shared_ptr<ProcessGroup>& FullyShardedDataParallel::shard_group() const { return state_->shard_group; }
const std::shared_ptr<ProcessGroup>& FullyShardedDataParallel::replicate_group() const {
  return state_->replicate_group;
}

std::vector<Tensor> FullyShardedDataParallel::parameters() const {
  std::vector<Tensor> out;
  for (const auto& flat : state_->flats) {
    if (flat.trainable) out.push_back(flat.shard);
  }
  return out;
}

std::vector<Tensor> FullyShardedDataParallel::all_shards() const {
  std::vector<Tensor> out;
  for (const auto& flat : state_->flats) out.push_back(flat.shard);
  return out;
}

FullyShardedDataParallel::MemoryLedger FullyShardedDataParallel::memory_ledger(const optim::Optimizer* optimizer) const {
  MemoryLedger ledger;
  for (const auto& flat : state_->flats) {
    ledger.parameters += static_cast<int64_t>(flat.shard.nbytes());
    if (flat.shard.grad().defined()) ledger.gradients += static_cast<int64_t>(flat.shard.grad().nbytes());
  }
  if (optimizer != nullptr) {
    // State entries are "state.<g>.<i>.<name>"; count those of our shards' size (per-element state).
    const auto& groups = optimizer->param_groups();
    for (const auto& [key, tensor] : optimizer->state_dict()) {
      int g = 0, i = 0;
      if (std::sscanf(key.c_str(), "state.%d.%d.", &g, &i) != 2) continue;
      const Tensor& param = groups.at(static_cast<size_t>(g)).params.at(static_cast<size_t>(i));
      const bool ours = std::any_of(state_->flats.begin(), state_->flats.end(),
                                    [&](const fsdp::Flat& f) { return f.shard.is_same(param); });
      if (ours && tensor.numel() == param.numel()) ledger.optimizer += static_cast<int64_t>(tensor.nbytes());
    }
  }
  ledger.gathered = state_->bytes.now();
  ledger.peak_gathered = state_->bytes.peak();
  ledger.fp8_weight_casts = nn::fp8_weight_cast_bytes(*module_);
  for (const auto& flat : state_->flats) {
    if (flat.fp8 && flat.fp8->shard().defined()) ledger.fp8_shard_casts += static_cast<int64_t>(flat.fp8->shard().nbytes());
  }
  return ledger;
}

std::vector<FullyShardedDataParallel::FlatParameterInfo> FullyShardedDataParallel::flat_parameters() const {
  std::vector<FlatParameterInfo> out;
  for (const auto& flat : state_->flats) {
    FlatParameterInfo info{state_->units[flat.unit].name, flat.key, flat.trainable, flat.fp8 != nullptr, {}, {}, flat.numel,
                           flat.padded, flat.shard_numel};
    for (const fsdp::Slot& slot : flat.slots) {
      info.parameters.push_back(slot.name);
      info.offsets.push_back(slot.offset);
    }
    out.push_back(std::move(info));
  }
  return out;
}

optim::GradNorm FullyShardedDataParallel::clip_grad_norm_(double max_norm) {
  const char* op = "FullyShardedDataParallel::clip_grad_norm_";
  OCTET_CHECK(std::isfinite(max_norm) && max_norm > 0, op, ": max_norm must be finite and > 0, got ", max_norm);
  std::vector<Tensor> grads;
  for (const auto& flat : state_->flats) {
    if (flat.trainable && flat.shard.grad().defined()) grads.push_back(flat.shard.grad());
  }
  // This rank's sum of squares, then the shard group's summed by an all-reduce of that one f64 (the
  // replicas of a shard would count it again). The shards and an NCCL group share the GPU: nothing is
  // read on the host there (NCCL's wait() orders the compute stream after the all-reduce). A group on
  // another device gets a copy (to() is a no-op otherwise).
  ProcessGroup& group = *state_->shard_group;
  const Device device = state_->flats.empty() ? group.device() : state_->flats[0].shard.device();
  Tensor total = kernels::sum_of_squares_multi_tensor(grads, device);
  if (state_->sharded) {
    const Tensor reduced = total.to(group.device());
    group.all_reduce(reduced, ReduceOp::Sum)->wait();
    total = reduced.to(device);
  }
  return optim::clip_grads_by_total_(grads, total, max_norm, /*error_if_nonfinite=*/false, op);
}

namespace {

// A flat parameter at full (padded) size in f32, gathered from the shard group's shards: every rank
// of that group must call this for the same flat.
Tensor gather_flat_f32(const fsdp::Flat& flat, const FullyShardedDataParallel::State& state) {
  const Tensor full = empty({flat.padded}, DType::f32, flat.shard.device());
  if (state.sharded) {
    state.shard_group->all_gather(full, flat.shard.detach())->wait();
  } else {
    full.copy_(flat.shard.detach());
  }
  return full;
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> FullyShardedDataParallel::full_parameters() {
  std::map<std::string, Tensor> by_name;
  for (const auto& flat : state_->flats) {
    const Tensor full = gather_flat_f32(flat, *state_);
    for (const fsdp::Slot& slot : flat.slots) {
      by_name[slot.name] = full.narrow(slot.offset, slot.parameter.numel()).reshape(slot.parameter.shape()).clone();
    }
  }
  std::vector<std::pair<std::string, Tensor>> out;  // in the module's registration order
  for (const auto& p : module_->named_parameters()) out.emplace_back(p.first, by_name.at(p.first));
  return out;
}

Tensor FullyShardedDataParallel::full_parameter(const std::string& name) {
  for (const auto& flat : state_->flats) {
    for (const fsdp::Slot& slot : flat.slots) {
      if (slot.name != name) continue;
      const Tensor full = gather_flat_f32(flat, *state_);
      return full.narrow(slot.offset, slot.parameter.numel()).reshape(slot.parameter.shape()).clone();
    }
  }
  OCTET_FAIL("FullyShardedDataParallel::full_parameter: the module has no parameter ", name,
             "; pass a dotted name from module().named_parameters()");
}

int FullyShardedDataParallel::units_gathered() const { return state_->gatherer->gathered_now(); }
int FullyShardedDataParallel::max_units_gathered() const { return state_->gatherer->gathered_max(); }

std::vector<optim::ParamGroup> weight_decay_groups(const FullyShardedDataParallel& fsdp, double lr,
                                                   double weight_decay) {
  optim::ParamGroup no_decay{{}, lr, 0.0}, decay{{}, lr, weight_decay};
  const auto flats = fsdp.flat_parameters();
  const auto shards = fsdp.all_shards();
  for (size_t f = 0; f < flats.size(); ++f) {
    if (flats[f].trainable) (flats[f].key == 1 ? decay : no_decay).params.push_back(shards[f]);
  }
  std::vector<optim::ParamGroup> groups;
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  return groups;
}

}  // namespace octet::distributed
