// GEMM autotuning's switch and choice rule (kernels/gemm_autotune.h); the timing is in
// kernels/cuda/cublaslt_context.cpp.
#include "kernels/gemm_autotune.h"

#include <atomic>

namespace octet::kernels {

namespace {
std::atomic<bool> autotune{false};
std::atomic<int> tuned_problems{0};
}  // namespace

void set_gemm_autotune(bool on) { autotune.store(on, std::memory_order_relaxed); }
bool gemm_autotune() { return autotune.load(std::memory_order_relaxed); }

int autotune_pick(const std::vector<double>& seconds, double margin) {
  int fastest = -1;
  for (int i = 0; i < static_cast<int>(seconds.size()); ++i) {
    if (seconds[i] >= 0.0 && (fastest < 0 || seconds[i] < seconds[fastest])) fastest = i;
  }
  if (fastest <= 0 || seconds[0] < 0.0) return fastest;
  return seconds[fastest] < seconds[0] * (1.0 - margin) ? fastest : 0;
}

int gemm_autotuned_problems() { return tuned_problems.load(std::memory_order_relaxed); }
void count_gemm_autotuned_problem() { tuned_problems.fetch_add(1, std::memory_order_relaxed); }

}  // namespace octet::kernels
