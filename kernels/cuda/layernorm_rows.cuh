#pragma once
// The row arithmetic of the GPU LayerNorm forward, shared by layernorm.cu and the LayerNorm writing
// FP8 (layernorm_fp8.cu). Both run these very functions, so that the statistics and every output
// element come from the same f32 operations in the same order: that is what makes the fused kernel's
// bytes those of layernorm_forward followed by fp8_cast. The formulas are described in layernorm.cu.
// Included by .cu files only.
#include <algorithm>

#include "kernels/cuda/common.cuh"

namespace octet::kernels::cuda {

// The forward runs a warp per row while C <= this, a block per row beyond.
constexpr int64_t kLayerNormWarpPerRowMaxC = 1024;

// Threads per row for a block-per-row kernel: about one 16-byte pack (or 8 scalars) each, a
// multiple of 32 in [lo, hi].
inline int threads_for_row(int64_t C, bool vectorized, int elements_per_pack, int lo, int hi) {
  const int64_t per_thread = vectorized ? elements_per_pack : 8;
  const int64_t wanted = (C + per_thread - 1) / per_thread;
  const int64_t rounded = (wanted + 31) / 32 * 32;
  return static_cast<int>(std::clamp<int64_t>(rounded, lo, hi));
}

// The block size of the block-per-row forward. The row sums are reduced across the block, so their
// order (and bits) depend on it: whoever must reproduce the forward's statistics uses this size.
inline int layernorm_forward_block_threads(int64_t C, bool vectorized, int elements_per_pack) {
  return threads_for_row(C, vectorized, elements_per_pack, 128, 1024);
}

// Calls f.template operator()<W>() with weight's element type, or float when there is no weight
// (the kernels then see null pointers).
template <class F>
void with_weight_type(const Tensor& weight, const char* op, F&& f) {
  if (weight.defined()) return dispatch_floating(weight.dtype(), op, f);
  f.template operator()<float>();
}

template <class W>
const W* maybe(const Tensor& t) {
  return t.defined() ? ptr<W>(t) : nullptr;
}

// Calls f(c, value) for this thread's elements of a row: packs c = lane·N, lane·N + lanes·N, ...
// when vectorized, else c = lane, lane + lanes, ...
template <class T, class F>
__device__ __forceinline__ void for_each_in_row(const T* row, int64_t C, int lane, int lanes, bool vectorized, F&& f) {
  if (vectorized) {
    constexpr int N = Pack<T>::N;
    for (int64_t c = int64_t{lane} * N; c < C; c += int64_t{lanes} * N) {
      const Pack<T> p = load_pack(row + c);
#pragma unroll
      for (int k = 0; k < N; ++k) f(c + k, to_float(p.v[k]));
    }
  } else {
    for (int64_t c = lane; c < C; c += lanes) f(c, to_float(row[c]));
  }
}

template <class W>
__device__ __forceinline__ float weight_at(const W* w, int64_t c, float if_null) {
  return w ? to_float(w[c]) : if_null;
}

// h = a + b rounded to T, as the add kernel computes it (kernels/cuda/elementwise.cu).
template <class T>
__device__ __forceinline__ T add_rounded(T a, T b) {
  return from_float<T>(__fadd_rn(to_float(a), to_float(b)));
}

struct RowStats {
  float mean, rstd;
};

// mean and rstd of one row, computed by threads lane = 0 .. lanes-1, a warp (row_sum = warp_sum) or
// the whole block (row_sum = block_sum): mean = row[0] + Σ (row - row[0]) / C, then Σ (row - mean)²,
// rstd = 1 / sqrt(var + eps). Each thread visits the same elements in every pass (the layout
// for_each_in_row describes), so the sums depend on (lanes, vectorized) and nothing else.
// With kResidual the row is h = x + x2 rounded to T, which this writes to hr; the second pass reads
// back only h this thread wrote itself. Without it x2r and hr are null.
template <bool kResidual, class T, class RowSum>
__device__ __forceinline__ RowStats layernorm_row_stats(const T* xr, const T* x2r, T* hr, int64_t C, float eps,
                                                        int lane, int lanes, bool vectorized, RowSum&& row_sum) {
  float shift, sum = 0.f;
  const T* src = xr;
  if constexpr (kResidual) {
    shift = to_float(add_rounded(xr[0], x2r[0]));
    if (vectorized) {
      constexpr int N = Pack<T>::N;
      for (int64_t c = int64_t{lane} * N; c < C; c += int64_t{lanes} * N) {
        const Pack<T> pa = load_pack(xr + c), pb = load_pack(x2r + c);
        Pack<T> ph;
#pragma unroll
        for (int k = 0; k < N; ++k) {
          ph.v[k] = add_rounded(pa.v[k], pb.v[k]);
          sum += to_float(ph.v[k]) - shift;
        }
        store_pack(hr + c, ph);
      }
    } else {
      for (int64_t c = lane; c < C; c += lanes) {
        const T v = add_rounded(xr[c], x2r[c]);
        hr[c] = v;
        sum += to_float(v) - shift;
      }
    }
    src = hr;
  } else {
    shift = to_float(xr[0]);
    for_each_in_row(xr, C, lane, lanes, vectorized, [&](int64_t, float v) { sum += v - shift; });
  }
  const float m = shift + row_sum(sum) / static_cast<float>(C);
  float sq = 0.f;
  for_each_in_row(src, C, lane, lanes, vectorized, [&](int64_t, float v) { sq += (v - m) * (v - m); });
  const float rs = 1.0f / sqrtf(row_sum(sq) / static_cast<float>(C) + eps);
  return {m, rs};
}

// The LayerNorm's output for element c of a row, v = the row's value there, in f32 (before the one
// rounding to the output's dtype): (v - mean) · rstd, then · weight[c] + bias[c] with a weight.
// Each operation rounds on its own (the _rn intrinsics are never contracted into an FMA), as on the
// CPU. Written as plain a·b + c, nvcc contracted it into an FMA in some instantiations and not in
// others: the LayerNorm writing FP8 for E4M3 then gave an amax one f32 ulp from layernorm_forward's
// (f32, affine, ViT-H widths), while its E5M2 twin agreed.
template <class W>
__device__ __forceinline__ float layernorm_element(float v, RowStats s, const W* weight, const W* bias, int64_t c) {
  float o = __fmul_rn(__fsub_rn(v, s.mean), s.rstd);
  if (weight) o = __fadd_rn(__fmul_rn(o, to_float(weight[c])), weight_at(bias, c, 0.f));
  return o;
}

}  // namespace octet::kernels::cuda
