// Scaled dot-product attention on the CPU, unfused: every head's full score matrix is materialised.
// Per head, with q [S, D], k and v [Sk, D] and s = scale:
//
//   forward
//     X   = s · q·kᵀ                                   [S, Sk] scores
//     lse = rowmax(X) + log Σ_j exp(X − rowmax(X))      [S]     (max subtracted so exp cannot overflow)
//     P   = exp(X − lse)                                [S, Sk] row softmax
//     out = P·v                                         [S, D]
//
//   backward, given dout = ∂L/∂out
//     P   = exp(s · q·kᵀ − lse)                         recomputed instead of stored, as fused kernels do
//     dv  = Pᵀ·dout                                     [Sk, D]
//     dP  = dout·vᵀ                                     [S, Sk]
//     δ   = rowsum(dout ⊙ out)                          [S]
//     dS  = P ⊙ (dP − δ)                                [S, Sk] softmax backward, ∂L/∂X
//     dq  = s · dS·k                                    [S, D]
//     dk  = s · dSᵀ·q                                   [Sk, D]
//
// The softmax backward needs Σ_j P_ij·dP_ij per row; that equals Σ_d dout_id·out_id (expand dP and
// out = P·v), which costs O(S·D) instead of O(S·Sk) and is what flash attention computes too.
//
// Every operand is read (and every result written) in place through its row stride, a leading
// dimension to both GEMM paths, so the packed qkv layout costs no layout copies
// (kernels/attention_layout.h).
//
// Heads are independent, so they are split across OpenMP threads (a contiguous range of heads per
// thread); each thread runs its heads one at a time, so one head's score matrix stays in cache between
// its products and its row passes. In f32 on an AVX-512 CPU the products are the register tiles of
// kernels/cpu/tile_gemm.h, with k, v (and in backward q and dout) packed per head into whole vectors
// first; elsewhere, and in f64, they are OpenBLAS calls on the thread. For f32 the row passes use the
// vectorized exp of kernels/cpu/vec_math.h.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention_cpu.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/tile_gemm.h"
#include "kernels/cpu/vec_math.h"

namespace octet::kernels::cpu {

namespace {

// ---- row passes, f32 (vectorized) and f64 -----------------------------------------------------------

// In place over `rows` rows of length n, ld apart: x -> softmax(x), writing each row's log-sum-exp.
OCTET_SIMD_CLONES void softmax_rows_f32(float* x, int64_t ld, float* lse, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * ld;
    float max = row[0];
#pragma omp simd reduction(max : max)
    for (int64_t j = 0; j < n; ++j) max = std::max(max, row[j]);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      row[j] = vec::exp(row[j] - max);
      sum += row[j];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    lse[r] = max + std::log(sum);
  }
}

// P = exp(X − lse) in place.
OCTET_SIMD_CLONES void probabilities_f32(float* x, int64_t ld, const float* lse, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * ld;
    const float l = lse[r];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] = vec::exp(row[j] - l);
  }
}

// dS = P ⊙ (dP − δ) in place over dP, δ_r = Σ_c dout_rc·out_rc.
OCTET_SIMD_CLONES void softmax_grad_f32(const float* p, float* ds, int64_t ld, const float* dout, int64_t ld_dout,
                                        const float* out, int64_t ld_out, int64_t rows, int64_t n, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    float delta = 0;
    const float* dout_row = dout + r * ld_dout;
    const float* out_row = out + r * ld_out;
#pragma omp simd reduction(+ : delta)
    for (int64_t c = 0; c < d; ++c) delta += dout_row[c] * out_row[c];
    const float* prow = p + r * ld;
    float* row = ds + r * ld;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] = prow[j] * (row[j] - delta);
  }
}

void softmax_rows(double* x, double* lse, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    double* row = x + r * n;
    const double max = *std::max_element(row, row + n);
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      row[j] = std::exp(row[j] - max);
      sum += row[j];
    }
    for (int64_t j = 0; j < n; ++j) row[j] /= sum;
    lse[r] = max + std::log(sum);
  }
}
void softmax_rows(float* x, float* lse, int64_t rows, int64_t n) { softmax_rows_f32(x, n, lse, rows, n); }

void probabilities(double* x, const double* lse, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) x[r * n + j] = std::exp(x[r * n + j] - lse[r]);
  }
}
void probabilities(float* x, const float* lse, int64_t rows, int64_t n) { probabilities_f32(x, n, lse, rows, n); }

void softmax_grad(const double* p, double* ds, const double* dout, int64_t ld_dout, const double* out, int64_t ld_out,
                  int64_t rows, int64_t n, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    double delta = 0;
    for (int64_t c = 0; c < d; ++c) delta += dout[r * ld_dout + c] * out[r * ld_out + c];
    for (int64_t j = 0; j < n; ++j) ds[r * n + j] = p[r * n + j] * (ds[r * n + j] - delta);
  }
}
void softmax_grad(const float* p, float* ds, const float* dout, int64_t ld_dout, const float* out, int64_t ld_out,
                  int64_t rows, int64_t n, int64_t d) {
  softmax_grad_f32(p, ds, n, dout, ld_dout, out, ld_out, rows, n, d);
}

// Heads are worth a thread each once there is this much matmul work in all of them.
constexpr int64_t kParallelMacs = int64_t{1} << 16;

// Runs fn(head, scratch) for every head, a contiguous range of heads per thread; each thread owns
// `scratch_size` elements of scratch.
template <class T, class F>
void for_each_head(int64_t bh, int64_t work_per_head, size_t scratch_size, F&& fn) {
  BlasOnCallerThread blas;
  const int64_t min_heads = std::max<int64_t>(2, kParallelMacs / std::max<int64_t>(work_per_head, 1));
  parallel_ranges(bh, min_heads, [&](int64_t lo, int64_t hi) {
    std::vector<T> scratch(scratch_size);
    for (int64_t h = lo; h < hi; ++h) fn(h, scratch.data());
  });
}

// ---- f32 through the tile kernels (kernels/cpu/tile_gemm.h) -----------------------------------------
//
// The same arithmetic per head, with every product a tile_gemm::multiply. Its B operands are packed
// first, once per head: kᵀ and vᵀ as rows of Sk (padded to whole vectors), k, q and dout as rows of D
// (padded). Score matrices are rows of Sk, `skp` apart. Packing costs O(S·D) per head against the
// products' O(S·Sk·D).

struct TiledLayout {
  int64_t skp, dp;  // Sk and D rounded up to whole vectors
  explicit TiledLayout(const AttentionDims& z) : skp(tile_gemm::padded(z.sk)), dp(tile_gemm::padded(z.d)) {}
};

int64_t tiled_forward_scratch(const AttentionDims& z) {
  const TiledLayout t(z);
  return z.d * t.skp + z.sk * t.dp + z.s * t.skp;  // kᵀ [D, skp], v [Sk, dp], P [S, skp]
}

void tiled_forward_head(const float* qh, int64_t ldq, const float* kh, int64_t ldk, const float* vh, int64_t ldv,
                        float* outh, int64_t ldo, float* lse, const AttentionDims& z, float scale, float* scratch) {
  const TiledLayout t(z);
  const int64_t s = z.s, sk = z.sk, d = z.d;
  float* kt = scratch;
  float* vp = kt + d * t.skp;
  float* p = vp + sk * t.dp;
  tile_gemm::pack_transposed(kh, ldk, sk, d, kt, t.skp);
  tile_gemm::pack_rows(vh, ldv, sk, d, vp, t.dp);
  tile_gemm::multiply(s, sk, d, scale, qh, ldq, 1, kt, t.skp, 0.0f, p, t.skp);  // X = s · q·kᵀ
  softmax_rows_f32(p, t.skp, lse, s, sk);                                 // P, lse
  tile_gemm::multiply(s, d, sk, 1.0f, p, t.skp, 1, vp, t.dp, 0.0f, outh, ldo);  // out = P·v
}

int64_t tiled_backward_scratch(const AttentionDims& z) {
  const TiledLayout t(z);
  // kᵀ and vᵀ [D, skp], k [Sk, dp], q and dout [S, dp], P and dS [S, skp]
  return 2 * z.d * t.skp + z.sk * t.dp + 2 * z.s * t.dp + 2 * z.s * t.skp;
}

void tiled_backward_head(const float* douth, int64_t ld_dout, const float* qh, int64_t ldq, const float* kh,
                         int64_t ldk, const float* vh, int64_t ldv, const float* outh, int64_t ldo, const float* lse,
                         float* dqh, int64_t lddq, float* dkh, int64_t lddk, float* dvh, int64_t lddv,
                         const AttentionDims& z, float scale, float* scratch) {
  const TiledLayout t(z);
  const int64_t s = z.s, sk = z.sk, d = z.d;
  float* kt = scratch;
  float* vt = kt + d * t.skp;
  float* kp = vt + d * t.skp;
  float* qp = kp + sk * t.dp;
  float* dop = qp + s * t.dp;
  float* p = dop + s * t.dp;
  float* ds = p + s * t.skp;
  tile_gemm::pack_transposed(kh, ldk, sk, d, kt, t.skp);
  tile_gemm::pack_transposed(vh, ldv, sk, d, vt, t.skp);
  tile_gemm::pack_rows(kh, ldk, sk, d, kp, t.dp);
  tile_gemm::pack_rows(qh, ldq, s, d, qp, t.dp);
  tile_gemm::pack_rows(douth, ld_dout, s, d, dop, t.dp);
  // P = exp(s · q·kᵀ − lse)
  tile_gemm::multiply(s, sk, d, scale, qh, ldq, 1, kt, t.skp, 0.0f, p, t.skp);
  probabilities_f32(p, t.skp, lse, s, sk);
  // dv = Pᵀ·dout: A is P read transposed
  tile_gemm::multiply(sk, d, s, 1.0f, p, 1, t.skp, dop, t.dp, 0.0f, dvh, lddv);
  // dP = dout·vᵀ, then dS = P ⊙ (dP − δ) in place
  tile_gemm::multiply(s, sk, d, 1.0f, douth, ld_dout, 1, vt, t.skp, 0.0f, ds, t.skp);
  softmax_grad_f32(p, ds, t.skp, douth, ld_dout, outh, ldo, s, sk, d);
  // dq = s · dS·k,  dk = s · dSᵀ·q
  tile_gemm::multiply(s, d, sk, scale, ds, t.skp, 1, kp, t.dp, 0.0f, dqh, lddq);
  tile_gemm::multiply(sk, d, s, scale, ds, 1, t.skp, qp, t.dp, 0.0f, dkh, lddk);
}

// ---- bf16 through the tile kernels, a head at a time --------------------------------------------------
//
// Each head's bf16 operands are widened into contiguous f32 rows of D in the head's scratch, the f32
// head routines above run on them, and their f32 results are rounded into the bf16 outputs' rows.
// The tile products do not depend on where their operands sit (kernels/cpu/tile_gemm.h), so this
// gives the bits of widening every tensor whole first, without those tensor-sized copies.

void widen_rows(const bfloat16* src, int64_t ld, int64_t rows, int64_t d, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < d; ++c) dst[r * d + c] = bf16_bits_to_float(src[r * ld + c].bits);
  }
}
void round_rows(const float* src, int64_t rows, int64_t d, bfloat16* dst, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < d; ++c) dst[r * ld + c].bits = float_to_bf16_bits(src[r * d + c]);
  }
}

}  // namespace

bool attention_forward_bf16(HeadMatrix<const bfloat16> q, HeadMatrix<const bfloat16> k, HeadMatrix<const bfloat16> v,
                            HeadMatrix<bfloat16> out, float* lse, const AttentionDims& z, float scale) {
  if (!tile_gemm::available()) return false;
  const int64_t s = z.s, sk = z.sk, d = z.d;
  const int64_t tiled = tiled_forward_scratch(z);
  const size_t scratch = static_cast<size_t>(tiled + (2 * s + 2 * sk) * d);  // + q, k, v, out in f32
  for_each_head<float>(z.b * z.h, 2 * s * sk * d, scratch, [&](int64_t h, float* p) {
    float* qf = p + tiled;
    float* kf = qf + s * d;
    float* vf = kf + sk * d;
    float* of = vf + sk * d;
    widen_rows(q.head(h, z.h), q.ld(), s, d, qf);
    widen_rows(k.head(h, z.h), k.ld(), sk, d, kf);
    widen_rows(v.head(h, z.h), v.ld(), sk, d, vf);
    tiled_forward_head(qf, d, kf, d, vf, d, of, d, lse + h * s, z, scale, p);
    round_rows(of, s, d, out.head(h, z.h), out.ld());
  });
  return true;
}

bool attention_backward_bf16(HeadMatrix<const bfloat16> dout, HeadMatrix<const bfloat16> q,
                             HeadMatrix<const bfloat16> k, HeadMatrix<const bfloat16> v, HeadMatrix<const bfloat16> out,
                             const float* lse, HeadMatrix<bfloat16> dq, HeadMatrix<bfloat16> dk,
                             HeadMatrix<bfloat16> dv, const AttentionDims& z, float scale) {
  if (!tile_gemm::available()) return false;
  const int64_t s = z.s, sk = z.sk, d = z.d;
  const int64_t tiled = tiled_backward_scratch(z);
  // + dout, q, out, dq [S, D] and k, v, dk, dv [Sk, D] in f32
  const size_t scratch = static_cast<size_t>(tiled + (4 * s + 4 * sk) * d);
  for_each_head<float>(z.b * z.h, 5 * s * sk * d, scratch, [&](int64_t h, float* p) {
    float* dof = p + tiled;
    float* qf = dof + s * d;
    float* of = qf + s * d;
    float* dqf = of + s * d;
    float* kf = dqf + s * d;
    float* vf = kf + sk * d;
    float* dkf = vf + sk * d;
    float* dvf = dkf + sk * d;
    widen_rows(dout.head(h, z.h), dout.ld(), s, d, dof);
    widen_rows(q.head(h, z.h), q.ld(), s, d, qf);
    widen_rows(out.head(h, z.h), out.ld(), s, d, of);
    widen_rows(k.head(h, z.h), k.ld(), sk, d, kf);
    widen_rows(v.head(h, z.h), v.ld(), sk, d, vf);
    tiled_backward_head(dof, d, qf, d, kf, d, vf, d, of, d, lse + h * s, dqf, d, dkf, d, dvf, d, z, scale, p);
    round_rows(dqf, s, d, dq.head(h, z.h), dq.ld());
    round_rows(dkf, sk, d, dk.head(h, z.h), dk.ld());
    round_rows(dvf, sk, d, dv.head(h, z.h), dv.ld());
  });
  return true;
}

template <class T>
void attention_forward(HeadMatrix<const T> q, HeadMatrix<const T> k, HeadMatrix<const T> v, HeadMatrix<T> out, T* lse,
                       const AttentionDims& z, T scale) {
  const int64_t s = z.s, sk = z.sk, d = z.d;
  if constexpr (std::is_same_v<T, float>) {
    if (tile_gemm::available()) {
      for_each_head<T>(z.b * z.h, 2 * s * sk * d, static_cast<size_t>(tiled_forward_scratch(z)), [&](int64_t h, T* p) {
        tiled_forward_head(q.head(h, z.h), q.ld(), k.head(h, z.h), k.ld(), v.head(h, z.h), v.ld(), out.head(h, z.h),
                           out.ld(), lse + h * s, z, scale, p);
      });
      return;
    }
  }
  for_each_head<T>(z.b * z.h, 2 * s * sk * d, static_cast<size_t>(s * sk), [&](int64_t h, T* p) {
    const T* qh = q.head(h, z.h);
    const T* kh = k.head(h, z.h);
    const T* vh = v.head(h, z.h);
    gemm_on_caller_thread<T>(false, true, s, sk, d, scale, qh, q.ld(), kh, k.ld(), T(0), p, sk);  // X = s · q·kᵀ
    softmax_rows(p, lse + h * s, s, sk);                                                            // P, lse
    gemm_on_caller_thread<T>(false, false, s, d, sk, T(1), p, sk, vh, v.ld(), T(0), out.head(h, z.h), out.ld());
  });
}

template <class T>
void attention_backward(HeadMatrix<const T> dout, HeadMatrix<const T> q, HeadMatrix<const T> k, HeadMatrix<const T> v,
                        HeadMatrix<const T> out, const T* lse, HeadMatrix<T> dq, HeadMatrix<T> dk, HeadMatrix<T> dv,
                        const AttentionDims& z, T scale) {
  const int64_t s = z.s, sk = z.sk, d = z.d;
  if constexpr (std::is_same_v<T, float>) {
    if (tile_gemm::available()) {
      for_each_head<T>(z.b * z.h, 5 * s * sk * d, static_cast<size_t>(tiled_backward_scratch(z)), [&](int64_t h, T* p) {
        tiled_backward_head(dout.head(h, z.h), dout.ld(), q.head(h, z.h), q.ld(), k.head(h, z.h), k.ld(),
                            v.head(h, z.h), v.ld(), out.head(h, z.h), out.ld(), lse + h * s, dq.head(h, z.h), dq.ld(),
                            dk.head(h, z.h), dk.ld(), dv.head(h, z.h), dv.ld(), z, scale, p);
      });
      return;
    }
  }
  const size_t scores = static_cast<size_t>(s * sk);
  for_each_head<T>(z.b * z.h, 5 * s * sk * d, 2 * scores, [&](int64_t h, T* scratch) {
    T* p = scratch;
    T* ds = scratch + scores;
    const T* qh = q.head(h, z.h);
    const T* kh = k.head(h, z.h);
    const T* vh = v.head(h, z.h);
    const T* douth = dout.head(h, z.h);
    // P = exp(s · q·kᵀ − lse)
    gemm_on_caller_thread<T>(false, true, s, sk, d, scale, qh, q.ld(), kh, k.ld(), T(0), p, sk);
    probabilities(p, lse + h * s, s, sk);
    // dv = Pᵀ·dout
    gemm_on_caller_thread<T>(true, false, sk, d, s, T(1), p, sk, douth, dout.ld(), T(0), dv.head(h, z.h), dv.ld());
    // dP = dout·vᵀ, then dS = P ⊙ (dP − δ) in place
    gemm_on_caller_thread<T>(false, true, s, sk, d, T(1), douth, dout.ld(), vh, v.ld(), T(0), ds, sk);
    softmax_grad(p, ds, douth, dout.ld(), out.head(h, z.h), out.ld(), s, sk, d);
    // dq = s · dS·k,  dk = s · dSᵀ·q
    gemm_on_caller_thread<T>(false, false, s, d, sk, scale, ds, sk, kh, k.ld(), T(0), dq.head(h, z.h), dq.ld());
    gemm_on_caller_thread<T>(true, false, sk, d, s, scale, ds, sk, qh, q.ld(), T(0), dk.head(h, z.h), dk.ld());
  });
}

#define OCTET_INSTANTIATE_ATTENTION(T)                                                                               \
  template void attention_forward<T>(HeadMatrix<const T>, HeadMatrix<const T>, HeadMatrix<const T>, HeadMatrix<T>, T*, \
                                     const AttentionDims&, T);                                                       \
  template void attention_backward<T>(HeadMatrix<const T>, HeadMatrix<const T>, HeadMatrix<const T>,                  \
                                      HeadMatrix<const T>, HeadMatrix<const T>, const T*, HeadMatrix<T>,              \
                                      HeadMatrix<T>, HeadMatrix<T>, const AttentionDims&, T);
OCTET_INSTANTIATE_ATTENTION(float)
OCTET_INSTANTIATE_ATTENTION(double)
#undef OCTET_INSTANTIATE_ATTENTION

}  // namespace octet::kernels::cpu
