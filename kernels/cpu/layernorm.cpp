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
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/nn_ops_cpu.h"

namespace octet::kernels::cpu {
namespace {

// Below this many elements the OpenMP fork costs more than it saves.
constexpr int64_t kParallelWork = int64_t{1} << 15;
// dweight/dbias are summed over fixed blocks of rows, then the block sums in block order. The
// blocking does not depend on the thread count, so the result is bitwise reproducible on any
// machine, and short partial sums lose less precision than one long running sum.
constexpr int64_t kRowsPerBlock = 64;

}  // namespace

template <class T>
void layernorm_forward(const T* x, const T* weight, const T* bias, T* y, T* mean, T* rstd, int64_t rows, int64_t C,
                       T eps) {
#pragma omp parallel for schedule(static) if (rows * C > kParallelWork)
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

template <class T>
void layernorm_backward(const T* dy, const T* x, const T* weight, const T* mean, const T* rstd, T* dx, T* dweight,
                        T* dbias, int64_t rows, int64_t C) {
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  // Per block: C sums for dweight, then C for dbias.
  std::vector<T> partial(weight ? static_cast<size_t>(blocks * 2 * C) : 0, T(0));
  const T inv_C = T(1) / static_cast<T>(C);

#pragma omp parallel for schedule(static) if (rows * C > kParallelWork)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    T* pw = weight ? partial.data() + blk * 2 * C : nullptr;
    T* pb = weight ? pw + C : nullptr;
    const int64_t r_end = std::min(rows, (blk + 1) * kRowsPerBlock);
    for (int64_t r = blk * kRowsPerBlock; r < r_end; ++r) {
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

  if (!weight) return;
#pragma omp parallel for schedule(static) if (blocks * C > kParallelWork)
  for (int64_t c = 0; c < C; ++c) {
    T sw = 0, sb = 0;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      sw += partial[blk * 2 * C + c];
      sb += partial[blk * 2 * C + C + c];
    }
    dweight[c] = sw;
    dbias[c] = sb;
  }
}

template void layernorm_forward<float>(const float*, const float*, const float*, float*, float*, float*, int64_t,
                                       int64_t, float);
template void layernorm_forward<double>(const double*, const double*, const double*, double*, double*, double*,
                                        int64_t, int64_t, double);
template void layernorm_backward<float>(const float*, const float*, const float*, const float*, const float*, float*,
                                        float*, float*, int64_t, int64_t);
template void layernorm_backward<double>(const double*, const double*, const double*, const double*, const double*,
                                         double*, double*, double*, int64_t, int64_t);

}  // namespace octet::kernels::cpu
