// FP8 recipes, the autocast scope and the bookkeeping of when scales are updated (nn/fp8.h).
#include "nn/fp8.h"

#include <algorithm>
#include <exception>
#include <sstream>
#include <unordered_set>
#include <vector>

#include "autograd/engine.h"
#include "core/log.h"
#include "kernels/shape_ops.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace octet::nn {

// ---- recipes --------------------------------------------------------------------------------------

namespace {

const char* format_name(Fp8Format f) { return f == Fp8Format::HYBRID ? "HYBRID" : "E4M3"; }

void check_margin(int margin) {
  OCTET_CHECK(margin >= 0 && margin <= 64, "Fp8Recipe: margin ", margin,
              " is out of range; it is a power of two of headroom (scale = fp8_max / amax / 2^margin), "
              "use 0 to 64 (0 is Transformer Engine's default)");
}

}  // namespace

Fp8Recipe::Fp8Recipe(DelayedScaling delayed) : recipe_(delayed) {
  check_margin(delayed.margin);
  OCTET_CHECK(delayed.amax_history_len >= 1, "DelayedScaling: amax_history_len must be at least 1, got ",
              delayed.amax_history_len);
}

Fp8Recipe::Fp8Recipe(CurrentScaling current) : recipe_(current) { check_margin(current.margin); }

const DelayedScaling& Fp8Recipe::delayed() const {
  OCTET_CHECK(is_delayed(), "Fp8Recipe::delayed: this is ", describe(), ", not a delayed-scaling recipe");
  return std::get<DelayedScaling>(recipe_);
}

int Fp8Recipe::margin() const {
  return std::visit([](const auto& r) { return r.margin; }, recipe_);
}

Fp8Format Fp8Recipe::format() const {
  return std::visit([](const auto& r) { return r.fp8_format; }, recipe_);
}

std::string Fp8Recipe::describe() const {
  std::ostringstream os;
  if (is_delayed()) {
    const DelayedScaling& d = delayed();
    os << "delayed(margin=" << d.margin << ", amax_history_len=" << d.amax_history_len
       << ", amax_compute_algo=" << (d.amax_compute_algo == AmaxCompute::Max ? "max" : "most_recent")
       << ", fp8_format=" << format_name(d.fp8_format) << ")";
  } else {
    os << "current(margin=" << margin() << ", fp8_format=" << format_name(format()) << ")";
  }
  return os.str();
}

// ---- state ----------------------------------------------------------------------------------------

namespace {

kernels::Fp8ScalingTensors make_group(int64_t history_len, int64_t n, DType fp8_dtype, Device device) {
  return {zeros({history_len, n}, DType::f32, device), ones({n}, DType::f32, device),
          ones({n}, DType::f32, device), fp8_dtype};
}

// The last completed step's amax of entry j (see Fp8LinearState::Snapshot).
double latest_amax(const std::vector<float>& history, int64_t history_len, int64_t n, int64_t j) {
  return history[static_cast<size_t>((history_len > 1 ? history_len - 1 : 0) * n + j)];
}

}  // namespace

std::shared_ptr<Fp8LinearState> Fp8LinearState::create(Device device, const Fp8Recipe& recipe) {
  auto state = std::make_shared<Fp8LinearState>();
  state->forward = make_group(recipe.amax_history_len(), Fp8FwdTensors::kCount, recipe.forward_dtype(), device);
  state->backward = make_group(recipe.amax_history_len(), Fp8BwdTensors::kCount, recipe.backward_dtype(), device);
  return state;
}

bool Fp8LinearState::fits(Device device, const Fp8Recipe& recipe) const {
  return forward.scale.device() == device && forward.amax_history.size(0) == recipe.amax_history_len() &&
         forward.fp8_dtype == recipe.forward_dtype() && backward.fp8_dtype == recipe.backward_dtype();
}

void Fp8LinearState::to(Device device) {
  for (kernels::Fp8ScalingTensors* g : {&forward, &backward}) {
    g->amax_history = g->amax_history.to(device);
    g->scale = g->scale.to(device);
    g->scale_inv = g->scale_inv.to(device);
  }
  weight_cache.clear();
}

Fp8LinearState::Entry Fp8LinearState::entry(const kernels::Fp8ScalingTensors& group, int64_t j) {
  return {group.scale.narrow(j, 1), group.scale_inv.narrow(j, 1), group.amax_history.select(0).narrow(j, 1)};
}

void Fp8LinearState::prepare(std::shared_ptr<Fp8LinearState>& state, Device device, const Fp8Recipe& recipe) {
  if (state != nullptr && !state->fits(device, recipe) && state->fits(state->forward.scale.device(), recipe)) {
    state->to(device);
  }
  if (state == nullptr || !state->fits(device, recipe)) state = create(device, recipe);  // a new layout starts afresh
}

Fp8LinearState::Snapshot Fp8LinearState::snapshot() const {
  const std::vector<float> fs = forward.scale.to_vector<float>(), bs = backward.scale.to_vector<float>();
  const std::vector<float> fh = forward.amax_history.to_vector<float>();
  const std::vector<float> bh = backward.amax_history.to_vector<float>();
  const int64_t fl = forward.amax_history.size(0), bl = backward.amax_history.size(0);
  constexpr int64_t kIn = Fp8FwdTensors::kInput, kW = Fp8FwdTensors::kWeight, kDy = Fp8BwdTensors::kGradOutput;
  constexpr int64_t nf = Fp8FwdTensors::kCount, nb = Fp8BwdTensors::kCount;
  return {fs[kIn],
          fs[kW],
          bs[kDy],
          latest_amax(fh, fl, nf, kIn),
          latest_amax(fh, fl, nf, kW),
          latest_amax(bh, bl, nb, kDy)};
}

// ---- the weight cast ------------------------------------------------------------------------------

bool Fp8WeightCache::Origin::is(const Tensor& t) const {
  return storage.lock() == t.storage() && offset == t.storage_offset() && version == t.version();
}

bool Fp8WeightCache::Origin::is_current() const {
  const std::shared_ptr<Storage> s = storage.lock();
  return s != nullptr && s->version() == version;
}

const kernels::Fp8Cast* Fp8WeightCache::find(const Tensor& weight, bool need_transposed) const {
  if (supplied_ || !cast_.data.defined() || !origin_.is(weight)) return nullptr;
  return need_transposed && !cast_.transposed.defined() ? nullptr : &cast_;
}

void Fp8WeightCache::store(const Tensor& weight, kernels::Fp8Cast cast) {
  cast_ = std::move(cast);
  origin_ = Origin::of(weight);
  supplied_ = false;
}

void Fp8WeightCache::supply(kernels::Fp8Cast cast, const Tensor& source) {
  cast_ = std::move(cast);
  origin_ = Origin::of(source);
  supplied_ = true;
}

void Fp8WeightCache::clear() {
  cast_ = {};
  origin_ = {};
  supplied_ = false;
}

Fp8LinearState::Entry record_weight_amax(Fp8LinearState& state, const Tensor& amax, const Fp8Recipe& recipe) {
  const Fp8LinearState::Entry w = Fp8LinearState::entry(state.forward, Fp8FwdTensors::kWeight);
  if (!recipe.is_delayed()) w.amax.zero_();
  kernels::fp8_amax_(amax, w.amax);  // slot ← max(slot, amax): amaxes are >= 0
  if (!recipe.is_delayed()) {
    kernels::fp8_scale_from_amax_(w.amax, w.scale, w.scale_inv, state.forward.fp8_dtype, recipe.margin());
  }
  return w;
}

// ---- when scales are updated ----------------------------------------------------------------------

namespace {

// Layers waiting for a scale update, grouped by the config they ran under.
struct PendingGroup {
  std::shared_ptr<const Fp8Config> config;
  std::vector<std::shared_ptr<Fp8LinearState>> states;
  std::unordered_set<const Fp8LinearState*> seen;  // a layer run twice updates once
};

class Pending {
 public:
  void add(const std::shared_ptr<const Fp8Config>& config, const std::shared_ptr<Fp8LinearState>& state) {
    PendingGroup* group = nullptr;
    for (PendingGroup& g : groups_) {
      if (g.config == config) group = &g;
    }
    if (group == nullptr) group = &groups_.emplace_back(PendingGroup{config, {}, {}});
    if (group->seen.insert(state.get()).second) group->states.push_back(state);
  }
  bool empty() const { return groups_.empty(); }
  // Hands the groups over and forgets them, so that a failing update is not retried forever.
  std::vector<PendingGroup> take() { return std::exchange(groups_, {}); }

 private:
  std::vector<PendingGroup> groups_;
};

// Scopes open on this thread, innermost last: each holds its config (null when it disables FP8).
thread_local std::vector<std::shared_ptr<const Fp8Config>> scopes;
thread_local Pending pending_forward;
thread_local Pending pending_backward;
// Activation recompute: the recorders open on this thread, and the replay under way (or null).
thread_local std::vector<Fp8ForwardRecorder*> recorders;
thread_local const Fp8ForwardRecord* replaying = nullptr;

// Max-reduces row 0 of every history across ranks in one call, then runs delayed scaling's update.
void update_scales(std::vector<PendingGroup> groups, bool forward) {
  for (PendingGroup& group : groups) {
    const Fp8Recipe& recipe = group.config->recipe;
    if (!recipe.is_delayed() || group.states.empty()) continue;
    std::vector<kernels::Fp8ScalingTensors> tensors;
    for (const auto& state : group.states) tensors.push_back(forward ? state->forward : state->backward);
    if (group.config->amax_reducer) {
      std::vector<Tensor> heads;
      for (const auto& t : tensors) heads.push_back(t.amax_history.select(0));
      const Tensor reduced = kernels::concat(heads, 0);
      group.config->amax_reducer(reduced);
      int64_t offset = 0;
      for (const Tensor& head : heads) {
        head.copy_(reduced.narrow(offset, head.numel()));
        offset += head.numel();
      }
    }
    const DelayedScaling& d = recipe.delayed();
    kernels::fp8_update_scales_(tensors, d.margin, d.amax_compute_algo);
  }
}

}  // namespace

Fp8Autocast::Fp8Autocast(bool enabled, Fp8Recipe recipe, AmaxReducer amax_reducer)
    : uncaught_at_entry_(std::uncaught_exceptions()) {
  scopes.push_back(enabled ? std::make_shared<const Fp8Config>(Fp8Config{std::move(recipe), std::move(amax_reducer)})
                           : nullptr);
}

Fp8Autocast::~Fp8Autocast() noexcept(false) {
  scopes.pop_back();
  if (!scopes.empty()) return;
  std::vector<PendingGroup> groups = pending_forward.take();
  // Leaving by an exception: the step did not complete, so its amaxes are dropped unapplied (and
  // throwing here would terminate the program).
  if (std::uncaught_exceptions() > uncaught_at_entry_) return;
  update_scales(std::move(groups), /*forward=*/true);
}

std::shared_ptr<const Fp8Config> fp8_config() { return scopes.empty() ? nullptr : scopes.back(); }

bool fp8_enabled() { return fp8_config() != nullptr; }

struct Fp8ForwardRecord {
  std::shared_ptr<const Fp8Config> config;
  struct Ran {
    std::shared_ptr<Fp8LinearState> state;
    Tensor scale, scale_inv;  // the forward scales it ran with
  };
  std::vector<Ran> ran;
};

void fp8_forward_ran(const std::shared_ptr<Fp8LinearState>& state) {
  const std::shared_ptr<const Fp8Config> config = fp8_config();
  OCTET_CHECK(config != nullptr, "fp8_forward_ran: called outside an enabled Fp8Autocast scope");
  for (Fp8ForwardRecorder* recorder : recorders) {
    auto& states = recorder->states_;
    if (std::find(states.begin(), states.end(), state) == states.end()) states.push_back(state);
  }
  if (replaying != nullptr) {
    const auto& ran = replaying->ran;
    OCTET_CHECK(std::any_of(ran.begin(), ran.end(), [&](const auto& r) { return r.state == state; }),
                "activation recompute under FP8: the rerun in backward ran an FP8 Linear that the forward did not; "
                "the recomputed function must run the same layers both times");
    return;  // the forward recorded this layer's amaxes and queued its update already
  }
  pending_forward.add(config, state);
}

Fp8ForwardRecorder::Fp8ForwardRecorder() : config_(fp8_config()) {
  OCTET_CHECK(config_ != nullptr, "Fp8ForwardRecorder: open it inside an enabled Fp8Autocast scope");
  recorders.push_back(this);
}

Fp8ForwardRecorder::~Fp8ForwardRecorder() {
  if (open_) recorders.erase(std::find(recorders.begin(), recorders.end(), this));
}

std::shared_ptr<const Fp8ForwardRecord> Fp8ForwardRecorder::finish() {
  OCTET_CHECK(open_, "Fp8ForwardRecorder::finish: called twice");
  recorders.erase(std::find(recorders.begin(), recorders.end(), this));
  open_ = false;
  auto record = std::make_shared<Fp8ForwardRecord>();
  record->config = config_;
  for (const auto& state : states_) {
    record->ran.push_back({state, state->forward.scale.clone(), state->forward.scale_inv.clone()});
  }
  return record;
}

Fp8Replay::Fp8Replay(std::shared_ptr<const Fp8ForwardRecord> record) : record_(std::move(record)), outer_(replaying) {
  OCTET_CHECK(record_ != nullptr, "Fp8Replay: no record; open an Fp8ForwardRecorder around the first run");
  for (const auto& r : record_->ran) {
    const kernels::Fp8ScalingTensors& f = r.state->forward;
    saved_.push_back({f.scale.clone(), f.scale_inv.clone(), f.amax_history.select(0).clone()});
    f.scale.copy_(r.scale);
    f.scale_inv.copy_(r.scale_inv);
  }
  scopes.push_back(record_->config);
  replaying = record_.get();
}

Fp8Replay::~Fp8Replay() {
  replaying = outer_;
  scopes.pop_back();
  try {
    for (size_t i = 0; i < saved_.size(); ++i) {
      const kernels::Fp8ScalingTensors& f = record_->ran[i].state->forward;
      f.scale.copy_(saved_[i].scale);
      f.scale_inv.copy_(saved_[i].scale_inv);
      f.amax_history.select(0).copy_(saved_[i].history_row0);
    }
  } catch (const std::exception& e) {
    logging::error("Fp8Replay: could not put the FP8 scales back after a recompute: {}", e.what());
  }
}

void fp8_backward_ran(const std::shared_ptr<Fp8LinearState>& state, const std::shared_ptr<const Fp8Config>& config) {
  // One callback per layer, of which the first does the work: a flag saying "already queued" would
  // stay set forever after a pass that threw before its callbacks ran.
  autograd::queue_callback([] {
    if (!pending_backward.empty()) update_scales(pending_backward.take(), /*forward=*/false);
  });
  pending_backward.add(config, state);
}

int64_t fp8_weight_cast_bytes(Module& model) {
  int64_t bytes = 0;
  for (const auto& [name, m] : model.named_modules()) {
    const auto* linear = dynamic_cast<const Linear*>(m.get());
    if (linear == nullptr || linear->fp8_state == nullptr || linear->fp8_state->weight_cache.supplied()) continue;
    const kernels::Fp8Cast& cast = linear->fp8_state->weight_cache.cast();
    for (const Tensor& t : {cast.data, cast.transposed}) {
      if (t.defined() && t.storage()->allocated()) bytes += static_cast<int64_t>(t.nbytes());
    }
  }
  return bytes;
}

int64_t fp8_scaling_bytes(Module& model) {
  int64_t bytes = 0;
  for (const auto& [name, m] : model.named_modules()) {
    const auto* linear = dynamic_cast<const Linear*>(m.get());
    if (linear == nullptr || linear->fp8_state == nullptr) continue;
    for (const kernels::Fp8ScalingTensors* g : {&linear->fp8_state->forward, &linear->fp8_state->backward}) {
      for (const Tensor& t : {g->amax_history, g->scale, g->scale_inv}) bytes += static_cast<int64_t>(t.nbytes());
    }
  }
  return bytes;
}

// ---- saving -------------------------------------------------------------------------------------------

namespace {

constexpr const char* kGroups[] = {"forward", "backward"};

kernels::Fp8ScalingTensors& group_of(Fp8LinearState& state, int g) { return g == 0 ? state.forward : state.backward; }

// "blocks.0.mlp.fc1.fp8.forward." ("fp8.forward." for a model that is itself a Linear).
std::string key_prefix(const std::string& path, int g) {
  return (path.empty() ? std::string() : path + ".") + "fp8." + kGroups[g] + ".";
}

}  // namespace

std::map<std::string, Tensor> fp8_state_dict(Module& model) {
  std::map<std::string, Tensor> out;
  for (const auto& [path, module] : model.named_modules()) {
    auto* linear = dynamic_cast<Linear*>(module.get());
    if (linear == nullptr || linear->fp8_state == nullptr) continue;
    for (int g = 0; g < 2; ++g) {
      const kernels::Fp8ScalingTensors& t = group_of(*linear->fp8_state, g);
      const std::string prefix = key_prefix(path, g);
      out[prefix + "scale"] = t.scale;
      out[prefix + "scale_inv"] = t.scale_inv;
      out[prefix + "amax_history"] = t.amax_history;
      out[prefix + "fp8_dtype"] = full({1}, static_cast<double>(static_cast<int>(t.fp8_dtype)), DType::u8);
    }
  }
  return out;
}

void load_fp8_state_dict(Module& model, const std::map<std::string, Tensor>& state) {
  std::unordered_set<std::string> used;
  for (const auto& [path, module] : model.named_modules()) {
    auto* linear = dynamic_cast<Linear*>(module.get());
    if (linear == nullptr || state.count(key_prefix(path, 0) + "scale") == 0) continue;
    auto loaded = std::make_shared<Fp8LinearState>();
    const Device device = linear->weight.device();
    for (int g = 0; g < 2; ++g) {
      const std::string prefix = key_prefix(path, g);
      auto get = [&](const std::string& name) -> const Tensor& {
        const auto it = state.find(prefix + name);
        OCTET_CHECK(it != state.end(), "load_fp8_state_dict: ", prefix + name,
                    " is missing; an FP8 state is saved whole by fp8_state_dict");
        used.insert(it->first);
        return it->second;
      };
      const Tensor& history = get("amax_history");
      const int64_t n = g == 0 ? Fp8FwdTensors::kCount : Fp8BwdTensors::kCount;
      OCTET_CHECK(history.dim() == 2 && history.size(1) == n && history.dtype() == DType::f32, "load_fp8_state_dict: ",
                  prefix, "amax_history is ", history.describe(), ", expected f32[L, ", n, "]");
      kernels::Fp8ScalingTensors& t = group_of(*loaded, g);
      t.amax_history = history.to(device).clone();
      for (const char* name : {"scale", "scale_inv"}) {
        const Tensor& v = get(name);
        OCTET_CHECK(v.shape() == Shape{n} && v.dtype() == DType::f32, "load_fp8_state_dict: ", prefix, name, " is ",
                    v.describe(), ", expected f32[", n, "]");
        (std::string(name) == "scale" ? t.scale : t.scale_inv) = v.to(device).clone();
      }
      const int code = static_cast<int>(get("fp8_dtype").item());
      t.fp8_dtype = static_cast<DType>(code);
      OCTET_CHECK(is_fp8(t.fp8_dtype), "load_fp8_state_dict: ", prefix, "fp8_dtype holds ", code,
                  ", which is not an FP8 dtype; the checkpoint is corrupt");
    }
    linear->fp8_state = loaded;
  }
  for (const auto& [key, value] : state) {
    OCTET_CHECK(used.count(key) != 0, "load_fp8_state_dict: ", key,
                " belongs to no Linear of this model; was the checkpoint saved from another model?");
  }
}

}  // namespace octet::nn
