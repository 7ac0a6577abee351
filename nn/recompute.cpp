#include "nn/recompute.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "autograd/checkpoint.h"
#include "core/grad_mode.h"
#include "core/random.h"
#include "nn/fp8.h"
#include "nn/layers.h"

namespace octet::nn {

Tensor recompute(Module& module, const std::function<Tensor(const Tensor&)>& fn, const Tensor& x) {
  if (!GradMode::is_enabled()) return fn(x);
  // What the rerun in backward must find as the first run found it: the random streams, and under
  // FP8 the scales the first run cast with.
  struct Rerun {
    struct Stream {
      Generator* gen;
      uint64_t seed, offset, seed_after = 0, offset_after = 0;
    };
    std::vector<Stream> streams;
    std::shared_ptr<const Fp8ForwardRecord> fp8;
    std::optional<Fp8Replay> replay;
  };
  auto rerun = std::make_shared<Rerun>();
  // The default stream, and those the module's random layers draw from (with p > 0: the others draw
  // nothing), each once.
  auto keep = [&](Generator& g) {
    const auto& s = rerun->streams;
    if (std::none_of(s.begin(), s.end(), [&](const auto& k) { return k.gen == &g; })) {
      rerun->streams.push_back({&g, g.seed(), g.offset()});
    }
  };
  keep(default_generator());
  for (const auto& [name, m] : module.named_modules()) {
    if (const auto* d = dynamic_cast<const Dropout*>(m.get()); d != nullptr && d->p > 0) keep(d->generator());
    if (const auto* d = dynamic_cast<const DropPath*>(m.get()); d != nullptr && d->p > 0) keep(d->generator());
  }
  const bool fp8 = fp8_enabled();
  auto restore = [rerun] {
    for (auto& s : rerun->streams) {
      s.seed_after = s.gen->seed();
      s.offset_after = s.gen->offset();
      s.gen->set_state(s.seed, s.offset);
    }
    if (rerun->fp8) rerun->replay.emplace(rerun->fp8);
  };
  auto release = [rerun] {
    rerun->replay.reset();
    for (const auto& s : rerun->streams) s.gen->set_state(s.seed_after, s.offset_after);
  };
  auto run = [fn, rerun, fp8](const std::vector<Tensor>& in) {
    if (!fp8 || rerun->replay.has_value()) return std::vector<Tensor>{fn(in[0])};
    Fp8ForwardRecorder recorder;  // the first run, under FP8
    std::vector<Tensor> out{fn(in[0])};
    rerun->fp8 = recorder.finish();
    return out;
  };
  return autograd::checkpoint(run, {x}, restore, release)[0];
}

}  // namespace octet::nn
