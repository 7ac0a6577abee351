#pragma once
// CPU GEMM backend: strided batches of row-major GEMMs through OpenBLAS.
#include <cstdint>

namespace octet::kernels::cpu {

// For each batch i: C_i = alpha · op(A_i) · op(B_i) + beta · C_i, row-major, with A_i at a + i·stride_a
// (stride 0 shares one matrix across the batch). M, N, K are the extents of op(A) [M, K], op(B) [K, N].
template <class T>
void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                          int64_t stride_a, const T* b, int64_t stride_b, T beta, T* c, int64_t stride_c,
                          int64_t batch);

}  // namespace octet::kernels::cpu
