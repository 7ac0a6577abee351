#pragma once
// Float math that vectorizes, for the CPU kernels' hot loops, and the macro that compiles them for AVX2.
//
// std::exp and std::erf are scalar library calls (GELU spent ~8 ns per element in them); these are
// branch-free polynomials that GCC turns into SIMD code inside an `omp simd` loop. Accuracy is that
// of float arithmetic (errors are stated per function); the f64 kernels keep the std:: functions.
//
// OCTET_SIMD_CLONES compiles a function twice, for x86-64-v3 (AVX2 + FMA) and for the baseline, and
// picks one at load time: the build has no -march flag, so without it every loop would be SSE2.
// OpenMP parallel regions must stay outside such a function (their outlined bodies would not be
// cloned): kernels call a cloned function per range of parallel_ranges() (kernels/cpu/parallel.h).
#include <bit>
#include <cstdint>

#include "kernels/cpu/parallel.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OCTET_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OCTET_SIMD_CLONES
#endif

namespace octet::kernels::cpu {

namespace vec {

// c ? a : b as bit masks. GCC keeps a plain ?: on floats as a branch (under -ftrapping-math it may not
// evaluate both arms), and a loop with a branch does not vectorize; this compiles to compare + blend.
inline float select(bool c, float a, float b) {
  const int32_t m = -static_cast<int32_t>(c);
  return std::bit_cast<float>((std::bit_cast<int32_t>(a) & m) | (std::bit_cast<int32_t>(b) & ~m));
}

// 2^n for integer-valued n in [-126, 127], from the exponent bits.
inline float pow2i(int32_t n) { return std::bit_cast<float>(static_cast<int32_t>((n + 127) << 23)); }

// e^x within 2 ulp (Cephes' expf polynomial). x = n·ln2 + r with |r| <= ln2/2; 2^n is applied in two
// halves so that results near overflow and in the subnormal range come out right. Below -103.98 the
// result is 0, above 88.73 it is inf, NaN stays NaN.
inline float exp(float x) {
  // Clamping keeps n small enough for the two halves; written so that NaN passes through.
  float xc = select(x < -104.0f, -104.0f, x);
  xc = select(xc > 89.0f, 89.0f, xc);
  // Round x·log2(e) to the nearest integer with the 1.5·2^23 trick (no SSE4.1 rounding needed).
  const float shifter = 12582912.0f;
  const float nf = (xc * 1.44269504088896341f + shifter) - shifter;
  // ln2 split in two so that n·ln2_hi is exact and r keeps its low bits.
  const float r = (xc - nf * 0.693359375f) - nf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t n = static_cast<int32_t>(nf);
  const int32_t half = n >> 1;
  return p * pow2i(half) * pow2i(n - half);
}

// x² as an unevaluated sum hi + lo, exactly (Dekker's product). x is split by masking off its low 12
// mantissa bits, so every partial product is exact; that holds with or without FMA contraction.
inline void square_exact(float x, float& hi, float& lo) {
  const float xh = std::bit_cast<float>(std::bit_cast<int32_t>(x) & int32_t(0xfffff000));
  const float xl = x - xh;
  hi = x * x;
  lo = ((xh * xh - hi) + 2.0f * xh * xl) + xl * xl;
}

// Φ(x) = P(N(0,1) <= x) = ½·erfc(-x/√2), within 6 ulp for |x| < 10 (in the left tail too, where
// 1 + erf(x/√2) would cancel). Numerical Recipes' erfc fit, fractional error < 1.2e-7 for all a >= 0:
//   erfc(a) = t·exp(-a² + P(t)),  t = 1/(1 + a/2),  a = |x|/√2
// Φ is sensitive to the exponent (its relative error is the exponent's absolute error), so -a² =
// -x²/2 is carried exactly as hi + lo and the sum with P(t) keeps its rounding error (Knuth's
// two-sum); exp(s_hi + s_lo) = exp(s_hi)·(1 + s_lo). |x| is capped at 20, where Φ is 0 in float.
inline float normal_cdf(float x) {
  const float ax = select(std::bit_cast<float>(std::bit_cast<int32_t>(x) & 0x7fffffff) > 20.0f, 20.0f,
                          std::bit_cast<float>(std::bit_cast<int32_t>(x) & 0x7fffffff));  // NaN passes
  const float a = ax * 0.707106781186547524f;
  const float t = 1.0f / (1.0f + 0.5f * a);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  float sq_hi, sq_lo;
  square_exact(ax, sq_hi, sq_lo);
  const float e_hi = -0.5f * sq_hi, e_lo = -0.5f * sq_lo;  // -a², exactly
  const float s_hi = p + e_hi;
  const float b = s_hi - p;
  const float s_lo = ((p - (s_hi - b)) + (e_hi - b)) + e_lo;
  const float half_erfc = 0.5f * t * (exp(s_hi) * (1.0f + s_lo));  // ½·erfc(|x|/√2)
  return select(x < 0.0f, half_erfc, 1.0f - half_erfc);
}

// 1 / (1 + e^-x), with both tails exact in the limit (0 and 1, never NaN for finite x).
inline float sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }

}  // namespace vec
}  // namespace octet::kernels::cpu
