// Autotuning's switch and choice rule (kernels/autotune.h); the timing is in
// kernels/cuda/autotune_cuda.cpp.
#include "kernels/autotune.h"

#include <atomic>

namespace octet::kernels {

namespace {
std::atomic<bool> autotune{false};
std::atomic<int> tuned_problems{0};
}  // namespace

void set_autotune(bool on) { autotune.store(on, std::memory_order_relaxed); }
bool autotune_enabled() { return autotune.load(std::memory_order_relaxed); }

int autotune_pick(const std::vector<double>& seconds, double margin) {
  int fastest = -1;
  for (int i = 0; i < static_cast<int>(seconds.size()); ++i) {
    if (seconds[i] >= 0.0 && (fastest < 0 || seconds[i] < seconds[fastest])) fastest = i;
  }
  if (fastest <= 0 || seconds[0] < 0.0) return fastest;
  return seconds[fastest] < seconds[0] * (1.0 - margin) ? fastest : 0;
}

int autotuned_problems() { return tuned_problems.load(std::memory_order_relaxed); }
void count_autotuned_problem() { tuned_problems.fetch_add(1, std::memory_order_relaxed); }

}  // namespace octet::kernels
