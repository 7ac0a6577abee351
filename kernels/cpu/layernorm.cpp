// LayerNorm over the last dim, on the CPU.
//
// Forward, for one row x of length C:
//   mean = Σ x / C,   var = Σ (x - mean)² / C   (biased),   rstd = 1 / sqrt(var + eps)
//   xhat = (x - mean) · rstd,   y = xhat · weight + bias
//
// Backward. With g = dy · weight (dy itself without affine), and using
//   ∂xhat_j/∂x_i = rstd · (δ_ij - 1/C - xhat_i·xhat_j / C),
// the chain rule gives
//   dx_i    = rstd · (g_i - mean_j(g_j) - xhat_i · mean_j(g_j · xhat_j))
//   dweight = Σ_rows dy · xhat,   dbias = Σ_rows dy
//
// f32 rows go through vectorized loops (omp simd reductions: the lane order is fixed at compile
// time, so results still repeat exactly); f64 keeps plain loops.
//
// The residual add fused in (add_layernorm_*), as llm.c fuses it: forward writes h = x + y for a row
// and normalizes that row while it is still in cache; backward adds the residual gradient to each
// row's dx while it is in cache. Both call the very row routines layernorm_forward and
// layernorm_backward call, on buffers of the same alignment, and each add is its own plain loop (so
// no FMA contraction can merge it into the LayerNorm arithmetic): the results therefore equal add()
// then layernorm_forward(), and layernorm_backward() then add(), bit for bit in f32 and f64.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/nn_ops_cpu.h"
#include "kernels/cpu/vec_math.h"

namespace octet::kernels::cpu {
namespace {

// Below this many elements the OpenMP fork costs more than it saves.
constexpr int64_t kParallelWork = kParallelElements;
// dweight/dbias are summed over fixed blocks of rows, then the block sums in block order. The
// blocking does not depend on the thread count, so the result is bitwise reproducible on any
// machine, and short partial sums lose less precision than one long running sum.
constexpr int64_t kRowsPerBlock = 64;

OCTET_SIMD_CLONES void forward_rows_f32(const float* x, const float* weight, const float* bias, float* y, float* mean,
                                        float* rstd, int64_t rows, int64_t C, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    const float shift = xr[0];  // see forward_rows below for why
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < C; ++c) sum += xr[c] - shift;
    const float m = shift + sum / static_cast<float>(C);
    float sq = 0;
#pragma omp simd reduction(+ : sq)
    for (int64_t c = 0; c < C; ++c) sq += (xr[c] - m) * (xr[c] - m);
    const float rs = 1.0f / std::sqrt(sq / static_cast<float>(C) + eps);
    mean[r] = m;
    rstd[r] = rs;
    if (weight && bias) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * rs * weight[c] + bias[c];
    } else if (weight) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * rs * weight[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * rs;
    }
  }
}

// Rows [r0, r1): dx, and (with weight) dweight/dbias partial sums added into pw and pb.
OCTET_SIMD_CLONES void backward_rows_f32(const float* dy, const float* x, const float* weight, const float* mean,
                                         const float* rstd, float* dx, float* pw, float* pb, int64_t r0, int64_t r1,
                                         int64_t C) {
  const float inv_C = 1.0f / static_cast<float>(C);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * C;
    const float* dyr = dy + r * C;
    float* dxr = dx + r * C;
    const float m = mean[r], rs = rstd[r];
    float sum_g = 0, sum_g_xhat = 0;
    if (weight) {
#pragma omp simd reduction(+ : sum_g, sum_g_xhat)
      for (int64_t c = 0; c < C; ++c) {
        const float g = dyr[c] * weight[c];
        sum_g += g;
        sum_g_xhat += g * ((xr[c] - m) * rs);
      }
    } else {
#pragma omp simd reduction(+ : sum_g, sum_g_xhat)
      for (int64_t c = 0; c < C; ++c) {
        sum_g += dyr[c];
        sum_g_xhat += dyr[c] * ((xr[c] - m) * rs);
      }
    }
    const float mean_g = sum_g * inv_C, mean_g_xhat = sum_g_xhat * inv_C;
    if (weight) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float xhat = (xr[c] - m) * rs;
        dxr[c] = rs * (dyr[c] * weight[c] - mean_g - xhat * mean_g_xhat);
        pw[c] += dyr[c] * xhat;
        pb[c] += dyr[c];
      }
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dxr[c] = rs * (dyr[c] - mean_g - (xr[c] - m) * rs * mean_g_xhat);
    }
  }
}

// The same two passes in plain loops, for f64.
template <class T>
void forward_rows(const T* x, const T* weight, const T* bias, T* y, T* mean, T* rstd, int64_t rows, int64_t C, T eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * C;
    T* yr = y + r * C;
    // Summing x - x[0] instead of x keeps the running sum small when the row sits far from zero
    // (say 1e4 + N(0, 1)): a plain f32 sum of such a row is off by far more than its spread.
    const T shift = xr[0];
    T sum = 0;
    for (int64_t c = 0; c < C; ++c) sum += xr[c] - shift;
    const T m = shift + sum / static_cast<T>(C);
    // Second pass for the variance: Σ(x - mean)² never cancels, unlike Σx² - C·mean².
    T sq = 0;
    for (int64_t c = 0; c < C; ++c) {
      const T d = xr[c] - m;
      sq += d * d;
    }
    const T rs = T(1) / std::sqrt(sq / static_cast<T>(C) + eps);
    mean[r] = m;
    rstd[r] = rs;
    for (int64_t c = 0; c < C; ++c) {
      T v = (xr[c] - m) * rs;
      if (weight) v = v * weight[c] + (bias ? bias[c] : T(0));
      yr[c] = v;
    }
  }
}
void forward_rows(const float* x, const float* weight, const float* bias, float* y, float* mean, float* rstd,
                  int64_t rows, int64_t C, float eps) {
  forward_rows_f32(x, weight, bias, y, mean, rstd, rows, C, eps);
}

template <class T>
void backward_rows(const T* dy, const T* x, const T* weight, const T* mean, const T* rstd, T* dx, T* pw, T* pb,
                   int64_t r0, int64_t r1, int64_t C) {
  const T inv_C = T(1) / static_cast<T>(C);
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * C;
    const T* dyr = dy + r * C;
    T* dxr = dx + r * C;
    const T m = mean[r], rs = rstd[r];
    T sum_g = 0, sum_g_xhat = 0;
    for (int64_t c = 0; c < C; ++c) {
      const T g = weight ? dyr[c] * weight[c] : dyr[c];
      sum_g += g;
      sum_g_xhat += g * ((xr[c] - m) * rs);
    }
    const T mean_g = sum_g * inv_C, mean_g_xhat = sum_g_xhat * inv_C;
    for (int64_t c = 0; c < C; ++c) {
      const T xhat = (xr[c] - m) * rs;
      const T g = weight ? dyr[c] * weight[c] : dyr[c];
      dxr[c] = rs * (g - mean_g - xhat * mean_g_xhat);
      if (weight) {
        pw[c] += dyr[c] * xhat;
        pb[c] += dyr[c];
      }
    }
  }
}
void backward_rows(const float* dy, const float* x, const float* weight, const float* mean, const float* rstd,
                   float* dx, float* pw, float* pb, int64_t r0, int64_t r1, int64_t C) {
  backward_rows_f32(dy, x, weight, mean, rstd, dx, pw, pb, r0, r1, C);
}

// dh[i] += dresidual[i] over n elements: the add() kernel's arithmetic, one rounding per element.
template <class T>
void add_residual(T* dh, const T* dresidual, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dh[i] += dresidual[i];
}

// The backward's frame: blocks(lo, hi, partial) computes the blocks [lo, hi) of kRowsPerBlock rows
// (on one thread), adding block blk's dweight and dbias sums into partial + blk·2C (C for dweight,
// then C for dbias; partial is null without a weight); then the partials are summed in block order.
template <class T, class Blocks>
void backward_blocks(int64_t rows, int64_t C, bool with_weight, T* dweight, T* dbias, Blocks&& blocks_fn) {
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<T> partial(with_weight ? static_cast<size_t>(blocks * 2 * C) : 0, T(0));
  parallel_ranges(blocks, kParallelWork / (kRowsPerBlock * C) + 1,
                  [&](int64_t lo, int64_t hi) { blocks_fn(lo, hi, with_weight ? partial.data() : nullptr); });

  if (!with_weight) return;
  if (blocks == 0) {  // no rows: the sums are empty (and the split below would divide by zero)
    std::fill(dweight, dweight + C, T(0));
    std::fill(dbias, dbias + C, T(0));
    return;
  }
  parallel_ranges(C, kParallelWork / blocks + 1, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      T sw = 0, sb = 0;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        sw += partial[blk * 2 * C + c];
        sb += partial[blk * 2 * C + C + c];
      }
      dweight[c] = sw;
      dbias[c] = sb;
    }
  });
}

// layernorm_backward, with dresidual (or nothing, when null) added to each block of rows right after
// the block's dx is written.
template <class T>
void backward(const T* dy, const T* dresidual, const T* x, const T* weight, const T* mean, const T* rstd, T* dx,
              T* dweight, T* dbias, int64_t rows, int64_t C) {
  backward_blocks<T>(rows, C, weight != nullptr, dweight, dbias, [&](int64_t lo, int64_t hi, T* partial) {
    for (int64_t blk = lo; blk < hi; ++blk) {
      T* pw = partial ? partial + blk * 2 * C : nullptr;
      const int64_t r0 = blk * kRowsPerBlock, r1 = std::min(rows, (blk + 1) * kRowsPerBlock);
      backward_rows(dy, x, weight, mean, rstd, dx, pw, pw ? pw + C : nullptr, r0, r1, C);
      // The block's dx (64 rows) is still in cache.
      if (dresidual) add_residual(dx + r0 * C, dresidual + r0 * C, (r1 - r0) * C);
    }
  });
}

// One row of f32 for a bf16 row widened, placed where that row of a 64-byte-aligned f32 tensor would
// sit modulo 64 bytes (row r at r·C floats), as add_layernorm_forward places h: a compiler may peel a
// vectorized sum to an aligned address, which splits the row into other lanes, and a bf16 row must
// give the bits of the tensor widened whole. (GCC's AVX-512 clone here does not peel: the placement
// changes no bit today, which LayerNorm.Bf16RowsAreTheF32KernelRounded would show if it did.)
class RowBuffer {
 public:
  explicit RowBuffer(int64_t C) : storage_(static_cast<size_t>(C + 2 * kFloatsPer64)) {
    const auto at = reinterpret_cast<uintptr_t>(storage_.data());
    aligned_ = storage_.data() + ((kBytes - at % kBytes) % kBytes) / sizeof(float);
  }
  float* for_row(int64_t r, int64_t C) const { return aligned_ + (r * C) % kFloatsPer64; }

 private:
  static constexpr uintptr_t kBytes = 64;  // Storage::kHostAlignment
  static constexpr int64_t kFloatsPer64 = 16;
  std::vector<float> storage_;
  float* aligned_;
};

void widen_row(const bfloat16* src, float* dst, int64_t C) {
  for (int64_t c = 0; c < C; ++c) dst[c] = bf16_bits_to_float(src[c].bits);
}
void round_row(const float* src, bfloat16* dst, int64_t C) {
  for (int64_t c = 0; c < C; ++c) dst[c].bits = float_to_bf16_bits(src[c]);
}

}  // namespace

void layernorm_forward_bf16(const bfloat16* x, const float* weight, const float* bias, bfloat16* y, float* mean,
                            float* rstd, int64_t rows, int64_t C, float eps) {
  parallel_ranges(rows, kParallelWork / C + 1, [&](int64_t lo, int64_t hi) {
    const RowBuffer in(C), out(C);
    for (int64_t r = lo; r < hi; ++r) {
      float* xr = in.for_row(r, C);
      float* yr = out.for_row(r, C);
      widen_row(x + r * C, xr, C);
      forward_rows(xr, weight, bias, yr, mean + r, rstd + r, 1, C, eps);
      round_row(yr, y + r * C, C);
    }
  });
}

void add_layernorm_forward_bf16(const bfloat16* x, const bfloat16* y, const float* weight, const float* bias,
                                bfloat16* h, bfloat16* out, float* mean, float* rstd, int64_t rows, int64_t C,
                                float eps) {
  parallel_ranges(rows, kParallelWork / C + 1, [&](int64_t lo, int64_t hi) {
    const RowBuffer in(C), normed(C);
    for (int64_t r = lo; r < hi; ++r) {
      const bfloat16* xr = x + r * C;
      const bfloat16* yr = y + r * C;
      bfloat16* hr = h + r * C;
      float* hf = in.for_row(r, C);
      // h = x + y in f32, rounded to bf16 as add() rounds it, and normalized as rounded.
      for (int64_t c = 0; c < C; ++c) {
        hr[c].bits = float_to_bf16_bits(bf16_bits_to_float(xr[c].bits) + bf16_bits_to_float(yr[c].bits));
        hf[c] = bf16_bits_to_float(hr[c].bits);
      }
      float* outr = normed.for_row(r, C);
      forward_rows(hf, weight, bias, outr, mean + r, rstd + r, 1, C, eps);
      round_row(outr, out + r * C, C);
    }
  });
}

void add_layernorm_backward_bf16(const bfloat16* dy, const bfloat16* dresidual, const bfloat16* x, const float* weight,
                                 const float* mean, const float* rstd, bfloat16* dx, float* dweight, float* dbias,
                                 int64_t rows, int64_t C) {
  backward_blocks<float>(rows, C, weight != nullptr, dweight, dbias, [&](int64_t lo, int64_t hi, float* partial) {
    const RowBuffer dy_row(C), x_row(C), dx_row(C);
    for (int64_t blk = lo; blk < hi; ++blk) {
      float* pw = partial ? partial + blk * 2 * C : nullptr;
      const int64_t r0 = blk * kRowsPerBlock, r1 = std::min(rows, (blk + 1) * kRowsPerBlock);
      // The f32 kernel's rows one at a time (its sums, and pw and pb, in the same row order), then
      // the residual's f32 add and the one rounding that the f32 path's add and conversion make.
      for (int64_t r = r0; r < r1; ++r) {
        float* dyr = dy_row.for_row(r, C);
        float* xr = x_row.for_row(r, C);
        float* dxr = dx_row.for_row(r, C);
        widen_row(dy + r * C, dyr, C);
        widen_row(x + r * C, xr, C);
        backward_rows(dyr, xr, weight, mean + r, rstd + r, dxr, pw, pw ? pw + C : nullptr, 0, 1, C);
        if (dresidual) {
          const bfloat16* dres = dresidual + r * C;
          for (int64_t c = 0; c < C; ++c) dxr[c] += bf16_bits_to_float(dres[c].bits);
        }
        round_row(dxr, dx + r * C, C);
      }
    }
  });
}

template <class T>
void layernorm_forward(const T* x, const T* weight, const T* bias, T* y, T* mean, T* rstd, int64_t rows, int64_t C,
                       T eps) {
  parallel_ranges(rows, kParallelWork / C + 1, [&](int64_t lo, int64_t hi) {
    forward_rows(x + lo * C, weight, bias, y + lo * C, mean + lo, rstd + lo, hi - lo, C, eps);
  });
}

template <class T>
void layernorm_backward(const T* dy, const T* x, const T* weight, const T* mean, const T* rstd, T* dx, T* dweight,
                        T* dbias, int64_t rows, int64_t C) {
  backward<T>(dy, nullptr, x, weight, mean, rstd, dx, dweight, dbias, rows, C);
}

template <class T>
void add_layernorm_forward(const T* x, const T* y, const T* weight, const T* bias, T* h, T* out, T* mean, T* rstd,
                           int64_t rows, int64_t C, T eps, DType h_dtype) {
  const bool round_h = h_dtype != dtype_of<T>();
  parallel_ranges(rows, kParallelWork / C + 1, [&](int64_t lo, int64_t hi) {
    // One row of h in h_dtype, for the round trip that rounds it as add() rounds its result.
    std::vector<std::byte> narrow(round_h ? static_cast<size_t>(C) * dtype_size(h_dtype) : 0);
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * C;
      const T* yr = y + r * C;
      T* hr = h + r * C;
      for (int64_t c = 0; c < C; ++c) hr[c] = xr[c] + yr[c];
      if (round_h) {
        convert_elements(hr, dtype_of<T>(), narrow.data(), h_dtype, C);
        convert_elements(narrow.data(), h_dtype, hr, dtype_of<T>(), C);
      }
      // The row is normalized at the offset layernorm_forward would see it at, in a buffer as
      // aligned as add()'s result, so the vectorized sums split it into the same lanes.
      forward_rows(hr, weight, bias, out + r * C, mean + r, rstd + r, 1, C, eps);
    }
  });
}

template <class T>
void add_layernorm_backward(const T* dy, const T* dresidual, const T* h, const T* weight, const T* mean,
                            const T* rstd, T* dh, T* dweight, T* dbias, int64_t rows, int64_t C) {
  backward<T>(dy, dresidual, h, weight, mean, rstd, dh, dweight, dbias, rows, C);
}

template void layernorm_forward<float>(const float*, const float*, const float*, float*, float*, float*, int64_t,
                                       int64_t, float);
template void layernorm_forward<double>(const double*, const double*, const double*, double*, double*, double*,
                                        int64_t, int64_t, double);
template void layernorm_backward<float>(const float*, const float*, const float*, const float*, const float*, float*,
                                        float*, float*, int64_t, int64_t);
template void layernorm_backward<double>(const double*, const double*, const double*, const double*, const double*,
                                         double*, double*, double*, int64_t, int64_t);

template void add_layernorm_forward<float>(const float*, const float*, const float*, const float*, float*, float*,
                                           float*, float*, int64_t, int64_t, float, DType);
template void add_layernorm_forward<double>(const double*, const double*, const double*, const double*, double*,
                                            double*, double*, double*, int64_t, int64_t, double, DType);
template void add_layernorm_backward<float>(const float*, const float*, const float*, const float*, const float*,
                                            const float*, float*, float*, float*, int64_t, int64_t);
template void add_layernorm_backward<double>(const double*, const double*, const double*, const double*,
                                             const double*, const double*, double*, double*, double*, int64_t,
                                             int64_t);

}  // namespace octet::kernels::cpu
