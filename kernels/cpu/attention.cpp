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
// Heads are processed in chunks of about 2^20 score elements, so the buffers do not grow with B·H
// (a single head larger than that is its own chunk). Each chunk is a strided batch of GEMMs
// (OpenBLAS threads inside) plus row passes split across OpenMP threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/attention_cpu.h"
#include "kernels/cpu/gemm_cpu.h"

namespace octet::kernels::cpu {

namespace {

constexpr int64_t kChunkScores = int64_t{1} << 20;  // score elements per chunk of heads
constexpr int64_t kParallelWork = int64_t{1} << 15;

int64_t heads_per_chunk(int64_t bh, int64_t s, int64_t sk) {
  return std::clamp<int64_t>(kChunkScores / (s * sk), 1, bh);
}

// In place over `rows` rows of length n: x -> softmax(x), writing each row's log-sum-exp.
template <class T>
void softmax_rows(T* x, T* lse, int64_t rows, int64_t n) {
#pragma omp parallel for schedule(static) if (rows * n > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    T* row = x + r * n;
    T max = row[0];
    for (int64_t j = 1; j < n; ++j) max = std::max(max, row[j]);
    T sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      row[j] = std::exp(row[j] - max);
      sum += row[j];
    }
    const T inv = T(1) / sum;
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    lse[r] = max + std::log(sum);
  }
}

}  // namespace

template <class T>
void attention_forward(const T* q, const T* k, const T* v, T* out, T* lse, int64_t bh, int64_t s, int64_t sk, int64_t d,
                       T scale) {
  const int64_t chunk = heads_per_chunk(bh, s, sk);
  std::vector<T> p(static_cast<size_t>(chunk * s * sk));
  for (int64_t h0 = 0; h0 < bh; h0 += chunk) {
    const int64_t nh = std::min(chunk, bh - h0);
    const T* qh = q + h0 * s * d;
    const T* kh = k + h0 * sk * d;
    const T* vh = v + h0 * sk * d;
    // X = s · q·kᵀ
    gemm_strided_batched<T>(false, true, s, sk, d, scale, qh, s * d, kh, sk * d, T(0), p.data(), s * sk, nh);
    // P = softmax(X), lse
    softmax_rows(p.data(), lse + h0 * s, nh * s, sk);
    // out = P·v
    gemm_strided_batched<T>(false, false, s, d, sk, T(1), p.data(), s * sk, vh, sk * d, T(0), out + h0 * s * d, s * d,
                            nh);
  }
}

template <class T>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* out, const T* lse, T* dq, T* dk,
                        T* dv, int64_t bh, int64_t s, int64_t sk, int64_t d, T scale) {
  const int64_t chunk = heads_per_chunk(bh, s, sk);
  std::vector<T> p(static_cast<size_t>(chunk * s * sk)), ds(p.size());
  for (int64_t h0 = 0; h0 < bh; h0 += chunk) {
    const int64_t nh = std::min(chunk, bh - h0);
    const T* qh = q + h0 * s * d;
    const T* kh = k + h0 * sk * d;
    const T* vh = v + h0 * sk * d;
    const T* douth = dout + h0 * s * d;
    const T* outh = out + h0 * s * d;
    const T* lseh = lse + h0 * s;

    // P = exp(s · q·kᵀ − lse)
    gemm_strided_batched<T>(false, true, s, sk, d, scale, qh, s * d, kh, sk * d, T(0), p.data(), s * sk, nh);
#pragma omp parallel for schedule(static) if (nh * s * sk > kParallelWork)
    for (int64_t r = 0; r < nh * s; ++r) {
      T* row = p.data() + r * sk;
      for (int64_t j = 0; j < sk; ++j) row[j] = std::exp(row[j] - lseh[r]);
    }
    // dv = Pᵀ·dout
    gemm_strided_batched<T>(true, false, sk, d, s, T(1), p.data(), s * sk, douth, s * d, T(0), dv + h0 * sk * d, sk * d,
                            nh);
    // dP = dout·vᵀ, then dS = P ⊙ (dP − δ) in place
    gemm_strided_batched<T>(false, true, s, sk, d, T(1), douth, s * d, vh, sk * d, T(0), ds.data(), s * sk, nh);
#pragma omp parallel for schedule(static) if (nh * s * (sk + d) > kParallelWork)
    for (int64_t r = 0; r < nh * s; ++r) {
      T delta = 0;
      for (int64_t c = 0; c < d; ++c) delta += douth[r * d + c] * outh[r * d + c];
      const T* prow = p.data() + r * sk;
      T* row = ds.data() + r * sk;
      for (int64_t j = 0; j < sk; ++j) row[j] = prow[j] * (row[j] - delta);
    }
    // dq = s · dS·k,  dk = s · dSᵀ·q
    gemm_strided_batched<T>(false, false, s, d, sk, scale, ds.data(), s * sk, kh, sk * d, T(0), dq + h0 * s * d, s * d,
                            nh);
    gemm_strided_batched<T>(true, false, sk, d, s, scale, ds.data(), s * sk, qh, s * d, T(0), dk + h0 * sk * d, sk * d,
                            nh);
  }
}

template void attention_forward<float>(const float*, const float*, const float*, float*, float*, int64_t, int64_t,
                                       int64_t, int64_t, float);
template void attention_forward<double>(const double*, const double*, const double*, double*, double*, int64_t, int64_t,
                                        int64_t, int64_t, double);
template void attention_backward<float>(const float*, const float*, const float*, const float*, const float*,
                                        const float*, float*, float*, float*, int64_t, int64_t, int64_t, int64_t,
                                        float);
template void attention_backward<double>(const double*, const double*, const double*, const double*, const double*,
                                         const double*, double*, double*, double*, int64_t, int64_t, int64_t, int64_t,
                                         double);

}  // namespace octet::kernels::cpu
