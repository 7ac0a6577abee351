#pragma once
// Forward and backward spans per module, on the trace's "compute" track (core/trace.h), so that a
// timeline shows which layer ran when, and what communication overlapped it.
//
//   nn::ModuleTracer tracer(*model, /*max_depth=*/2);   // "blocks", "blocks.0", not "blocks.0.attn"
//   trace::start(rank);
//   loss = criterion((*model)(x), y); loss.backward();
//   trace::write("trace.rank0.json");
//
// For every module of the tree up to `max_depth` (the root is depth 0, "blocks" 1, "blocks.0" 2,
// "blocks.0.attn" 3), each call records
//   - "forward <name>" (category "forward"): from its forward pre-hook to its forward hook;
//   - "backward <name>" (category "backward"): from when the gradient of the call's output arrives
//     to when the gradient of its input is complete. When the input does not require grad, or is a
//     leaf (the images entering the first module), nothing downstream of the input marks the end, so
//     the span ends when the backward pass has processed its whole graph: after the module's parameter
//     gradients are accumulated, before the callbacks that gradient hooks queue (DDP waiting for its
//     buckets). A call whose output does not require grad (under NoGradGuard) has no backward span.
//   Spans that meet at one tensor share one timestamp (the previous module's backward ends exactly
//   where the next one starts), so the track always nests as Perfetto needs.
// The root is named by its type ("forward VisionTransformer"). A module called several times in a
// step gets a span per call. Containers that are never called (ModuleList) record nothing.
//
// On CUDA these are host times: when the work was enqueued, not when the GPU ran it. GPU-side spans
// for collectives come from the NCCL process group through trace::defer.
//
// The hooks stay installed while the tracer lives and cost one atomic load per hook when recording is
// off, so a program may install the tracer always and turn recording on with trace::start. They keep
// no tensor alive. Destroying the tracer (or remove()) removes its module hooks; gradient hooks it
// left on tensors of a graph already built do nothing from then on. Install it after hooks that
// replace a module's input or output (FSDP's), so that it sees the tensors the module really uses.
// One thread at a time may run the traced model's forward; the tracer must not outlive the modules.
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"

namespace octet::nn {

class ModuleTracer {
 public:
  static constexpr int kEveryDepth = -1;

  explicit ModuleTracer(Module& root, int max_depth = kEveryDepth);
  ~ModuleTracer();
  ModuleTracer(ModuleTracer&&) noexcept;
  ModuleTracer& operator=(ModuleTracer&&) noexcept;
  ModuleTracer(const ModuleTracer&) = delete;
  ModuleTracer& operator=(const ModuleTracer&) = delete;

  // Removes the hooks now (the destructor does the same); calling it twice is harmless.
  void remove();
  // The dotted names of the traced modules, pre-order ("" is the root); empty once removed.
  std::vector<std::string> traced_modules() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace octet::nn
