#pragma once
// FP8 training, the way Transformer Engine does it: inside an fp8_autocast scope every Linear that
// allows it (Linear::fp8_allowed) runs its three GEMMs in FP8 with per-tensor scales (nn/fp8_linear.h).
// Everything else (LayerNorm, softmax, attention, residual adds, the loss) stays in its own dtype.
//
//   nn::Fp8Recipe recipe = nn::DelayedScaling{.margin = 0, .amax_history_len = 1024};
//   {
//     nn::Fp8Autocast fp8(true, recipe);   // forward only; backward may run after the scope
//     loss = criterion(model(images), labels);
//   }                                      // on exit: forward amaxes reduced, scales updated
//   loss.backward();                       // at its end: gradient amaxes reduced, scales updated
//   optimizer.step();                      // writes the weights: their cached FP8 casts go stale
//
// Formats. E4M3 (max 448, 3 mantissa bits) for what the forward multiplies: activations and weights.
// Gradients have a wider dynamic range and tolerate less precision, so HYBRID casts them to E5M2
// (max 57344, 2 mantissa bits); E4M3 casts them to E4M3 too.
//
// Recipes. DelayedScaling scales each tensor with what past steps saw: it records every cast's amax
// in row 0 of an amax history, and once per step turns the history into the next scale
// (scale = fp8_max / amax / 2^margin, see kernels/fp8.h for the edge cases and the roll). The cast
// itself is then a single pass, at the price of a spike saturating for one step (the scale backs off
// on the next). CurrentScaling measures each tensor's amax just before casting it (one more pass over
// the tensor, no history, no lag).
//
// Amax reduction. Under data parallelism every rank must use the same scales, or the replicas drift.
// The scope takes an AmaxReducer: a function that replaces a 1-D f32 tensor of amaxes, in place, with
// its elementwise maximum over the ranks. nn sits below distributed in the layer order, so the
// distributed layer supplies it; single-process training passes none.
//
// The state each Linear keeps (Fp8LinearState) is inspectable and can be saved (fp8_state_dict).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/tensor.h"
#include "kernels/fp8.h"

namespace octet::nn {

class Module;

enum class Fp8Format {
  E4M3,    // E4M3 everywhere
  HYBRID,  // E4M3 forward (activations, weights), E5M2 backward (gradients)
};
using kernels::AmaxCompute;

struct DelayedScaling {
  int margin = 0;                 // scale = fp8_max / amax / 2^margin: headroom for growth
  int amax_history_len = 1024;    // past steps the amax is taken over
  AmaxCompute amax_compute_algo = AmaxCompute::Max;
  Fp8Format fp8_format = Fp8Format::HYBRID;
};

struct CurrentScaling {
  int margin = 0;
  Fp8Format fp8_format = Fp8Format::HYBRID;
};

class Fp8Recipe {
 public:
  Fp8Recipe(DelayedScaling delayed = {});  // NOLINT(google-explicit-constructor): a recipe is either
  Fp8Recipe(CurrentScaling current);       // NOLINT(google-explicit-constructor)

  bool is_delayed() const { return std::holds_alternative<DelayedScaling>(recipe_); }
  const DelayedScaling& delayed() const;  // throws unless is_delayed()
  int margin() const;
  Fp8Format format() const;
  int amax_history_len() const { return is_delayed() ? delayed().amax_history_len : 1; }
  DType forward_dtype() const { return DType::e4m3; }
  DType backward_dtype() const { return format() == Fp8Format::HYBRID ? DType::e5m2 : DType::e4m3; }
  // "delayed(margin=0, amax_history_len=1024, amax_compute_algo=max, fp8_format=HYBRID)"
  std::string describe() const;

 private:
  std::variant<DelayedScaling, CurrentScaling> recipe_;
};

// Replaces a 1-D f32 tensor of amaxes with its elementwise max across data-parallel ranks, in place.
using AmaxReducer = std::function<void(const Tensor& amaxes)>;

// The entries of a Linear's two scaling groups (Transformer Engine's FP8FwdTensors and FP8BwdTensors):
// forward.scale[Fp8FwdTensors::kWeight] is the weight's scale, and so on.
struct Fp8FwdTensors {
  static constexpr int64_t kInput = 0, kWeight = 1, kCount = 2;  // both E4M3
};
struct Fp8BwdTensors {
  static constexpr int64_t kGradOutput = 0, kCount = 1;  // E5M2 under HYBRID
};

// A Linear's FP8 weight cast, made once and reused by every forward and backward until the weight
// changes: the micro-batches of a step, and FSDP's re-gathers of the same weights. A cast is good
// while the bytes it was made from are: the same storage, at the same offset, at the same write
// version (Storage::version, bumped by every in-place write: an optimizer step, a load). A storage
// that FSDP releases and gathers again stays the same storage, and the gather restores its version
// when the shards have not changed, so a re-gathered unit keeps its casts as an unsharded model does.
//
// A wrapper may supply the cast instead (FSDP's FP8 all-gather, distributed/fsdp_fp8.h): the layer
// then uses it as it is and never reads its own weight, whose bytes may not even be there. A
// supplied cast is good while its source (FSDP's shard of the weight) is unchanged; a stale one is
// an error, not a silent re-cast.
class Fp8WeightCache {
 public:
  // The cast kept, when it is good for `weight` as it is now and has the transposed copy if
  // `need_transposed`; else null. Never a supplied cast: ask supplied() first.
  const kernels::Fp8Cast* find(const Tensor& weight, bool need_transposed) const;
  // Keeps `cast`, made from `weight` as it is now.
  void store(const Tensor& weight, kernels::Fp8Cast cast);
  // Keeps `cast`, made elsewhere from `source` as it is now.
  void supply(kernels::Fp8Cast cast, const Tensor& source);
  bool supplied() const { return supplied_; }
  // A supplied cast whose source has not been written since.
  bool supplied_is_current() const { return supplied_ && origin_.is_current(); }
  const kernels::Fp8Cast& cast() const { return cast_; }  // empty when nothing is kept
  void clear();

 private:
  // The bytes a cast was made from.
  struct Origin {
    std::weak_ptr<Storage> storage;
    size_t offset = 0;
    uint64_t version = 0;
    static Origin of(const Tensor& t) { return {t.storage(), t.storage_offset(), t.version()}; }
    bool is(const Tensor& t) const;  // `t` is the tensor this origin recorded, and unwritten since
    bool is_current() const;         // the storage still lives at the recorded version
  };
  kernels::Fp8Cast cast_;
  Origin origin_;
  bool supplied_ = false;
};

// The FP8 state of one Linear.
struct Fp8LinearState {
  kernels::Fp8ScalingTensors forward;   // entries Fp8FwdTensors
  kernels::Fp8ScalingTensors backward;  // entries Fp8BwdTensors

  // The [1] views of one entry's scale, scale_inv and its slot in history row 0 (the step's amax).
  struct Entry {
    Tensor scale, scale_inv, amax;
  };
  static Entry entry(const kernels::Fp8ScalingTensors& group, int64_t j);

  // Zero histories, unit scales, on `device`, laid out for `recipe`.
  static std::shared_ptr<Fp8LinearState> create(Device device, const Fp8Recipe& recipe);
  // Whether this state fits `recipe` on `device` (same history length and formats).
  bool fits(Device device, const Fp8Recipe& recipe) const;
  void to(Device device);  // moves the scales and histories; drops the cached weight cast
  // Makes `state` fit `recipe` on `device`: moved there when it fits the recipe elsewhere (the model
  // moved), created afresh when missing or laid out for another recipe. What fp8_linear does first.
  static void prepare(std::shared_ptr<Fp8LinearState>& state, Device device, const Fp8Recipe& recipe);

  Fp8WeightCache weight_cache;

  // Human-readable numbers for logs and docs (reads the device: a host sync).
  // The amaxes are the last completed step's: history row L-1 when L > 1, else row 0 (current
  // scaling records the latest cast's amax there).
  struct Snapshot {
    double input_scale, weight_scale, grad_output_scale;
    double input_amax, weight_amax, grad_output_amax;
  };
  Snapshot snapshot() const;
};

// Enables FP8 for the Linears run on this thread while it lives (scopes nest; the innermost decides
// whether FP8 is on and with which recipe). When the outermost scope ends, the forward scales of
// every layer that ran inside it are updated (delayed scaling), after amax reduction. Layers that
// did not run keep their history as it is. The destructor may throw (a reduction failing); it does
// nothing when the scope is left by an exception.
class Fp8Autocast {
 public:
  explicit Fp8Autocast(bool enabled = true, Fp8Recipe recipe = {}, AmaxReducer amax_reducer = nullptr);
  ~Fp8Autocast() noexcept(false);
  Fp8Autocast(const Fp8Autocast&) = delete;
  Fp8Autocast& operator=(const Fp8Autocast&) = delete;

 private:
  int uncaught_at_entry_;
};

// Transformer Engine's spelling: `auto scope = nn::fp8_autocast(true, recipe);`.
inline Fp8Autocast fp8_autocast(bool enabled = true, Fp8Recipe recipe = {}, AmaxReducer amax_reducer = nullptr) {
  return Fp8Autocast(enabled, std::move(recipe), std::move(amax_reducer));
}

// What an enabled scope runs under. A layer keeps its forward's config for its backward, which
// usually runs after the scope has ended.
struct Fp8Config {
  Fp8Recipe recipe;
  AmaxReducer amax_reducer;  // null for single-process training
};
// The innermost scope's config on this thread; null when FP8 is off (no scope, or a disabled one).
std::shared_ptr<const Fp8Config> fp8_config();
bool fp8_enabled();

// Called by an FP8 Linear when it has recorded forward amaxes: its forward scales are updated when the
// outermost scope ends. And when it has recorded a gradient amax during backward: its backward scales
// are updated once the backward pass ends (autograd::queue_callback). Under current scaling there is
// nothing to update and these only keep the bookkeeping uniform.
void fp8_forward_ran(const std::shared_ptr<Fp8LinearState>& state);
void fp8_backward_ran(const std::shared_ptr<Fp8LinearState>& state, const std::shared_ptr<const Fp8Config>& config);

// ---- activation recompute -----------------------------------------------------------------------------
// Recompute (autograd/checkpoint.h, TransformerBlock::recompute) runs a forward a second time inside
// backward. Under FP8 that rerun must give the first run's bits and leave the FP8 state as one forward
// would have:
//   - it casts with the scales the first run used, although the end of that run's scope has updated
//     them since (delayed scaling);
//   - it records no amax: the first run recorded them, and history row 0 now belongs to the next step;
//   - it queues no scale update.
// Fp8ForwardRecorder, open around the first run, notes every layer state that runs in FP8 and, at
// finish(), copies the forward scales they ran with. Fp8Replay, open around the rerun, reopens the first
// run's scope (its config), puts those scales in place, and on leaving puts back each state's scales and
// history row 0 as they were before it, so whatever the rerun's casts wrote there is gone. A layer
// that runs in the rerun but did not in the first run is an error: the rerun must be the same
// computation. (Transformer Engine's activation checkpointing does the same: it keeps the forward's
// scales for the recompute and skips the amax bookkeeping there.)
struct Fp8ForwardRecord;
class Fp8ForwardRecorder {
 public:
  Fp8ForwardRecorder();  // inside an enabled Fp8Autocast scope
  ~Fp8ForwardRecorder();
  Fp8ForwardRecorder(const Fp8ForwardRecorder&) = delete;
  Fp8ForwardRecorder& operator=(const Fp8ForwardRecorder&) = delete;
  // Stops noting; the scope's config and, for each state that ran, copies of its forward scales.
  std::shared_ptr<const Fp8ForwardRecord> finish();

 private:
  friend void fp8_forward_ran(const std::shared_ptr<Fp8LinearState>& state);
  std::shared_ptr<const Fp8Config> config_;
  std::vector<std::shared_ptr<Fp8LinearState>> states_;
  bool open_ = true;
};

class Fp8Replay {
 public:
  explicit Fp8Replay(std::shared_ptr<const Fp8ForwardRecord> record);
  ~Fp8Replay();  // never throws: it also runs when the rerun failed
  Fp8Replay(const Fp8Replay&) = delete;
  Fp8Replay& operator=(const Fp8Replay&) = delete;

 private:
  struct Saved {
    Tensor scale, scale_inv, history_row0;
  };
  std::shared_ptr<const Fp8ForwardRecord> record_;
  std::vector<Saved> saved_;  // parallel to the record's states: what they held before the replay
  const Fp8ForwardRecord* outer_;
};

// The scale a weight is cast with, from `amax`, the amax of the whole weight ([1] f32; over every
// rank's piece for a sharded weight). What the Linear does before casting its own weight and what
// FSDP's FP8 all-gather does before casting its shards of it, so that the two agree by construction:
// the amax goes to the weight's slot in history row 0 (delayed scaling keeps the larger of it and
// what the slot holds; current scaling replaces it) and, under current scaling, sets the weight's
// scale. Returns the weight's entry, whose scale the cast then uses.
Fp8LinearState::Entry record_weight_amax(Fp8LinearState& state, const Tensor& amax, const Fp8Recipe& recipe);

// Bytes of the FP8 weight casts the Linears of `model` keep for themselves (the E4M3 data and
// transpose in each Fp8WeightCache, kept across steps; supplied casts, views of a wrapper's buffers,
// are not counted).
int64_t fp8_weight_cast_bytes(Module& model);
// Bytes of the scaling state (amax histories, scales, scale_invs) of the Linears of `model` that have
// run in FP8. Made at a Linear's first FP8 forward and kept.
int64_t fp8_scaling_bytes(Module& model);

// The FP8 state of every Linear of `model` that has run in FP8, as
// "<module path>.fp8.{forward,backward}.{scale,scale_inv,amax_history}" (for checkpoints), and its
// inverse, which creates missing states. Loading checks shapes and names the offending key.
std::map<std::string, Tensor> fp8_state_dict(Module& model);
void load_fp8_state_dict(Module& model, const std::map<std::string, Tensor>& state);

}  // namespace octet::nn
