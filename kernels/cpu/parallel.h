#pragma once
// How the CPU kernels split work across OpenMP threads: one contiguous range per thread, decided by
// the size of the work and the thread count only, so results never depend on timing.
#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace octet::kernels::cpu {

// Below this many elements of work a kernel stays on one thread: waking threads costs more.
inline constexpr int64_t kParallelElements = int64_t{1} << 15;

// Calls fn(begin, end) once per thread on consecutive pieces of [0, n), or fn(0, n) on this thread
// when n is below `min_parallel` (or there is one thread).
template <class F>
void parallel_ranges(int64_t n, int64_t min_parallel, F&& fn) {
#ifdef _OPENMP
  if (n >= min_parallel && n > 1 && omp_get_max_threads() > 1) {
#pragma omp parallel
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
      if (hi > lo) fn(lo, hi);
    }
    return;
  }
#endif
  if (n > 0) fn(int64_t{0}, n);
}

}  // namespace octet::kernels::cpu
