// Softmax cross-entropy with label smoothing, on the CPU.
//
// For a row of logits z (length C) with target t and smoothing s, the target distribution is
// q = (1 - s)·onehot(t) + s/C, and
//   lse  = log Σ_j exp(z_j)                       (computed as max + log Σ exp(z - max))
//   loss = Σ_j q_j·(lse - z_j) = lse - (1 - s)·z_t - (s/C)·Σ_j z_j
// The op's loss is the mean over the rows whose target is not ignore_index.
//
// Backward: ∂loss_row/∂z_j = softmax_j - q_j with softmax_j = exp(z_j - lse), so
//   dlogits = dloss / (rows not ignored) · (softmax - q),   and 0 on ignored rows.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/nn_ops_cpu.h"

namespace octet::kernels::cpu {
namespace {

constexpr int64_t kParallelWork = int64_t{1} << 15;

}  // namespace

template <class T>
T cross_entropy_forward(const T* logits, const int64_t* targets, T* lse, int64_t N, int64_t C, T label_smoothing,
                        int64_t ignore_index) {
  // Per-row losses summed afterwards in row order, so the result does not depend on threading.
  std::vector<T> row_loss(static_cast<size_t>(N), T(0));
  const T smooth_per_class = label_smoothing / static_cast<T>(C);

#pragma omp parallel for schedule(static) if (N * C > kParallelWork)
  for (int64_t r = 0; r < N; ++r) {
    const T* z = logits + r * C;
    T max = z[0];
    for (int64_t c = 1; c < C; ++c) max = std::max(max, z[c]);
    T sum_exp = 0, sum_z = 0;
    for (int64_t c = 0; c < C; ++c) {
      sum_exp += std::exp(z[c] - max);
      sum_z += z[c];
    }
    lse[r] = max + std::log(sum_exp);
    // lse is kept even for ignored rows: it costs nothing and backward never reads it there.
    if (targets[r] == ignore_index) continue;
    row_loss[r] = lse[r] - (T(1) - label_smoothing) * z[targets[r]] - smooth_per_class * sum_z;
  }

  T total = 0;
  int64_t counted = 0;
  for (int64_t r = 0; r < N; ++r) {
    if (targets[r] == ignore_index) continue;
    total += row_loss[r];
    ++counted;
  }
  // With every row ignored there is nothing to average; 0 (not 0/0) keeps training loops finite.
  return counted == 0 ? T(0) : total / static_cast<T>(counted);
}

template <class T>
void cross_entropy_backward(const T* logits, const int64_t* targets, const T* lse, T* dlogits, int64_t N, int64_t C,
                            T grad_scale, T label_smoothing, int64_t ignore_index) {
  const T smooth_per_class = label_smoothing / static_cast<T>(C);

#pragma omp parallel for schedule(static) if (N * C > kParallelWork)
  for (int64_t r = 0; r < N; ++r) {
    const T* z = logits + r * C;
    T* dz = dlogits + r * C;
    const int64_t t = targets[r];
    if (t == ignore_index) {
      std::fill(dz, dz + C, T(0));
      continue;
    }
    for (int64_t c = 0; c < C; ++c) {
      const T q = smooth_per_class + (c == t ? T(1) - label_smoothing : T(0));
      dz[c] = grad_scale * (std::exp(z[c] - lse[r]) - q);
    }
  }
}

template float cross_entropy_forward<float>(const float*, const int64_t*, float*, int64_t, int64_t, float, int64_t);
template double cross_entropy_forward<double>(const double*, const int64_t*, double*, int64_t, int64_t, double,
                                              int64_t);
template void cross_entropy_backward<float>(const float*, const int64_t*, const float*, float*, int64_t, int64_t,
                                            float, float, int64_t);
template void cross_entropy_backward<double>(const double*, const int64_t*, const double*, double*, int64_t, int64_t,
                                             double, double, int64_t);

}  // namespace octet::kernels::cpu
