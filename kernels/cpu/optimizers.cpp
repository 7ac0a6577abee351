// Fused AdamW and SGD updates (optionally writing the rounded copy of an f32 master in the same pass),
// the blocked sum of squares and the scale of the gradient clip, on the CPU. Each element's update is
// independent of every other, so a static OpenMP split gives the same bits for any thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/float_formats.h"
#include "kernels/cpu/optimizers_cpu.h"

namespace octet::kernels::cpu {
namespace {

// Below this many elements the OpenMP fork costs more than the update itself.
constexpr int64_t kParallelWork = int64_t{1} << 15;
// sum_of_squares sums fixed blocks, then the block sums in block order: the blocking does not depend
// on the thread count, and short partial sums lose less precision than one long running sum.
constexpr int64_t kSumBlock = int64_t{1} << 14;

}  // namespace

template <class T, class G, class L>
void adamw_step(T* param, const G* grad, T* exp_avg, T* exp_avg_sq, L* rounded, int64_t n,
                const AdamWConstants<T>& c) {
#pragma omp parallel for schedule(static) if (n > kParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const T g = static_cast<T>(grad[i]);
    const T m = c.beta1 * exp_avg[i] + c.one_minus_beta1 * g;
    const T v = c.beta2 * exp_avg_sq[i] + c.one_minus_beta2 * g * g;
    const T denom = std::sqrt(v) / c.bias_correction2_sqrt + c.eps;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = param[i] * c.decay - c.step_size * m / denom;
    if (rounded) rounded[i] = static_cast<L>(param[i]);
  }
}

template <class T, class G, class L>
void sgd_step(T* param, const G* grad, T* buffer, L* rounded, int64_t n, const SgdConstants<T>& c) {
#pragma omp parallel for schedule(static) if (n > kParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    T d = static_cast<T>(grad[i]);
    // Skipped at 0 rather than multiplied by it, so an inf parameter does not turn d into NaN.
    if (c.weight_decay != 0) d += c.weight_decay * param[i];
    if (buffer) {
      const T b = c.first_step ? d : c.momentum * buffer[i] + c.one_minus_dampening * d;
      buffer[i] = b;
      d = c.nesterov ? d + c.momentum * b : b;
    }
    param[i] -= c.lr * d;
    if (rounded) rounded[i] = static_cast<L>(param[i]);
  }
}

template <class T>
double sum_of_squares(const T* x, int64_t n) {
  const int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
#pragma omp parallel for schedule(static) if (n > kParallelWork)
  for (int64_t b = 0; b < blocks; ++b) {
    double s = 0;
    const int64_t end = std::min(n, (b + 1) * kSumBlock);
    for (int64_t i = b * kSumBlock; i < end; ++i) {
      const double v = static_cast<double>(x[i]);
      s += v * v;
    }
    partial[static_cast<size_t>(b)] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

template <class S, class C>
void scale(S* x, int64_t n, C s) {
#pragma omp parallel for schedule(static) if (n > kParallelWork)
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<S>(static_cast<C>(x[i]) * s);
}

// The combinations kernels/optimizers.cpp dispatches to: f32 params with f32 or bf16 gradients,
// f64 params, and f32 masters of bf16 or f16 params (gradients in the param's dtype).
#define OCTET_OPTIMIZER_INSTANCES(T, G, L)                                                                  \
  template void adamw_step<T, G, L>(T*, const G*, T*, T*, L*, int64_t, const AdamWConstants<T>&);          \
  template void sgd_step<T, G, L>(T*, const G*, T*, L*, int64_t, const SgdConstants<T>&);
OCTET_OPTIMIZER_INSTANCES(float, float, float)
OCTET_OPTIMIZER_INSTANCES(float, bfloat16, float)
OCTET_OPTIMIZER_INSTANCES(double, double, double)
OCTET_OPTIMIZER_INSTANCES(float, bfloat16, bfloat16)
OCTET_OPTIMIZER_INSTANCES(float, float16, float16)
#undef OCTET_OPTIMIZER_INSTANCES
template double sum_of_squares<float>(const float*, int64_t);
template double sum_of_squares<double>(const double*, int64_t);
template void scale<float, float>(float*, int64_t, float);
template void scale<bfloat16, float>(bfloat16*, int64_t, float);
template void scale<float16, float>(float16*, int64_t, float);
template void scale<double, double>(double*, int64_t, double);

}  // namespace octet::kernels::cpu
