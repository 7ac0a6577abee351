#pragma once
// The CPU thread count. Octet's CPU backend runs on OpenMP threads only: its own loops, and its
// GEMMs, which it splits across the threads and runs through OpenBLAS on each thread with
// OpenBLAS's pool at one thread (kernels/cpu/gemm_cpu.h says why). A training program sets the
// count once (train_vit's --threads).

namespace octet::kernels {

void set_num_threads(int threads);  // threads >= 1
int num_threads();

// While alive, OpenBLAS uses its own pool of `threads` threads, as for a program that calls
// cblas_sgemm directly: the benchmarks' references. Octet's next GEMM sets the pool back to one.
class OpenBlasThreads {
 public:
  explicit OpenBlasThreads(int threads);
  ~OpenBlasThreads();
  OpenBlasThreads(const OpenBlasThreads&) = delete;
  OpenBlasThreads& operator=(const OpenBlasThreads&) = delete;
};

}  // namespace octet::kernels
