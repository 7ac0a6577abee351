#pragma once
// The CPU thread count, for both halves of the CPU backend: Octet's own OpenMP loops and OpenBLAS's
// GEMM threads. A training program sets it once (train_vit's --threads).

namespace octet::kernels {

void set_num_threads(int threads);  // threads >= 1
int num_threads();

}  // namespace octet::kernels
