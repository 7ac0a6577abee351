#include <cblas.h>

#include <climits>

#include "core/error.h"
#include "kernels/cpu/gemm_cpu.h"

namespace octet::kernels::cpu {

namespace {
// OpenBLAS takes 32-bit extents; refuse rather than wrap.
int blas_int(int64_t v, const char* what) {
  OCTET_CHECK(v <= INT_MAX, "gemm: ", what, " = ", v, " exceeds OpenBLAS's 32-bit limit");
  return static_cast<int>(v);
}

void call_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void call_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha, const double* a, int lda,
               const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
}  // namespace

template <class T>
void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                          int64_t stride_a, const T* b, int64_t stride_b, T beta, T* c, int64_t stride_c,
                          int64_t batch) {
  const int mi = blas_int(m, "M"), ni = blas_int(n, "N"), ki = blas_int(k, "K");
  // Row-major leading dims: the stored row length of each operand.
  const int lda = trans_a ? mi : ki;
  const int ldb = trans_b ? ki : ni;
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  // OpenBLAS threads inside each call; batches run one after another so threads never nest.
  for (int64_t i = 0; i < batch; ++i) {
    call_gemm(ta, tb, mi, ni, ki, alpha, a + i * stride_a, std::max(lda, 1), b + i * stride_b, std::max(ldb, 1),
              beta, c + i * stride_c, std::max(ni, 1));
  }
}

template void gemm_strided_batched<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                                          const float*, int64_t, float, float*, int64_t, int64_t);
template void gemm_strided_batched<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                                           const double*, int64_t, double, double*, int64_t, int64_t);

}  // namespace octet::kernels::cpu
