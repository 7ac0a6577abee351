// CPU GEMM through OpenBLAS, with the threading done here.
//
// OpenBLAS's pthreads build keeps a thread pool of its own, and the other CPU kernels use OpenMP's.
// Two pools on the same cores fight: after each GEMM OpenBLAS's workers spin waiting for the next
// one while OpenMP wants the cores for a LayerNorm, and OpenMP's workers spin through the GEMM that
// follows. So OpenBLAS runs single-threaded inside OpenMP threads and every kernel shares one pool:
// a batch of GEMMs is split across threads by batch entry, a single GEMM by bands of output rows
// (or columns, when those are more). Each output element is still one OpenBLAS dot-product order,
// so results are the same on every run with the same thread count.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <type_traits>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/error.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/tile_gemm.h"

namespace octet::kernels::cpu {

namespace {
// Below this many multiply-adds a GEMM runs on one thread: starting threads would cost more.
constexpr int64_t kParallelMacs = int64_t{1} << 18;
// Bands of rows or columns are multiples of this, so each thread's band keeps whole register tiles.
constexpr int64_t kBandAlign = 32;

// How many bands `extent` rows (or columns) split into across `threads`: at most one per thread,
// each at least kBandAlign long.
int64_t band_count(int64_t extent, int64_t threads) {
  return std::min<int64_t>(threads, (extent + kBandAlign - 1) / kBandAlign);
}

// f(lo, hi) for each of `bands` bands of [0, extent), one thread each: edges on multiples of
// kBandAlign, the last band taking the remainder; an empty band is skipped.
template <class F>
void for_each_band(int64_t extent, int64_t bands, F&& f) {
  const int64_t units = (extent + kBandAlign - 1) / kBandAlign;
#pragma omp parallel for schedule(static) num_threads(static_cast<int>(bands)) if (bands > 1)
  for (int64_t band = 0; band < bands; ++band) {
    const int64_t lo = std::min(extent, units * band / bands * kBandAlign);
    const int64_t hi = band + 1 == bands ? extent : std::min(extent, units * (band + 1) / bands * kBandAlign);
    if (hi > lo) f(lo, hi);
  }
}

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

// An f32 product whose C is at most this wide (padded to whole vectors) runs on the tile kernels of
// kernels/cpu/tile_gemm.h rather than OpenBLAS: a transformer's Linear layers at widths up to a few
// hundred (a qkv projection of width 96·3 included), forward, input gradient and weight gradient.
// There the tiles reach the core's AVX-512 FMA rate, where OpenBLAS 0.3.21 (and MKL) run AVX2
// kernels on AMD CPUs they do not know, such as Zen 5, and reach half of it; against OpenBLAS's own
// AVX-512 kernels they are about even up to this width and fall behind beyond it (measured up to
// 512 columns, `bench/RESULTS.md`), where OpenBLAS's cache blocking pays. The choice depends on N
// only, never on M or K, so a layer's outputs come out the same bits whatever the batch size or the
// thread count.
constexpr int64_t kTileMaxWidth = 320;
// K is taken in chunks of this many floats of packed B (256 KB, a share of L2): each tile streams a
// chunk of B from L2 while its C block stays in registers, and C is written once per chunk.
constexpr int64_t kTileChunkFloats = int64_t{1} << 16;

bool use_tiles(int64_t n, int64_t batch) {
  return batch == 1 && tile_gemm::padded(n) <= kTileMaxWidth && tile_gemm::available();
}

int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}
}  // namespace

// The OpenMP build of OpenBLAS already runs single-threaded inside an OpenMP parallel region; this is
// for the pthreads build.
BlasOnCallerThread::BlasOnCallerThread() {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

// With k = 0 the product is an empty sum, so C = beta·C; BLAS leaves C untouched there instead (an
// uninitialised output when beta is 0).
template <class T>
void scale_for_empty_sum(int64_t rows, int64_t cols, int64_t ldc, T beta, T* c) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
  }
}

template <class T>
void gemm_on_caller_thread(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                           int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (k == 0) return scale_for_empty_sum(m, n, ldc, beta, c);
  call_gemm(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, blas_int(m, "M"),
            blas_int(n, "N"), blas_int(k, "K"), alpha, a, std::max(blas_int(lda, "lda"), 1), b,
            std::max(blas_int(ldb, "ldb"), 1), beta, c, std::max(blas_int(ldc, "ldc"), 1));
}

// The rows of packed B one pass of the tiles takes (kTileChunkFloats of them, whole rows, at least one vector's).
int64_t tile_chunk(int64_t n) { return std::max<int64_t>(tile_gemm::kLanes, kTileChunkFloats / tile_gemm::padded(n)); }

// One product on the tile kernels: B packed once (or used in place when its rows are whole vectors
// already), then bands of C's rows (or columns, when those are more) across the threads, as for
// OpenBLAS below. Each band runs K in chunks of rows of B: the first chunk applies beta (and adds
// the bias), the later ones accumulate onto C. A bf16 C (Out = uint16_t, its bits) takes one chunk
// only, with beta 0: its elements are rounded as they are stored, and a rounded C cannot be added to.
template <class Out>
void tiled_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                const float* b, float beta, Out* c, bool parallel, int64_t threads, const float* bias = nullptr) {
  int64_t ldb = n;
  std::unique_ptr<float[]> packed;  // not zeroed first: the packing writes every float of it
  if (trans_b || n % tile_gemm::kLanes != 0) {
    ldb = tile_gemm::padded(n);
    packed.reset(new float[static_cast<size_t>(k * ldb)]);
    // Packed B's k rows in bands across the threads, as C's below: a wide weight gradient's B (xᵀ,
    // [n, k] with k the tokens) is megabytes, and one thread packing it kept the others waiting.
    float* dst = packed.get();
    for_each_band(k, parallel ? band_count(k, threads) : 1, [&](int64_t lo, int64_t hi) {
      if (trans_b) {
        tile_gemm::pack_transposed(b + lo, k, n, hi - lo, dst + lo * ldb, ldb);  // B is [n, k]
      } else {
        tile_gemm::pack_rows(b + lo * n, n, hi - lo, n, dst + lo * ldb, ldb);  // B is [k, n]
      }
    });
    b = dst;
  }
  const int64_t chunk = tile_chunk(n);
  const int64_t a_row = trans_a ? 1 : k, a_col = trans_a ? m : 1;
  // C's rows [r0, r1) and columns [c0, c1).
  const auto block = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    if constexpr (std::is_same_v<Out, uint16_t>) {
      OCTET_CHECK(k <= chunk && beta == 0.0f, "tiled_gemm: a bf16 C takes one pass over K with beta 0");
      tile_gemm::multiply_to_bf16(r1 - r0, c1 - c0, k, alpha, a + r0 * a_row, a_row, a_col, b + c0, ldb,
                                  c + r0 * n + c0, n, bias != nullptr ? bias + c0 : nullptr);
    } else {
      for (int64_t p0 = 0; p0 < k; p0 += chunk) {
        const bool first = p0 == 0;
        tile_gemm::multiply(r1 - r0, c1 - c0, std::min(chunk, k - p0), alpha, a + r0 * a_row + p0 * a_col, a_row,
                            a_col, b + p0 * ldb + c0, ldb, first ? beta : 1.0f, c + r0 * n + c0, n,
                            first && bias != nullptr ? bias + c0 : nullptr);
      }
    }
  };
  const bool by_rows = m >= n;
  const int64_t extent = by_rows ? m : n;
  for_each_band(extent, parallel ? band_count(extent, threads) : 1, [&](int64_t lo, int64_t hi) {
    if (by_rows) {
      block(lo, hi, 0, n);
    } else {
      block(0, m, lo, hi);
    }
  });
}

template <class T>
void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                          int64_t stride_a, const T* b, int64_t stride_b, T beta, T* c, int64_t stride_c,
                          int64_t batch) {
  if (k == 0) {
    for (int64_t i = 0; i < batch; ++i) scale_for_empty_sum(m, n, n, beta, c + i * stride_c);
    return;
  }
  const int mi = blas_int(m, "M"), ni = blas_int(n, "N"), ki = blas_int(k, "K");
  // Row-major leading dims: the stored row length of each operand.
  const int lda = std::max(trans_a ? mi : ki, 1);
  const int ldb = std::max(trans_b ? ki : ni, 1);
  const int ldc = std::max(ni, 1);
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  const int64_t threads = max_threads();
  const bool parallel = threads > 1 && m * n * k * batch >= kParallelMacs;
  if constexpr (std::is_same_v<T, float>) {
    if (use_tiles(n, batch)) return tiled_gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c, parallel, threads);
  }
  BlasOnCallerThread single;

  if (batch >= threads || !parallel) {
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t i = 0; i < batch; ++i) {
      call_gemm(ta, tb, mi, ni, ki, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta, c + i * stride_c, ldc);
    }
    return;
  }
  // Fewer matrices than threads: split each C into bands along its longer side.
  const bool by_rows = m >= n;
  const int64_t extent = by_rows ? m : n;
  const int64_t bands = band_count(extent, threads);
  for (int64_t i = 0; i < batch; ++i) {
    const T* ai = a + i * stride_a;
    const T* bi = b + i * stride_b;
    T* ci = c + i * stride_c;
    for_each_band(extent, bands, [&](int64_t lo, int64_t hi) {
      const int len = static_cast<int>(hi - lo);
      if (by_rows) {
        // Rows lo..hi of op(A): row offset in A, or column offset when A is stored transposed.
        const T* a_band = ai + (trans_a ? lo : lo * lda);
        call_gemm(ta, tb, len, ni, ki, alpha, a_band, lda, bi, ldb, beta, ci + lo * ldc, ldc);
      } else {
        // Columns lo..hi of op(B): column offset in B, or row offset when B is stored transposed.
        const T* b_band = bi + (trans_b ? lo * ldb : lo);
        call_gemm(ta, tb, mi, len, ki, alpha, ai, lda, b_band, ldb, beta, ci + lo, ldc);
      }
    });
  }
}

bool linear_forward_takes_tiles(int64_t n) { return use_tiles(n, 1); }

bool gemm_tiled_to_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                        const float* b, uint16_t* c, const float* bias) {
  if (m == 0 || n == 0 || k == 0 || !use_tiles(n, 1) || k > tile_chunk(n)) return false;
  const int64_t threads = max_threads();
  tiled_gemm(trans_a, trans_b, m, n, k, alpha, a, b, 0.0f, c, threads > 1 && m * n * k >= kParallelMacs, threads,
             bias);
  return true;
}

bool linear_forward_tiled(int64_t m, int64_t n, int64_t k, const float* x, const float* w, const float* bias,
                          float* y) {
  if (m == 0 || k == 0 || !use_tiles(n, 1)) return false;
  const int64_t threads = max_threads();
  tiled_gemm(false, true, m, n, k, 1.0f, x, w, 0.0f, y, threads > 1 && m * n * k >= kParallelMacs, threads, bias);
  return true;
}

template void gemm_on_caller_thread<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                                           const float*, int64_t, float, float*, int64_t);
template void gemm_on_caller_thread<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                                            const double*, int64_t, double, double*, int64_t);
template void gemm_strided_batched<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                                          const float*, int64_t, float, float*, int64_t, int64_t);
template void gemm_strided_batched<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                                           const double*, int64_t, double, double*, int64_t, int64_t);

}  // namespace octet::kernels::cpu
