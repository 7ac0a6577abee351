#pragma once
// The row arithmetic of the GPU LayerNorm forward, shared by layernorm.cu and the LayerNorm writing
// FP8 (layernorm_fp8.cu). Both run these very functions, so that the statistics and every output
// element come from the same f32 operations in the same order: that is what makes the fused kernel's
// bytes those of layernorm_forward followed by fp8_cast. The formulas are described in layernorm.cu.
// Included by .cu files only.
//
// Two layouts, chosen by the row length C alone (so that both files always pick the same one):
//
// A warp per row, the row in registers (C <= 32 · kLayerNormRowUnits · N: 2048 bf16/f16, 1024 f32).
// The row is cut into units of N = Pack<T>::N consecutive elements (16 bytes), and lane l holds
// units l, l + 32, l + 64, ...: each load instruction of the warp reads 512 contiguous bytes, and
// the statistics' two passes and the output read registers, not memory. Each lane adds its own
// elements in column order, then the warp adds the 32 lanes' sums with a butterfly (warp_sum), whose
// result is the same in every lane. Whether a unit is loaded as one 16-byte pack or one element at a
// time (a misaligned row, or C not a multiple of N) changes nothing in that order, so the statistics'
// bits depend on the row's values and C only.
//
// A block per row beyond that (the old layout, kept for long rows): each thread takes every
// blockDim-th pack (or element) and the row is read from memory three times (L1/L2 hits after the
// first); the sums' order depends on the block size and on whether the row is read in packs.
#include <algorithm>
#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace octet::kernels::cuda {

// ---- a warp per row, the row in registers --------------------------------------------------------

// 16-byte units per lane that the forward (and the LayerNorm writing FP8) hold in registers.
constexpr int kLayerNormRowUnits = 8;

// Whether a row of C elements of T fits `units_per_lane` units per lane of one warp.
template <class T>
inline bool layernorm_row_in_registers(int64_t C, int units_per_lane) {
  return C <= int64_t{32} * units_per_lane * Pack<T>::N;
}

// N elements of X loaded or stored as one access (N · sizeof(X) bytes, aligned to it).
template <class X, int N>
struct alignas(N * sizeof(X)) Vec {
  X v[N];
};

// Whether the weight (or bias) of a row of T can be read a unit at a time: C a multiple of the unit
// and the pointer aligned to the unit's weights (N · sizeof(W) bytes, read as packs of 16 at most).
template <class T, class W>
inline bool layernorm_params_packed(const void* p, int64_t C) {
  constexpr size_t unit_bytes = Pack<T>::N * sizeof(W);
  if (p == nullptr) return true;
  return C % Pack<T>::N == 0 && reinterpret_cast<uintptr_t>(p) % std::min<size_t>(16, unit_bytes) == 0;
}

// The first column of this lane's unit i.
template <class T>
__device__ __forceinline__ int unit_column(int i, int lane) {
  return (lane + 32 * i) * Pack<T>::N;
}

// Calls f(k) for the elements k = 0, 1, ... of the unit at column c0 (< C) that lie in the row, in
// order; a whole unit goes without a test per element.
template <class T, class F>
__device__ __forceinline__ void for_unit_elements(int c0, int C, F&& f) {
  constexpr int N = Pack<T>::N;
  if (c0 + N <= C) {
#pragma unroll
    for (int k = 0; k < N; ++k) f(k);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (c0 + k < C) f(k);
    }
  }
}

// A unit as it sits in registers: its 16 bytes as four 32-bit words, so that it takes four registers
// whatever T is (an array of 16-bit T takes one register per element: twice as many).
struct Unit {
  uint32_t w[4];
};

template <class T>
__device__ __forceinline__ uint32_t bits_of(T v) {
  if constexpr (sizeof(T) == 4) {
    return __float_as_uint(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat16_as_ushort(v);
  } else {
    return __half_as_ushort(v);
  }
}
template <class T>
__device__ __forceinline__ T from_bits(uint32_t b) {
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(b);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __ushort_as_bfloat16(static_cast<unsigned short>(b));
  } else {
    return __ushort_as_half(static_cast<unsigned short>(b));
  }
}

// Element k's bits (in the low sizeof(T) bytes).
template <class T>
__device__ __forceinline__ uint32_t unit_bits(const Unit& u, int k) {
  if constexpr (sizeof(T) == 4) {
    return u.w[k];
  } else {
    return (u.w[k / 2] >> (16 * (k % 2))) & 0xFFFFu;
  }
}
// Element k ← bits, into a unit whose element k is still zero.
template <class T>
__device__ __forceinline__ void put_unit_bits(Unit& u, int k, uint32_t b) {
  if constexpr (sizeof(T) == 4) {
    u.w[k] = b;
  } else {
    u.w[k / 2] |= b << (16 * (k % 2));
  }
}
// Element k widened to f32: the value to_float gives (a bf16 is its bits shifted up, exactly as
// __bfloat162float does).
template <class T>
__device__ __forceinline__ float unit_value(const Unit& u, int k) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const uint32_t w = u.w[k / 2];
    return __uint_as_float(k % 2 ? (w & 0xFFFF0000u) : (w << 16));
  } else {
    return to_float(from_bits<T>(unit_bits<T>(u, k)));
  }
}

// This lane's unit i of a row: with `packed` (C a multiple of N, the row 16-byte aligned) one 16-byte
// load, else one element at a time. Elements past C are zero and never used.
template <class T>
__device__ __forceinline__ void load_row_unit(const T* row, int C, int lane, bool packed, int i, Unit& u) {
  const int c0 = unit_column<T>(i, lane);
  u = Unit{};
  if (c0 < C) {
    if (packed) {
      const uint4 q = *reinterpret_cast<const uint4*>(row + c0);
      u = Unit{{q.x, q.y, q.z, q.w}};
    } else {
      for_unit_elements<T>(c0, C, [&](int k) { put_unit_bits<T>(u, k, bits_of(row[c0 + k])); });
    }
  }
}

// This lane's units of a row (load_row_unit). All the loads are issued before any is used, so a warp
// has the whole row in flight at once.
template <class T, int kUnits>
__device__ __forceinline__ void load_row_units(const T* row, int C, int lane, bool packed, Unit (&u)[kUnits]) {
#pragma unroll
  for (int i = 0; i < kUnits; ++i) load_row_unit(row, C, lane, packed, i, u[i]);
}

// The unit at column c0 (< C) of a row, stored as load_row_units loads it.
template <class T>
__device__ __forceinline__ void store_unit(T* row, int c0, int C, bool packed, const Unit& u) {
  if (packed) {
    *reinterpret_cast<uint4*>(row + c0) = make_uint4(u.w[0], u.w[1], u.w[2], u.w[3]);
  } else {
    for_unit_elements<T>(c0, C, [&](int k) { row[c0 + k] = from_bits<T>(unit_bits<T>(u, k)); });
  }
}

// h = a + b rounded to T, as the add kernel computes it (kernels/cuda/elementwise.cu).
template <class T>
__device__ __forceinline__ T add_rounded(T a, T b) {
  return from_float<T>(__fadd_rn(to_float(a), to_float(b)));
}

// u ← h = a + b (add_rounded), unit by unit, each unit written to hr: a and b are the units of a
// row of x and of x2 as load_row_units loads them (u may be a).
template <class T, int kUnits>
__device__ __forceinline__ void add_row_units(const Unit (&a)[kUnits], const Unit (&b)[kUnits], T* hr, int C,
                                              int lane, bool packed, Unit (&u)[kUnits]) {
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    const int c0 = unit_column<T>(i, lane);
    Unit sum{};
    if (c0 < C) {
#pragma unroll
      for (int k = 0; k < Pack<T>::N; ++k) {
        const T v = from_float<T>(__fadd_rn(unit_value<T>(a[i], k), unit_value<T>(b[i], k)));  // add_rounded
        put_unit_bits<T>(sum, k, bits_of(v));
      }
      store_unit(hr, c0, C, packed, sum);
    }
    u[i] = sum;
  }
}

// The row h = x + x2 (add_rounded) into u, and written to hr.
template <class T, int kUnits>
__device__ __forceinline__ void load_row_units_residual(const T* xr, const T* x2r, T* hr, int C, int lane, bool packed,
                                                        Unit (&u)[kUnits]) {
  Unit a[kUnits], b[kUnits];
  load_row_units(xr, C, lane, packed, a);
  load_row_units(x2r, C, lane, packed, b);
  add_row_units<T>(a, b, hr, C, lane, packed, u);
}

// The N weights (or biases) of the unit at column c0, as floats: with `packed`
// (layernorm_params_packed) as 16-byte packs, or one 8-byte access for f32 rows of 2-byte weights;
// else one at a time, zero past C.
template <class T, class W>
__device__ __forceinline__ void load_unit_params(const W* p, int c0, int C, bool packed, float (&out)[Pack<T>::N]) {
  constexpr int N = Pack<T>::N;
  if (packed) {
    if constexpr (N * sizeof(W) >= 16) {
      constexpr int M = Pack<W>::N;
#pragma unroll
      for (int j = 0; j < N / M; ++j) {
        const Pack<W> q = load_pack(p + c0 + j * M);
#pragma unroll
        for (int k = 0; k < M; ++k) out[j * M + k] = to_float(q.v[k]);
      }
    } else {
      const Vec<W, N> q = *reinterpret_cast<const Vec<W, N>*>(p + c0);
#pragma unroll
      for (int k = 0; k < N; ++k) out[k] = to_float(q.v[k]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = c0 + k < C ? to_float(p[c0 + k]) : 0.f;
  }
}

struct RowStats {
  float mean, rstd;
};

// mean and rstd of a row held by a warp as load_row_units lays it out (every lane calls it, and every
// lane gets the same bits): mean = row[0] + Σ (row - row[0]) / C, then Σ (row - mean)², rstd =
// 1 / sqrt(var + eps). Each operation is an _rn intrinsic (one rounding, never contracted otherwise
// than written), so every kernel that inlines this computes the same bits.
template <class T, int kUnits>
__device__ __forceinline__ RowStats warp_row_stats(const Unit (&u)[kUnits], int C, int lane, float eps) {
  const float shift = __shfl_sync(0xffffffffu, unit_value<T>(u[0], 0), 0);  // row[0], from lane 0
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    const int c0 = unit_column<T>(i, lane);
    if (c0 < C) {
      for_unit_elements<T>(c0, C, [&](int k) { sum = __fadd_rn(sum, __fsub_rn(unit_value<T>(u[i], k), shift)); });
    }
  }
  const float n = static_cast<float>(C);
  const float mean = __fadd_rn(shift, __fdiv_rn(warp_sum(sum), n));
  float sq = 0.f;
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    const int c0 = unit_column<T>(i, lane);
    if (c0 < C) {
      for_unit_elements<T>(c0, C, [&](int k) {
        const float d = __fsub_rn(unit_value<T>(u[i], k), mean);
        sq = __fmaf_rn(d, d, sq);
      });
    }
  }
  const float rstd = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(warp_sum(sq), n), eps)));
  return {mean, rstd};
}

// The LayerNorm's output for one element, v = the row's value there, in f32 (before the one rounding
// to the output's dtype): (v - mean) · rstd, then · w + b with affine parameters (b = 0 without a
// bias). Each operation rounds on its own (the _rn intrinsics are never contracted into an FMA), as
// on the CPU. Written as plain a·b + c, nvcc contracted it into an FMA in some instantiations and not
// in others: the LayerNorm writing FP8 for E4M3 then gave an amax one f32 ulp from
// layernorm_forward's (f32, affine, ViT-H widths), while its E5M2 twin agreed.
__device__ __forceinline__ float layernorm_value(float v, RowStats s, bool affine, float w, float b) {
  float o = __fmul_rn(__fsub_rn(v, s.mean), s.rstd);
  if (affine) o = __fadd_rn(__fmul_rn(o, w), b);
  return o;
}

// The N outputs (in f32) of this lane's unit at column c0 < C, x its values. weight and bias may be
// null (bias only with weight); `params_packed` as layernorm_params_packed says for both.
template <class T, class W>
__device__ __forceinline__ void layernorm_unit(const Unit& x, RowStats s, const W* weight, const W* bias, int c0,
                                               int C, bool params_packed, float (&y)[Pack<T>::N]) {
  constexpr int N = Pack<T>::N;
  if (weight) {
    float w[N], b[N];
    load_unit_params<T>(weight, c0, C, params_packed, w);
    if (bias) {
      load_unit_params<T>(bias, c0, C, params_packed, b);
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) b[k] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) y[k] = layernorm_value(unit_value<T>(x, k), s, true, w[k], b[k]);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) y[k] = layernorm_value(unit_value<T>(x, k), s, false, 0.f, 0.f);
  }
}

// ---- a block per row (rows longer than the registers hold) -----------------------------------------

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

// Calls f.template operator()<W>() with weight's element type, which is f32 or x's (T), or float
// when there is no weight (the kernels then see null pointers). Only those two are compiled: a bf16
// x with f16 weights (or the reverse) has no use in training, and each such pair would add as many
// kernels again to the LayerNorm files, the slowest of the build. The ops' argument checks
// (kernels/nn_ops.cpp, kernels/fp8.cpp) refuse any other weight dtype first, on every device.
template <class T, class F>
void with_weight_type(const Tensor& weight, const char* op, F&& f) {
  if (!weight.defined() || weight.dtype() == DType::f32) return f.template operator()<float>();
  if constexpr (!std::is_same_v<T, float>) {
    constexpr DType kXDType = std::is_same_v<T, __half> ? DType::f16 : DType::bf16;
    if (weight.dtype() == kXDType) return f.template operator()<T>();
  }
  OCTET_FAIL(op, ": weight is ", dtype_name(weight.dtype()), "; the CUDA kernels take f32 weights or weights "
             "of x's dtype");
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

// mean and rstd of one row, computed by threads lane = 0 .. lanes-1 of a block (row_sum = block_sum):
// mean = row[0] + Σ (row - row[0]) / C, then Σ (row - mean)², rstd = 1 / sqrt(var + eps). Each
// thread visits the same elements in every pass (the layout for_each_in_row describes), so the sums
// depend on (lanes, vectorized) and nothing else.
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

// layernorm_value for element c of a row, reading weight[c] and bias[c] (either may be null).
template <class W>
__device__ __forceinline__ float layernorm_element(float v, RowStats s, const W* weight, const W* bias, int64_t c) {
  if (!weight) return layernorm_value(v, s, false, 0.f, 0.f);
  return layernorm_value(v, s, true, to_float(weight[c]), weight_at(bias, c, 0.f));
}

}  // namespace octet::kernels::cuda
