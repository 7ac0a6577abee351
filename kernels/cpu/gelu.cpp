// GELU, on the CPU. Two forms, as in PyTorch's approximate="none" | "tanh":
//
// erf (exact):  y = x · Φ(x) = ½·x·(1 + erf(x/√2))
//               dy/dx = Φ(x) + x·φ(x),   φ(x) = exp(-x²/2) / √(2π)
//
// tanh:         u = √(2/π)·(x + 0.044715·x³),   y = ½·x·(1 + tanh u)
//               dy/dx = ½·(1 + tanh u) + ½·x·(1 - tanh² u)·√(2/π)·(1 + 3·0.044715·x²)
//
// In f32 both forms run through kernels/cpu/vec_math.h, which vectorizes: the erf form as x·Φ(x)
// (Φ keeps its relative accuracy in the left tail, where 1 + erf would cancel), the tanh form through
// ½·(1 + tanh u) = σ(2u) and 1 - tanh² u = 4·σ(2u)·(1 - σ(2u)). f64 keeps the std:: functions.
#include <cmath>
#include <numbers>

#include "kernels/cpu/bf16_chunks.h"
#include "kernels/cpu/nn_ops_cpu.h"
#include "kernels/cpu/vec_math.h"

namespace octet::kernels::cpu {
namespace {

template <class T>
struct GeluConstants {
  static constexpr T inv_sqrt2 = static_cast<T>(1.0 / std::numbers::sqrt2);
  static constexpr T inv_sqrt_2pi = static_cast<T>(std::numbers::inv_sqrtpi / std::numbers::sqrt2);
  static constexpr T sqrt_2_over_pi = static_cast<T>(std::numbers::sqrt2 * std::numbers::inv_sqrtpi);
  static constexpr T cubic = static_cast<T>(0.044715);
};

template <class T>
T gelu_erf(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * GeluConstants<T>::inv_sqrt2));
}

template <class T>
T gelu_erf_grad(T x) {
  using K = GeluConstants<T>;
  const T cdf = T(0.5) * (T(1) + std::erf(x * K::inv_sqrt2));
  const T pdf = K::inv_sqrt_2pi * std::exp(T(-0.5) * x * x);
  return cdf + x * pdf;
}

template <class T>
T gelu_tanh(T x) {
  using K = GeluConstants<T>;
  const T t = std::tanh(K::sqrt_2_over_pi * (x + K::cubic * x * x * x));
  return T(0.5) * x * (T(1) + t);
}

template <class T>
T gelu_tanh_grad(T x) {
  using K = GeluConstants<T>;
  const T t = std::tanh(K::sqrt_2_over_pi * (x + K::cubic * x * x * x));
  const T sech2 = T(1) - t * t;
  // Far out in the tails sech² is exactly 0 while x² may overflow; 0·inf would give NaN.
  const T tail = sech2 == T(0) ? T(0) : T(0.5) * x * sech2 * K::sqrt_2_over_pi * (T(1) + T(3) * K::cubic * x * x);
  return T(0.5) * (T(1) + t) + tail;
}

// ---- f32, vectorized ------------------------------------------------------------------------------------

using Kf = GeluConstants<float>;

// Far out in the tails σ(1 - σ) is exactly 0 while x² may overflow; 0·inf would give NaN.
inline float tanh_tail(float x, float s) {
  const float sech2 = 4.0f * s * (1.0f - s);
  return vec::select(sech2 == 0.0f, 0.0f, 0.5f * x * sech2 * Kf::sqrt_2_over_pi * (1.0f + 3.0f * Kf::cubic * x * x));
}

OCTET_SIMD_CLONES void gelu_forward_f32(const float* x, float* y, int64_t n, bool tanh_form) {
  if (tanh_form) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float u = Kf::sqrt_2_over_pi * (x[i] + Kf::cubic * x[i] * x[i] * x[i]);
      y[i] = x[i] * vec::sigmoid(2.0f * u);
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * vec::normal_cdf(x[i]);
  }
}

OCTET_SIMD_CLONES void gelu_backward_f32(const float* dy, const float* x, float* dx, int64_t n, bool tanh_form) {
  if (tanh_form) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float u = Kf::sqrt_2_over_pi * (x[i] + Kf::cubic * x[i] * x[i] * x[i]);
      const float s = vec::sigmoid(2.0f * u);
      dx[i] = dy[i] * (s + tanh_tail(x[i], s));
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float pdf = Kf::inv_sqrt_2pi * vec::exp(-0.5f * x[i] * x[i]);
      dx[i] = dy[i] * (vec::normal_cdf(x[i]) + x[i] * pdf);
    }
  }
}

// The same in f64 with the std:: functions.
void gelu_forward_range(const double* x, double* y, int64_t n, bool tanh_form) {
  for (int64_t i = 0; i < n; ++i) y[i] = tanh_form ? gelu_tanh(x[i]) : gelu_erf(x[i]);
}
void gelu_backward_range(const double* dy, const double* x, double* dx, int64_t n, bool tanh_form) {
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (tanh_form ? gelu_tanh_grad(x[i]) : gelu_erf_grad(x[i]));
}
void gelu_forward_range(const float* x, float* y, int64_t n, bool tanh_form) { gelu_forward_f32(x, y, n, tanh_form); }
void gelu_backward_range(const float* dy, const float* x, float* dx, int64_t n, bool tanh_form) {
  gelu_backward_f32(dy, x, dx, n, tanh_form);
}

}  // namespace

template <class T>
void gelu_forward(const T* x, T* y, int64_t n, GeluApproximation approximation) {
  const bool tanh_form = approximation == GeluApproximation::Tanh;
  parallel_ranges(n, kParallelElements,
                  [&](int64_t lo, int64_t hi) { gelu_forward_range(x + lo, y + lo, hi - lo, tanh_form); });
}

template <class T>
void gelu_backward(const T* dy, const T* x, T* dx, int64_t n, GeluApproximation approximation) {
  const bool tanh_form = approximation == GeluApproximation::Tanh;
  parallel_ranges(n, kParallelElements, [&](int64_t lo, int64_t hi) {
    gelu_backward_range(dy + lo, x + lo, dx + lo, hi - lo, tanh_form);
  });
}

void gelu_forward_bf16(const bfloat16* x, bfloat16* y, int64_t n, GeluApproximation approximation) {
  const bool tanh_form = approximation == GeluApproximation::Tanh;
  map_bf16_in_f32<1>({x}, y, n,
                     [&](const float* xf, float* yf, int64_t count) { gelu_forward_f32(xf, yf, count, tanh_form); });
}

void gelu_backward_bf16(const bfloat16* dy, const bfloat16* x, bfloat16* dx, int64_t n,
                        GeluApproximation approximation) {
  const bool tanh_form = approximation == GeluApproximation::Tanh;
  map_bf16_in_f32<2>({dy, x}, dx, n, [&](const float* dyf, const float* xf, float* dxf, int64_t count) {
    gelu_backward_f32(dyf, xf, dxf, count, tanh_form);
  });
}

template void gelu_forward<float>(const float*, float*, int64_t, GeluApproximation);
template void gelu_forward<double>(const double*, double*, int64_t, GeluApproximation);
template void gelu_backward<float>(const float*, const float*, float*, int64_t, GeluApproximation);
template void gelu_backward<double>(const double*, const double*, double*, int64_t, GeluApproximation);

}  // namespace octet::kernels::cpu
