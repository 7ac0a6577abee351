#include "distributed/fsdp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>

#include "autograd/engine.h"
#include "core/error.h"
#include "core/grad_mode.h"
#include "core/log.h"
#include "core/trace.h"
#include "distributed/fsdp_fp8.h"
#include "kernels/elementwise.h"
#include "kernels/optimizers.h"
#include "nn/fp8.h"
#include "nn/fp8_linear.h"
#include "nn/layers.h"

namespace octet::distributed {

ShardingStrategy parse_sharding(const std::string& name) {
  if (name == "full") return ShardingStrategy::FullShard;
  if (name == "grad-op") return ShardingStrategy::ShardGradOp;
  if (name == "none") return ShardingStrategy::NoShard;
  OCTET_FAIL("unknown sharding strategy '", name, "'; use full, grad-op or none");
}

namespace {

struct Slot {
  std::string name;
  Tensor parameter;  // the module's parameter: a view of the gathered buffer while gathered
  int64_t offset = 0;
  bool arrived = false;  // its gradient, in the backward pass under way
};

}  // namespace

struct FullyShardedDataParallel::State {
  struct Flat {
    int unit = 0;
    int key = 0;
    bool trainable = true;
    std::vector<Slot> slots;
    int64_t numel = 0, padded = 0, shard_numel = 0;
    Tensor shard;     // f32 [shard_numel], a leaf: this rank's master weights; .grad its gradient
    Tensor gathered;  // [padded] compute dtype; its storage is released while the unit is sharded
    // The shard's version at the last gather into `gathered`, and gathered's version after it.
    uint64_t gathered_from = UINT64_MAX, gathered_version = 0;
    int pending = 0;  // gradients still to arrive in this pass
    bool reduced = false;
    Tensor grad_full, grad_shard;  // the reduce-scatter's input and output while it is in flight
    WorkHandle reduce_work;
    int64_t reduce_start_us = 0;  // for the trace

    // Set when every slot is the weight of an FP8 Linear (fp8_all_gather): its E4M3 side.
    std::shared_ptr<Fp8Flat> fp8;
  };
  struct Unit {
    std::string name;  // "" for the root
    std::shared_ptr<nn::Module> module;
    std::vector<int> flats;
    bool gathered = false;
    bool fp8 = false, transposed = false;  // how it was last gathered: FP8 flats as E4M3, with transposes
    WorkHandle gather_work;  // a prefetch in flight
    std::vector<Tensor> gather_inputs;
    int64_t gather_start_us = 0;  // for the trace
    std::string label() const { return name.empty() ? "root" : name; }
  };

  std::shared_ptr<ProcessGroup> group;
  FsdpOptions options;
  bool sharded = true;
  // FP8 all-gather: whether this forward (and its backward) gathers the FP8 flats as E4M3, and makes
  // the transposes a backward needs; the FP8 flats.
  bool fp8_pass = false, fp8_transposes = false;
  Fp8AllGather fp8_gather;
  std::vector<Flat> flats;
  std::vector<Unit> units;  // units[0] is the root
  std::vector<int> forward_order, recording;  // unit indices in the order their forward ran
  bool backward_active = false;
  int backward_current = -1;  // the unit whose backward started last
  // Flats are reduced in this order on every rank: the units in reverse (the order backward finishes
  // them, for a model whose units run in registration order), the root last.
  std::vector<int> reduce_order;
  int next_to_reduce = 0;  // reduce_order[0, next_to_reduce) are launched
  int gathered_now = 0, gathered_max = 0;
  int64_t gathered_bytes = 0, peak_gathered_bytes = 0;  // gathered units and gradients in flight

  void count_bytes(int64_t delta) {
    gathered_bytes += delta;
    peak_gathered_bytes = std::max(peak_gathered_bytes, gathered_bytes);
  }

  int world() const { return sharded ? group->size() : 1; }

  // ---- gathering ----------------------------------------------------------------------------------

  void start_gather(int u) {
    Unit& unit = units[u];
    if (unit.gathered || unit.gather_work) return;
    unit.gather_start_us = trace::now_us();
    unit.gather_inputs.clear();
    unit.fp8 = fp8_pass;
    unit.transposed = fp8_pass && fp8_transposes;
    for (int f : unit.flats) {
      Flat& flat = flats[f];
      const bool fp8 = unit.fp8 && flat.fp8;
      const Tensor& buffer = fp8 ? flat.fp8->gathered() : flat.gathered;
      allocate_buffer(buffer);
      if (fp8 && unit.transposed) allocate_buffer(flat.fp8->transposed());
      const Tensor input = fp8 ? flat.fp8->shard() : flat.shard.detach().to(options.compute_dtype).clone();
      unit.gather_inputs.push_back(input);
      if (sharded) {
        unit.gather_work = group->all_gather(buffer, input);
      } else {
        buffer.copy_(input);
      }
      if (!fp8) carry_version(flat);
    }
    if (!unit.gather_work) unit.gather_work = std::make_shared<CompletedWork>("no_shard copy");
    if (u != 0) gathered_max = std::max(gathered_max, ++gathered_now);
  }

  // A gather from shards unchanged since the last one writes the bytes the buffer held after it:
  // the buffer gets that gather's version back, so what was cached from those bytes (the FP8
  // Linears' weight casts, nn::Fp8WeightCache) stays good, as in an unsharded model between
  // optimizer steps. Every rank's shard changes together (an optimizer step, a load), so this
  // rank's shard version stands for all of them.
  void carry_version(Flat& flat) {
    const uint64_t source = flat.shard.version();
    if (source == flat.gathered_from) {
      flat.gathered.storage()->restore_version(flat.gathered_version);
    } else {
      flat.gathered_from = source;
      flat.gathered_version = flat.gathered.version();
    }
  }

  void allocate_buffer(const Tensor& buffer) {
    buffer.storage()->reallocate();
    count_bytes(static_cast<int64_t>(buffer.nbytes()));
  }

  void free_buffer(const Tensor& buffer) {
    buffer.storage()->release();
    count_bytes(-static_cast<int64_t>(buffer.nbytes()));
  }

  void ensure_gathered(int u) {
    Unit& unit = units[u];
    if (unit.gathered) return;
    start_gather(u);
    const int64_t wait_start = trace::now_us();
    unit.gather_work->wait();  // the group runs collectives in order: every flat's gather is done
    unit.gather_work.reset();
    unit.gather_inputs.clear();
    unit.gathered = true;
    if (unit.transposed) {  // the backward GEMM's operand, from the gathered bytes (after the wait)
      for (int f : unit.flats) {
        if (flats[f].fp8) flats[f].fp8->make_transposes();
      }
    }
    if (trace::enabled()) {
      const int64_t now = trace::now_us();
      // From issue (a prefetch: earlier) to ready, and the part of it compute waited for.
      trace::complete("gather " + unit.label(), "fsdp", "fsdp", unit.gather_start_us, now);
      trace::complete("wait " + unit.label(), "fsdp", "fsdp wait", wait_start, now);
    }
  }

  void release(int u) {
    Unit& unit = units[u];
    if (unit.gather_work) {  // a prefetch nobody used: finish it before freeing its buffer
      unit.gather_work->wait();
      unit.gather_work.reset();
      unit.gathered = true;
    }
    if (!unit.gathered) return;
    if (trace::enabled()) {
      const int64_t now = trace::now_us();
      trace::complete("free " + unit.label(), "fsdp", "fsdp", now, now + 1);
    }
    for (int f : unit.flats) {
      const Flat& flat = flats[f];
      const bool fp8 = unit.fp8 && flat.fp8;
      free_buffer(fp8 ? flat.fp8->gathered() : flat.gathered);
      if (fp8 && unit.transposed) free_buffer(flat.fp8->transposed());
    }
    unit.gathered = false;
    if (u != 0) --gathered_now;
  }

  // The unit after `u` in `order`, if there is one and the rate limit allows another gather.
  void prefetch_after(int u, const std::vector<int>& order) {
    const auto it = std::find(order.begin(), order.end(), u);
    if (it == order.end() || it + 1 == order.end()) return;
    const int next = *(it + 1);
    if (next != 0 && gathered_now >= options.limit_all_gathers) return;
    start_gather(next);
  }

  std::vector<int> backward_order() const { return {forward_order.rbegin(), forward_order.rend()}; }

  // In backward: the unit after the one whose backward started last, if the rate limit allows.
  void prefetch_next_in_backward() {
    if (backward_current >= 0) prefetch_after(backward_current, backward_order());
  }

  // ---- FP8 all-gather -----------------------------------------------------------------------------

  // Decides how this forward gathers: FP8 flats as E4M3 when fp8_all_gather is on and the forward
  // runs inside an enabled FP8 scope (the Linears then get their weight casts from those buffers).
  void begin_pass() {
    const std::shared_ptr<const nn::Fp8Config> config = options.fp8_all_gather ? nn::fp8_config() : nullptr;
    fp8_pass = config != nullptr;
    fp8_transposes = fp8_pass && GradMode::is_enabled();
    fp8_gather.begin_pass(fp8_pass ? &config->recipe : nullptr, fp8_transposes, options.compute_dtype,
                          sharded ? group.get() : nullptr);
  }

  // ---- forward ------------------------------------------------------------------------------------

  void on_root_forward_start() {
    // A new step: whatever is still gathered (an evaluation's root, a pass without backward) is
    // stale once the optimizer has stepped.
    for (size_t u = 0; u < units.size(); ++u) release(static_cast<int>(u));
    begin_pass();
    recording.clear();
    ensure_gathered(0);
    recording.push_back(0);
    // The first block's gather, from the last forward's order: issued now, it overlaps the root's
    // own modules (the patch embedding) instead of waiting for blocks.0's pre-hook.
    if (options.forward_prefetch && !forward_order.empty()) prefetch_after(0, forward_order);
  }

  void on_unit_forward_start(int u, const Tensor& input) {
    ensure_gathered(u);
    recording.push_back(u);
    // The gradient of the unit's input is complete once every node of the unit's backward has run:
    // only then may its gathered parameters go (a frozen weight's node can run after every trainable
    // gradient of the unit is in). Without such a hook (the input needs no gradient) the unit goes
    // at the end of backward.
    if (GradMode::is_enabled() && input.requires_grad()) {
      std::weak_ptr<State> weak = self;
      Tensor(input).register_hook([weak, u](const Tensor&) {
        if (auto s = weak.lock()) s->on_unit_backward_end(u);
        return Tensor();
      });
    }
    if (options.forward_prefetch && !forward_order.empty()) prefetch_after(u, forward_order);
  }

  void on_unit_forward_end(int u, const Tensor& output) {
    const bool training = GradMode::is_enabled() && output.requires_grad();
    if (!training || options.sharding == ShardingStrategy::FullShard) release(u);
    if (!training) return;
    std::weak_ptr<State> weak = self;
    Tensor(output).register_hook([weak, u](const Tensor&) {
      if (auto s = weak.lock()) s->on_unit_backward_start(u);
      return Tensor();
    });
  }

  void on_root_forward_end(const Tensor& output) {
    forward_order = recording;
    if (!GradMode::is_enabled() || !output.requires_grad()) {
      for (size_t u = 0; u < units.size(); ++u) release(static_cast<int>(u));
      return;
    }
    // The first unit of backward (the last of forward, just freed under FULL_SHARD) is needed as soon
    // as the loss and the root's last modules are differentiated: gather it while they run.
    const int first = forward_order.back();
    if (first != 0 && gathered_now < options.limit_all_gathers) start_gather(first);
  }

  // ---- backward -----------------------------------------------------------------------------------

  void begin_backward() {
    backward_active = true;
    backward_current = -1;
    next_to_reduce = 0;
    for (Flat& flat : flats) {
      flat.pending = flat.trainable ? static_cast<int>(flat.slots.size()) : 0;
      flat.reduced = !flat.trainable;
      for (Slot& slot : flat.slots) slot.arrived = false;
    }
    std::weak_ptr<State> weak = self;
    autograd::queue_callback([weak] {
      if (auto s = weak.lock()) s->finish_backward();
    });
  }

  void on_unit_backward_start(int u) {
    if (!backward_active) begin_backward();
    backward_current = u;
    ensure_gathered(u);
    if (options.backward_prefetch == BackwardPrefetch::BackwardPre) prefetch_next_in_backward();
  }

  void on_unit_backward_end(int u) {
    if (options.sharding != ShardingStrategy::NoShard) release(u);
    if (options.backward_prefetch == BackwardPrefetch::BackwardPre) prefetch_next_in_backward();
  }

  void on_gradient(int f, int s) {
    if (!backward_active) begin_backward();
    Flat& flat = flats[f];
    Slot& slot = flat.slots[s];
    OCTET_CHECK(!slot.arrived, "FullyShardedDataParallel: the gradient of ", slot.name,
                " arrived twice in one backward pass");
    slot.arrived = true;
    --flat.pending;
    launch_ready();
  }

  // Reduce-scatters every flat whose gradients are all in, in flat order (the same on every rank).
  void launch_ready() {
    while (next_to_reduce < static_cast<int>(reduce_order.size()) && flats[reduce_order[next_to_reduce]].pending == 0) {
      launch_reduce(reduce_order[next_to_reduce++]);
      collect_reduces();
    }
  }

  // Adds a finished reduce-scatter's result to the gradient shard and frees the full gradient.
  void finish_reduce(Flat& flat) {
    const bool waiting = !flat.reduce_work->is_completed();
    const int64_t wait_start = trace::now_us();
    flat.reduce_work->wait();
    flat.reduce_work.reset();
    if (waiting && trace::enabled()) {
      trace::complete("wait reduce_scatter " + units[flat.unit].label(), "fsdp", "fsdp wait", wait_start,
                      trace::now_us());
    }
    if (trace::enabled()) {
      trace::complete("reduce_scatter " + units[flat.unit].label(), "fsdp", "fsdp", flat.reduce_start_us,
                      trace::now_us());
    }
    const Tensor grad = flat.grad_shard.to(DType::f32);
    if (flat.shard.grad().defined()) {
      kernels::add_(flat.shard.grad(), grad);
    } else {
      flat.shard.set_grad(grad.clone());
    }
    count_bytes(-static_cast<int64_t>(flat.grad_full.nbytes()));
    flat.grad_full = Tensor();
    flat.grad_shard = Tensor();
  }

  // Collects the reduce-scatters that have finished, and waits for the oldest while more than
  // limit_all_gathers are in flight: otherwise every unit's full gradient would stay until the end
  // of backward, and gradient memory would grow with the model instead of with one unit.
  void collect_reduces() {
    int in_flight = 0;
    for (int i = 0; i < next_to_reduce; ++i) {
      Flat& flat = flats[reduce_order[i]];
      if (!flat.reduce_work) continue;
      if (flat.reduce_work->is_completed()) {
        finish_reduce(flat);
      } else {
        ++in_flight;
      }
    }
    for (int i = 0; i < next_to_reduce && in_flight > options.limit_all_gathers; ++i) {
      Flat& flat = flats[reduce_order[i]];
      if (flat.reduce_work) finish_reduce(flat), --in_flight;
    }
  }

  void launch_reduce(int f) {
    Flat& flat = flats[f];
    flat.grad_full = zeros({flat.padded}, options.reduce_dtype, flat.shard.device());
    for (Slot& slot : flat.slots) {
      if (slot.parameter.grad().defined()) {
        flat.grad_full.narrow(slot.offset, slot.parameter.numel()).copy_(slot.parameter.grad().flatten());
        slot.parameter.set_grad(Tensor());  // the full gradient is not kept
      }
    }
    flat.grad_shard = empty({flat.shard_numel}, options.reduce_dtype, flat.shard.device());
    flat.reduce_start_us = trace::now_us();
    count_bytes(static_cast<int64_t>(flat.grad_full.nbytes()));
    if (sharded) {
      flat.reduce_work = group->reduce_scatter(flat.grad_shard, flat.grad_full, ReduceOp::Avg);
    } else {
      flat.reduce_work = group->all_reduce(flat.grad_full, ReduceOp::Avg);
      flat.grad_shard = flat.grad_full;
    }
    flat.reduced = true;
    const Unit& unit = units[flat.unit];
    const bool unit_done = std::all_of(unit.flats.begin(), unit.flats.end(), [&](int g) { return flats[g].reduced; });
    if (unit_done && options.backward_prefetch == BackwardPrefetch::BackwardPost) prefetch_next_in_backward();
  }

  void finish_backward() {
    if (!backward_active) return;
    // A parameter this pass did not reach contributes zeros (another rank may have used it).
    for (Flat& flat : flats) {
      if (!flat.trainable) continue;
      for (Slot& slot : flat.slots) {
        if (!slot.arrived) slot.arrived = true, --flat.pending;
      }
    }
    launch_ready();
    for (int f : reduce_order) {
      if (flats[f].reduce_work) finish_reduce(flats[f]);
    }
    if (options.sharding != ShardingStrategy::NoShard) {
      for (size_t u = 0; u < units.size(); ++u) release(static_cast<int>(u));
    }
    backward_active = false;
  }

  std::weak_ptr<State> self;
};

namespace {

bool default_wrap_policy(const std::string&, const nn::Module& module) {
  return dynamic_cast<const nn::TransformerBlock*>(&module) != nullptr;
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<nn::Module> module,
                                                   std::shared_ptr<ProcessGroup> group, FsdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), state_(std::make_shared<State>()) {
  OCTET_CHECK(module_ != nullptr && group_ != nullptr, "FullyShardedDataParallel: the module or the process group "
              "is null; pass both");
  OCTET_CHECK(options.compute_dtype == DType::f32 || options.compute_dtype == DType::bf16,
              "FullyShardedDataParallel: compute_dtype ", dtype_name(options.compute_dtype), " is not supported; "
              "use f32 or bf16");
  OCTET_CHECK(options.reduce_dtype == DType::f32 || options.reduce_dtype == DType::bf16,
              "FullyShardedDataParallel: reduce_dtype ", dtype_name(options.reduce_dtype), " is not supported; "
              "use f32 or bf16");
  OCTET_CHECK(options.limit_all_gathers >= 1, "FullyShardedDataParallel: limit_all_gathers must be at least 1");
  if (!options.wrap_policy) options.wrap_policy = default_wrap_policy;
  State& s = *state_;
  s.self = state_;
  s.group = group_;
  s.options = options;
  s.sharded = options.sharding != ShardingStrategy::NoShard;

  // Units: the root, then each module the policy picks (not inside another unit), in module order.
  auto make_unit = [](std::string name, std::shared_ptr<nn::Module> module) {
    State::Unit unit;
    unit.name = std::move(name);
    unit.module = std::move(module);
    return unit;
  };
  s.units.push_back(make_unit("", module_));
  for (const auto& [name, child] : module_->named_modules()) {
    if (name.empty() || !options.wrap_policy(name, *child)) continue;
    const bool nested = std::any_of(s.units.begin() + 1, s.units.end(),
                                    [&](const State::Unit& u) { return name.rfind(u.name + ".", 0) == 0; });
    if (!nested) s.units.push_back(make_unit(name, child));
  }
  auto unit_of = [&](const std::string& param) {
    for (size_t u = 1; u < s.units.size(); ++u) {
      if (param.rfind(s.units[u].name + ".", 0) == 0) return static_cast<int>(u);
    }
    return 0;
  };

  // Flat parameters: per unit and key, in parameter registration order.
  const int world = s.world();
  const std::vector<nn::NamedTensor> params = module_->named_parameters();
  // Under fp8_all_gather: the weights of the Linears that will run in FP8, by parameter name.
  std::map<std::string, std::shared_ptr<nn::Linear>> fp8_weights;
  if (options.fp8_all_gather) {
    for (const auto& [name, m] : module_->named_modules()) {
      auto linear = std::dynamic_pointer_cast<nn::Linear>(m);
      if (linear == nullptr || !linear->fp8_allowed ||
          !nn::fp8_linear_unsupported_reason(linear->in_features, linear->out_features, options.compute_dtype,
                                             options.compute_dtype)
               .empty()) {
        continue;
      }
      fp8_weights[name.empty() ? "weight" : name + ".weight"] = linear;
    }
  }
  // Trainable and frozen parameters never share a flat parameter (a frozen flat gets no gradient),
  // nor FP8 weights and the rest (an FP8 flat is gathered as bytes).
  struct Key {
    int key = 0;
    bool trainable = true, fp8 = false;  // fp8: weights of FP8 Linears
    bool operator==(const Key& o) const { return key == o.key && trainable == o.trainable && fp8 == o.fp8; }
  };
  auto key_of = [&](const std::string& name, const Tensor& p) {
    return Key{options.flat_param_key ? options.flat_param_key(name, p) : 0, p.requires_grad(),
               fp8_weights.count(name) > 0};
  };
  const Device device = params.empty() ? Device::cpu() : params.front().second.device();
  for (size_t u = 0; u < s.units.size(); ++u) {
    std::vector<Key> keys;
    for (const auto& [name, p] : params) {
      if (unit_of(name) != static_cast<int>(u)) continue;
      const Key key = key_of(name, p);
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
    for (const Key& key : keys) {
      State::Flat flat;
      flat.unit = static_cast<int>(u);
      flat.key = key.key;
      flat.trainable = key.trainable;
      std::vector<Fp8Flat::Weight> fp8;
      for (const auto& [name, p] : params) {
        if (unit_of(name) != static_cast<int>(u) || !(key_of(name, p) == key)) continue;
        flat.slots.push_back({name, p, flat.numel});
        if (key.fp8) fp8.push_back({fp8_weights.at(name), flat.numel});
        flat.numel += p.numel();
      }
      flat.padded = (flat.numel + world - 1) / world * world;
      flat.shard_numel = flat.padded / world;
      if (key.fp8) flat.fp8 = std::make_shared<Fp8Flat>(std::move(fp8), flat.numel, flat.padded, device);
      s.units[u].flats.push_back(static_cast<int>(s.flats.size()));
      s.flats.push_back(std::move(flat));
    }
  }

  for (size_t u = s.units.size(); u-- > 0;) {  // the last unit first, the root (units[0]) last
    for (int f : s.units[u].flats) {
      if (s.flats[f].trainable) s.reduce_order.push_back(f);
    }
  }

  // Every rank starts from rank 0's values: broadcast each flat parameter, keep this rank's shard,
  // and make the module's parameters views of the (released) gathered buffer.
  NoGradGuard no_grad;
  const int rank = s.sharded ? group_->rank() : 0;
  for (size_t f = 0; f < s.flats.size(); ++f) {
    State::Flat& flat = s.flats[f];
    const Tensor full = zeros({flat.padded}, DType::f32, device);
    for (const Slot& slot : flat.slots) {
      full.narrow(slot.offset, slot.parameter.numel()).copy_(slot.parameter.detach().flatten());
    }
    group_->broadcast(full, 0)->wait();
    flat.shard = full.narrow(static_cast<int64_t>(rank) * flat.shard_numel, flat.shard_numel).clone();
    flat.shard.requires_grad_(flat.trainable);
    if (flat.fp8) s.fp8_gather.add(flat.fp8, flat.shard, static_cast<int64_t>(rank) * flat.shard_numel);
    flat.gathered = empty({flat.padded}, options.compute_dtype, device);
    for (size_t i = 0; i < flat.slots.size(); ++i) {
      Slot& slot = flat.slots[i];
      slot.parameter.set_data(flat.gathered.narrow(slot.offset, slot.parameter.numel()).reshape(slot.parameter.shape()));
      slot.parameter.set_grad(Tensor());
      if (!flat.trainable) continue;
      std::weak_ptr<State> weak = state_;
      slot.parameter.register_post_accumulate_grad_hook([weak, f = static_cast<int>(f), i = static_cast<int>(i)](Tensor&) {
        if (auto st = weak.lock()) st->on_gradient(f, i);
      });
    }
    flat.gathered.storage()->release();
  }

  // Forward hooks: the root's open and close the step; each other unit gathers before it runs.
  std::weak_ptr<State> weak = state_;
  module_->register_forward_pre_hook([weak](nn::Module&, const Tensor&) {
    if (auto st = weak.lock()) st->on_root_forward_start();
    return Tensor();
  });
  module_->register_forward_hook([weak](nn::Module&, const Tensor&, const Tensor& output) {
    if (auto st = weak.lock()) st->on_root_forward_end(output);
    return Tensor();
  });
  for (size_t u = 1; u < s.units.size(); ++u) {
    const int index = static_cast<int>(u);
    s.units[u].module->register_forward_pre_hook([weak, index](nn::Module&, const Tensor& input) {
      if (auto st = weak.lock()) st->on_unit_forward_start(index, input);
      return Tensor();
    });
    s.units[u].module->register_forward_hook([weak, index](nn::Module&, const Tensor&, const Tensor& output) {
      if (auto st = weak.lock()) st->on_unit_forward_end(index, output);
      return Tensor();
    });
  }
  logging::debug("FullyShardedDataParallel: {} units, {} flat parameters over {} ranks", s.units.size(),
                 s.flats.size(), group_->size());
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (auto& flat : state_->flats) {
    if (flat.reduce_work) flat.reduce_work->synchronize();
  }
  for (auto& unit : state_->units) {
    if (unit.gather_work) unit.gather_work->synchronize();
  }
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
                                    [&](const State::Flat& f) { return f.shard.is_same(param); });
      if (ours && tensor.numel() == param.numel()) ledger.optimizer += static_cast<int64_t>(tensor.nbytes());
    }
  }
  ledger.gathered = state_->gathered_bytes;
  ledger.peak_gathered = state_->peak_gathered_bytes;
  for (const auto& [name, m] : module_->named_modules()) {
    const auto* linear = dynamic_cast<const nn::Linear*>(m.get());
    if (linear == nullptr || linear->fp8_state == nullptr || linear->fp8_state->weight_cache.supplied()) continue;
    const kernels::Fp8Cast& cast = linear->fp8_state->weight_cache.cast();
    for (const Tensor& t : {cast.data, cast.transposed}) {
      if (t.defined() && t.storage()->allocated()) ledger.fp8_weight_casts += static_cast<int64_t>(t.nbytes());
    }
  }
  return ledger;
}

std::vector<FullyShardedDataParallel::FlatParameterInfo> FullyShardedDataParallel::flat_parameters() const {
  std::vector<FlatParameterInfo> out;
  for (const auto& flat : state_->flats) {
    FlatParameterInfo info{state_->units[flat.unit].name, flat.key, flat.trainable, flat.fp8 != nullptr, {}, {}, flat.numel,
                           flat.padded, flat.shard_numel};
    for (const Slot& slot : flat.slots) {
      info.parameters.push_back(slot.name);
      info.offsets.push_back(slot.offset);
    }
    out.push_back(std::move(info));
  }
  return out;
}

double FullyShardedDataParallel::clip_grad_norm_(double max_norm) {
  OCTET_CHECK(std::isfinite(max_norm) && max_norm > 0, "FullyShardedDataParallel::clip_grad_norm_: max_norm must "
              "be finite and > 0, got ", max_norm);
  std::vector<Tensor> grads;
  for (const auto& flat : state_->flats) {
    if (flat.trainable && flat.shard.grad().defined()) grads.push_back(flat.shard.grad());
  }
  double local = grads.empty() ? 0.0 : kernels::sum_of_squares_multi(grads);
  if (state_->sharded) {
    const Tensor total = from_vector<double>({local}, {1}).to(group_->device());
    group_->all_reduce(total, ReduceOp::Sum)->wait();
    local = total.item();
  }
  const double norm = std::sqrt(local);
  const double coef = max_norm / (norm + 1e-6);  // optim::clip_grad_norm_'s rule
  if (std::isfinite(norm) && coef < 1.0) {
    for (const Tensor& g : grads) kernels::mul_scalar_(g, coef);
  }
  return norm;
}

std::vector<std::pair<std::string, Tensor>> FullyShardedDataParallel::full_parameters() {
  std::map<std::string, Tensor> by_name;
  for (const auto& flat : state_->flats) {
    const Tensor full = empty({flat.padded}, DType::f32, flat.shard.device());
    if (state_->sharded) {
      group_->all_gather(full, flat.shard.detach())->wait();
    } else {
      full.copy_(flat.shard.detach());
    }
    for (const Slot& slot : flat.slots) {
      by_name[slot.name] = full.narrow(slot.offset, slot.parameter.numel()).reshape(slot.parameter.shape()).clone();
    }
  }
  std::vector<std::pair<std::string, Tensor>> out;  // in the module's registration order
  for (const auto& p : module_->named_parameters()) out.emplace_back(p.first, by_name.at(p.first));
  return out;
}

int FullyShardedDataParallel::units_gathered() const { return state_->gathered_now; }
int FullyShardedDataParallel::max_units_gathered() const { return state_->gathered_max; }

}  // namespace octet::distributed
