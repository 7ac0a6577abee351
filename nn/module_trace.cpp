#include "nn/module_trace.h"

#include <algorithm>
#include <atomic>
#include <unordered_map>
#include <utility>

#include "autograd/engine.h"
#include "core/trace.h"

namespace octet::nn {

namespace {

// What the hooks of one traced module share: its span names and the starts of its forward calls in
// flight. No tensor and no module pointer, so hooks left on a graph hold nothing heavy.
struct TracedModule {
  std::string forward_name, backward_name;
  std::vector<int64_t> forward_starts;  // one per call in flight (a module may call itself)
  std::atomic<bool> removed{false};
};

// The backward span of one call, shared by the hooks that start and end it.
struct BackwardCall {
  explicit BackwardCall(std::shared_ptr<TracedModule> module) : module(std::move(module)) {}

  void start(int64_t now) { start_us = now; }
  void end(int64_t now) {
    if (start_us < 0) return;  // the output's gradient never came (or recording began mid-pass)
    if (!module->removed.load(std::memory_order_relaxed)) {
      trace::complete(module->backward_name, "backward", "compute", start_us, now);
    }
    start_us = -1;  // a second pass over a retained graph records a second span
  }

  std::shared_ptr<TracedModule> module;
  int64_t start_us = -1;
  bool ends_with_pass = false;  // no gradient of the input to watch (see pass_end)
};
using CallList = std::vector<std::shared_ptr<BackwardCall>>;

// The end of a call's backward is the moment its input's gradient is complete. When the input has
// no gradient (the images entering the first module) or is a leaf (whose hooks would outlive the step:
// a tensor keeps its hooks for its whole life and none can be removed), nothing downstream of the
// input runs, so the span ends when the pass has processed every node: an autograd::queue_callback.
// A post-accumulate hook on the module's parameters was the other candidate; it is not used because
// those hooks cannot be removed either (they would pile up on every parameter, one per traced call),
// and modules without parameters would have no end at all.
//
// The callback is queued by the first traced hook of each pass, when the root's output gradient
// arrives and before any parameter gradient is accumulated, so it runs before the callbacks queued
// from gradient hooks (DDP waiting for its buckets): the first module's span ends when its compute
// ends, not after the communication that follows it.
struct PassEnd {
  CallList waiting;
};
// Expires when the callback that owns it has run or was dropped with a failed pass.
thread_local std::weak_ptr<PassEnd> current_pass_end;

PassEnd& pass_end() {
  if (std::shared_ptr<PassEnd> existing = current_pass_end.lock()) return *existing;
  auto created = std::make_shared<PassEnd>();
  autograd::queue_callback([created] {
    if (!trace::enabled()) return;
    const int64_t now = trace::now_us();
    for (const auto& call : created->waiting) call->end(now);
  });
  current_pass_end = created;
  return *created;
}

// The tracer's one gradient hook on a tensor. When the tensor's gradient is complete it ends the
// spans of the calls that took the tensor as input before it starts those of the calls that returned
// it, all at one timestamp. Separate hooks would fire in registration order, producer first, and a
// clock tick between them would make two neighbouring spans on the track overlap without nesting.
struct GradientWatch {
  CallList ends;        // calls that took the tensor as input
  CallList starts;      // calls that returned it
  CallList identities;  // calls that returned their input itself (Dropout with p = 0): both here

  void fire() {
    PassEnd& end_of_pass = pass_end();
    const int64_t now = trace::now_us();
    for (const auto& call : ends) call->end(now);
    for (const auto& call : starts) {
      call->start(now);
      if (call->ends_with_pass) end_of_pass.waiting.push_back(call);
    }
    for (const auto& call : identities) {
      call->start(now);
      call->end(now);
    }
  }
};

// Finds the watch already on a tensor, so that the calls meeting at one tensor share it. Tensors are
// known by their hook list (AutogradMeta::hooks), which lives exactly as long as the hooks on it: a
// weak reference to it tells a live entry from an address reused by a later tensor, without keeping
// any tensor alive.
class WatchRegistry {
 public:
  GradientWatch& watch(const Tensor& t) {
    const std::shared_ptr<std::vector<GradHook>>& hooks = t.impl()->autograd_meta().hooks;
    const auto found = entries_.find(hooks.get());
    if (found != entries_.end() && found->second.hooks.lock() == hooks) {
      if (std::shared_ptr<GradientWatch> existing = found->second.watch.lock()) return *existing;
    }
    auto created = std::make_shared<GradientWatch>();
    Tensor(t).register_hook([created](const Tensor&) -> Tensor {
      if (trace::enabled()) created->fire();
      return {};
    });
    entries_[hooks.get()] = Entry{hooks, created};
    if (entries_.size() >= purge_at_) {  // amortised: each step's tensors are gone by the next
      std::erase_if(entries_, [](const auto& entry) { return entry.second.hooks.expired(); });
      purge_at_ = std::max<size_t>(64, 2 * entries_.size());
    }
    return *created;
  }

 private:
  struct Entry {
    std::weak_ptr<std::vector<GradHook>> hooks;
    std::weak_ptr<GradientWatch> watch;
  };
  std::unordered_map<const void*, Entry> entries_;
  size_t purge_at_ = 64;
};

// Hangs the backward span of one finished forward call on its output's and input's gradients.
void watch_backward(WatchRegistry& registry, const std::shared_ptr<TracedModule>& module, const Tensor& input,
                    const Tensor& output) {
  if (!output.defined() || !output.requires_grad() || output.is_leaf()) return;  // no backward through it
  auto call = std::make_shared<BackwardCall>(module);
  if (input.is_same(output)) {
    registry.watch(output).identities.push_back(std::move(call));
    return;
  }
  const bool input_watched = input.defined() && input.requires_grad() && !input.is_leaf();
  call->ends_with_pass = !input_watched;
  if (input_watched) registry.watch(input).ends.push_back(call);
  registry.watch(output).starts.push_back(std::move(call));
}

int depth_of(const std::string& dotted_name) {
  if (dotted_name.empty()) return 0;
  return 1 + static_cast<int>(std::count(dotted_name.begin(), dotted_name.end(), '.'));
}

}  // namespace

struct ModuleTracer::State {
  struct Hooked {
    std::string name;
    std::shared_ptr<Module> module;
    std::shared_ptr<TracedModule> traced;
    size_t pre_hook = 0, post_hook = 0;
  };
  std::vector<Hooked> hooked;
  std::shared_ptr<WatchRegistry> registry = std::make_shared<WatchRegistry>();
};

ModuleTracer::ModuleTracer(Module& root, int max_depth) : state_(std::make_unique<State>()) {
  OCTET_CHECK(max_depth >= 0 || max_depth == kEveryDepth, "ModuleTracer: max_depth ", max_depth,
              " must be >= 0 (0 traces the root only) or ModuleTracer::kEveryDepth");
  for (auto& [name, module] : root.named_modules()) {
    if (max_depth != kEveryDepth && depth_of(name) > max_depth) continue;
    auto traced = std::make_shared<TracedModule>();
    const std::string label = name.empty() ? module->name() : name;
    traced->forward_name = "forward " + label;
    traced->backward_name = "backward " + label;

    State::Hooked hooked{name, module, traced};
    hooked.pre_hook = module->register_forward_pre_hook([traced](Module&, const Tensor&) -> Tensor {
      if (trace::enabled()) traced->forward_starts.push_back(trace::now_us());
      return {};
    });
    std::shared_ptr<WatchRegistry> registry = state_->registry;
    hooked.post_hook = module->register_forward_hook(
        [traced, registry](Module&, const Tensor& input, const Tensor& output) -> Tensor {
          // Pop even when recording has stopped since the pre-hook, so no stale start is left behind.
          if (traced->forward_starts.empty()) return {};
          const int64_t start_us = traced->forward_starts.back();
          traced->forward_starts.pop_back();
          if (!trace::enabled()) return {};
          trace::complete(traced->forward_name, "forward", "compute", start_us, trace::now_us());
          watch_backward(*registry, traced, input, output);
          return {};
        });
    state_->hooked.push_back(std::move(hooked));
  }
}

ModuleTracer::~ModuleTracer() { remove(); }

ModuleTracer::ModuleTracer(ModuleTracer&&) noexcept = default;

ModuleTracer& ModuleTracer::operator=(ModuleTracer&& other) noexcept {
  if (this != &other) {
    remove();
    state_ = std::move(other.state_);
  }
  return *this;
}

void ModuleTracer::remove() {
  if (!state_) return;  // moved from
  for (State::Hooked& hooked : state_->hooked) {
    hooked.traced->removed.store(true, std::memory_order_relaxed);
    hooked.module->remove_hook(hooked.pre_hook);
    hooked.module->remove_hook(hooked.post_hook);
  }
  state_->hooked.clear();
}

std::vector<std::string> ModuleTracer::traced_modules() const {
  std::vector<std::string> names;
  if (!state_) return names;
  for (const State::Hooked& hooked : state_->hooked) names.push_back(hooked.name);
  return names;
}

}  // namespace octet::nn
