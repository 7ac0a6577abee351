#pragma once
// CPU GEMM backend: strided batches of row-major GEMMs, threaded by OpenMP, through OpenBLAS or, for
// f32 products with a narrow C, the tile kernels of kernels/cpu/tile_gemm.h.
#include <cstdint>

namespace octet::kernels::cpu {

// Makes OpenBLAS run every call on the calling thread (its pthreads pool set to one thread), and
// leaves it so. Octet splits its GEMMs across OpenMP threads itself, so OpenBLAS's own pool would
// only compete for the cores: after each threaded call its idle workers spin in sched_yield for a
// while, which on a 2-core machine took about 5% of a ViT step (restoring the pool after every call,
// as this once did, kept them spinning). Kernels that call gemm_on_caller_thread hold one; code that
// wants OpenBLAS's own threads, such as a benchmark's reference, uses kernels::OpenBlasThreads.
class BlasOnCallerThread {
 public:
  BlasOnCallerThread();
  BlasOnCallerThread(const BlasOnCallerThread&) = delete;
  BlasOnCallerThread& operator=(const BlasOnCallerThread&) = delete;
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

// A Linear's forward in f32, y[m, n] = x[m, k]·w[n, k]ᵀ + bias[n], with the bias added as each row
// is stored, when the product runs on the tile kernels (the f32 GEMMs above choose them by N).
// Returns false, having done nothing, when it does not: the caller then composes bias and GEMM.
// Same bits as that composition (C = bias, then C += x·wᵀ on the tiles).
bool linear_forward_tiled(int64_t m, int64_t n, int64_t k, const float* x, const float* w, const float* bias,
                          float* y);
// C[m, n] = alpha · op(A)·op(B) (+ bias[n] on every row) with C in bf16 (its bits), each element the
// f32 value the tiles compute rounded once to nearest even, as converting an f32 result would: the
// same bits without the f32 C in memory. Only where the tiles take the product in one pass over K
// (N at most 320; K at most 65536 floats of packed B divided by N rounded up to 16); returns false,
// having done nothing, otherwise (and for an empty product).
bool gemm_tiled_to_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                        const float* b, uint16_t* c, const float* bias = nullptr);
// Whether linear_forward_tiled takes a Linear with n outputs (and rows and inputs), so that a caller
// widening low-precision operands for it does so only when it will run.
bool linear_forward_takes_tiles(int64_t n);

}  // namespace octet::kernels::cpu
