// Autotuning's timing on the GPU (kernels/cuda/autotune_cuda.h).
#include "kernels/cuda/autotune_cuda.h"

#include <algorithm>
#include <array>
#include <memory>
#include <vector>

#include "core/cuda_stream.h"
#include "core/log.h"
#include "kernels/autotune.h"

namespace octet::kernels::cuda {

namespace {

// After a candidate the library refused: a refused launch leaves CUDA's last-error flag set, which
// the next launch's check would report as its own failure, so it is cleared here. An error that
// stays (a sticky one: the device is lost to this process) is this candidate's doing, and thrown.
void clear_refusal() {
  (void)cudaGetLastError();
  octet::cuda::check(cudaPeekAtLastError(), "autotune: a candidate left the GPU in error");
}

// The median time of run() in seconds over kAutotuneTimedRuns runs after an untimed one, or -1 when
// the library refuses it. The host waits for the stream (one counted synchronisation, core/host_sync.h)
// unless the candidate was refused.
double median_seconds(cudaStream_t stream, const std::function<bool()>& run,
                      std::array<std::unique_ptr<octet::cuda::Event>, kAutotuneTimedRuns + 1>& events) {
  if (!run()) return -1.0;
  for (int r = 0; r < kAutotuneTimedRuns; ++r) {
    events[r]->record(stream);
    if (!run()) return -1.0;
  }
  events[kAutotuneTimedRuns]->record(stream);
  events[kAutotuneTimedRuns]->synchronize();
  std::array<double, kAutotuneTimedRuns> seconds{};
  for (int r = 0; r < kAutotuneTimedRuns; ++r) seconds[r] = 1e-3 * events[r + 1]->elapsed_ms(*events[r]);
  std::sort(seconds.begin(), seconds.end());
  return seconds[kAutotuneTimedRuns / 2];
}

}  // namespace

int time_candidates(cudaStream_t stream, int count, const std::function<bool(int)>& run, const char* kind,
                    const std::function<std::string()>& what) {
  count_autotuned_problem();
  if (count == 1) {  // nothing to choose between
    logging::info("autotune: {}: the one {} offered", what(), kind);
    return 0;
  }
  std::array<std::unique_ptr<octet::cuda::Event>, kAutotuneTimedRuns + 1> events;
  for (auto& event : events) event = std::make_unique<octet::cuda::Event>(/*timing=*/true);
  std::vector<double> seconds;
  bool refused = false;
  for (int i = 0; i < count; ++i) {
    seconds.push_back(median_seconds(stream, [&] { return run(i); }, events));
    if (seconds.back() < 0.0) {
      refused = true;
      clear_refusal();
    }
  }
  // A refused candidate may have runs still queued: the caller frees the losers when this returns.
  if (refused) {
    events[0]->record(stream);
    events[0]->synchronize();
  }
  const int pick = autotune_pick(seconds);
  if (pick < 0) {
    logging::info("autotune: {}: none of the {} {}s offered ran", what(), count, kind);
  } else if (seconds[0] >= 0.0) {
    logging::info("autotune: {}: {} {} of {} ({:.1f} us; the first: {:.1f} us)", what(), kind, pick + 1, count,
                  1e6 * seconds[pick], 1e6 * seconds[0]);
  } else {
    logging::info("autotune: {}: {} {} of {} ({:.1f} us; the first did not run)", what(), kind, pick + 1, count,
                  1e6 * seconds[pick]);
  }
  return pick;
}

}  // namespace octet::kernels::cuda
