// Autotuning's timing on the GPU (kernels/cuda/autotune_cuda.h).
#include "kernels/cuda/autotune_cuda.h"

#include <algorithm>
#include <array>
#include <vector>

#include "core/cuda_stream.h"
#include "core/log.h"
#include "kernels/autotune.h"

namespace octet::kernels::cuda {

namespace {

// CUDA events, destroyed on every path out.
struct Events {
  std::array<cudaEvent_t, kAutotuneTimedRuns + 1> e{};
  Events() {
    for (cudaEvent_t& event : e) octet::cuda::check(cudaEventCreate(&event), "autotune: cudaEventCreate");
  }
  ~Events() {
    for (cudaEvent_t event : e) {
      if (event != nullptr) cudaEventDestroy(event);
    }
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

// The median time of run() in seconds over kAutotuneTimedRuns runs after an untimed one, or -1 when
// the library refuses it. Waits for the stream.
double median_seconds(cudaStream_t stream, const std::function<bool()>& run, Events& events) {
  if (!run()) return -1.0;
  for (int r = 0; r < kAutotuneTimedRuns; ++r) {
    octet::cuda::check(cudaEventRecord(events.e[r], stream), "autotune: cudaEventRecord");
    if (!run()) return -1.0;
  }
  octet::cuda::check(cudaEventRecord(events.e[kAutotuneTimedRuns], stream), "autotune: cudaEventRecord");
  octet::cuda::check(cudaEventSynchronize(events.e[kAutotuneTimedRuns]), "autotune: cudaEventSynchronize");
  std::array<double, kAutotuneTimedRuns> seconds{};
  for (int r = 0; r < kAutotuneTimedRuns; ++r) {
    float ms = 0.f;
    octet::cuda::check(cudaEventElapsedTime(&ms, events.e[r], events.e[r + 1]), "autotune: cudaEventElapsedTime");
    seconds[r] = 1e-3 * ms;
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[kAutotuneTimedRuns / 2];
}

}  // namespace

int time_candidates(cudaStream_t stream, int count, const std::function<bool(int)>& run, const char* kind,
                    const std::function<std::string()>& what) {
  Events events;
  std::vector<double> seconds;
  for (int i = 0; i < count; ++i) seconds.push_back(median_seconds(stream, [&] { return run(i); }, events));
  const int pick = autotune_pick(seconds);
  count_autotuned_problem();
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
