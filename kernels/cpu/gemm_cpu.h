#pragma once
// CPU GEMM backend: strided batches of row-major GEMMs through OpenBLAS, threaded by OpenMP.
#include <cstdint>

namespace octet::kernels::cpu {

// While alive, OpenBLAS runs every call on the calling thread (its pthreads pool is set to one
// thread and restored afterwards): kernels that call gemm_on_caller_thread from inside an OpenMP
// parallel region hold one, so that the two thread pools never compete for the cores.
class BlasOnCallerThread {
 public:
  BlasOnCallerThread();
  ~BlasOnCallerThread();
  BlasOnCallerThread(const BlasOnCallerThread&) = delete;
  BlasOnCallerThread& operator=(const BlasOnCallerThread&) = delete;

 private:
  int previous_;
};

// One row-major GEMM on the calling thread, C = alpha · op(A) · op(B) + beta · C with explicit leading
// dims. Call it with a BlasOnCallerThread alive.
template <class T>
void gemm_on_caller_thread(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                           int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// For each batch i: C_i = alpha · op(A_i) · op(B_i) + beta · C_i, row-major, with A_i at a + i·stride_a
// (stride 0 shares one matrix across the batch). M, N, K are the extents of op(A) [M, K], op(B) [K, N].
template <class T>
void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                          int64_t stride_a, const T* b, int64_t stride_b, T beta, T* c, int64_t stride_c,
                          int64_t batch);

}  // namespace octet::kernels::cpu
