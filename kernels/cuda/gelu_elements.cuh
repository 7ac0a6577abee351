#pragma once
// GELU's element arithmetic on the GPU, erf and tanh forms, shared by gelu.cu and the GELU writing FP8
// (gelu_fp8.cu), so that the fused kernels compute every element with the very code gelu_forward and
// gelu_backward run. The formulas are the CPU kernel's (kernels/cpu/gelu.cpp):
//   erf:  y = x·Φ(x),                       dy/dx = Φ(x) + x·φ(x)
//   tanh: y = x·σ(2u), u = √(2/π)(x + 0.044715x³),
//         dy/dx = σ(2u) + ½·x·4σ(1-σ)·√(2/π)(1 + 3·0.044715x²)
//
// Cost. The forward moves 4 bytes per bf16 element (0.93 ps at 4.3 TB/s) and the backward 6 (1.4 ps),
// while the GPU issues one instruction per element every 0.03 ps (132 SMs × 128 lanes × 1.98 GHz ≈
// 3.3e13 per second): past ~30 instructions per element (forward) or ~45 (backward), the issue rate,
// not the memory, sets these kernels' time, and the FP8 casts fused with GELU (gelu_fp8.cu) add their
// own. normcdff alone is ~93 PTX instructions (rational approximations with two reciprocals, an
// exponential and a branch). So, per the output's dtype:
//   - f32 outputs: Φ from erff, ~25 instructions (two polynomials picked by select, one ex2):
//       Φ(x) = ½ + ½·erf(x/√2)                 one FMA after erff
//       φ(x) = (1/√(2π))·2^(−x²·½·log2 e)       exp2f (ex2.approx, 2 ulp), not expf's range reduction
//   - 16-bit outputs (bf16, f16), which keep 8 or 11 bits: Abramowitz & Stegun 7.1.26, erfc(a) =
//     t·P(t)·e^(−a²) with t = 1/(1 + 0.3275911·a) and P of degree 4 (|error| <= 1.5e-7 on erf), for
//     a = |x|/√2; e^(−a²) is e^(−x²/2), so the backward's φ comes with it. One reciprocal and one ex2
//     (both the hardware's approximations), five FMAs, a handful of multiplies.
// PTX instructions per element of the erf form's math (`nvcc -ptx`, constant moves included): forward
// 94 -> 33 (f32) and 24 (16-bit), backward 119 -> 39 (f32) and 28 (16-bit); 8 and 9 of the 16-bit
// forms' are constant moves, which become immediates in the machine code.
//
// Accuracy, f32. erff is within 2 ulp, so Φ is within 1.1e-7 absolutely everywhere (with the roundings
// of x/√2 and of the FMA), and relatively where Φ >= ½. In the left tail Φ(x) is small and ½ + ½·erf
// cancels: below x ≈ -4 (Φ < 3.2e-5) Φ keeps its absolute error but loses relative accuracy, and below
// x ≈ -5.4 it is 0 (erf rounds to -1). The output's error there is 1.1e-7·|x| at most (y = x·Φ), under
// the 1e-5 norm-wise tolerance the f32 tests hold the GPU to against the CPU's f32 (whose Φ keeps its
// relative accuracy) for any input with a normal spread of values: at x < -4 the exact GELU is below
// 1.3e-4 in magnitude. φ's argument x²·½·log2 e is rounded twice (relative 2.5·2^-24), which changes
// 2^(·) by 7.5e-8·x² relatively, on top of exp2f's 2 ulp and the last product: φ is within
// 3.3e-7 + 7.5e-8·x² relatively (1.5e-6 at |x| = 4, where φ = 1.3e-4); beyond, φ is negligible against Φ
// (the backward) or absent (the forward). CudaGelu.ErfFormWithinItsErrorBoundsOfTheExactGelu holds the
// GPU to these bounds against the f64 GELU over [-14, 14].
// Accuracy, 16-bit outputs. Φ = ½·erfc(|x|/√2) or 1 minus it, within 1e-6 absolutely, to first order:
// the formula's 0.75e-7; the reciprocal's 2 ulp and its argument's rounding, 3e-7 relative on t, which
// is a shift of a by 3e-7·(1 + p·a)/p and moves Φ by at most 5.3e-7 (max of e^(−a²)(1 + p·a)/(p√π)
// is 1.77); P's five roundings, 1.7e-7; e^(−x²/2) through an argument rounded twice (7.5e-8·x²
// relative on the result) and ex2's 2 ulp, 1.3e-7; the last two roundings, 0.6e-7. φ = e^(−x²/2)/√(2π)
// is within 3.3e-7 + 7.5e-8·x² relatively. So y is within 1e-6·|x| and dy/dx within 1.2e-6 (+ f32's rounding)
// of the exact values before the rounding to bf16 (2^-9 relative) or f16 (2^-12): at most one of the
// two 16-bit neighbours of the exact result, and the nearest one unless the exact result lies that
// close to a rounding boundary; CudaGelu.Narrow16BitOutputsRoundTheExactGelu checks it for every
// finite bf16 and f16 input. The left tail behaves as the f32 form's (absolute error only).
// Both forms, at x = ±inf, give what the CPU gives: y(+inf) = inf, y(-inf) = NaN (-inf·0), and
// dy/dx = NaN (inf·0 in x·φ).
//
// Bits. The compiler contracts a·b + c into an FMA (nvcc's default --fmad=true) where it sees fit, and
// it did not see fit alike in every instantiation of one inlined function (the LayerNorm's element,
// layernorm_rows.cuh). So every multiply and add here is an _rn intrinsic, which is never contracted
// (__fmaf_rn is an FMA where one is written): each rounds once, in the order written, whichever kernel
// inlines it. erff, exp2f and expf are the CUDA library's, written with explicit FMAs, and rcp.approx and
// ex2.approx single instructions: the same code and bits in every kernel. The form a kernel uses depends
// on its storage type alone (GeluForwardOf, GeluBackwardOf), so gelu.cu and the fused casts of
// gelu_fp8.cu agree. Included by .cu files only.
#include "kernels/cuda/common.cuh"

namespace octet::kernels::cuda {

inline constexpr float kGeluInvSqrt2 = 0.7071067811865476f;
inline constexpr float kGeluInvSqrt2Pi = 0.3989422804014327f;
inline constexpr float kGeluHalfLog2e = 0.7213475204444817f;  // ½·log2(e): e^(-x²/2) = 2^(-x²·½·log2 e)
inline constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
inline constexpr float kGeluCubic = 0.044715f;

// Φ(x) = ½ + ½·erf(x/√2), one rounding after erff (½·erf is exact).
__device__ __forceinline__ float gelu_normal_cdf(float x) {
  return __fmaf_rn(0.5f, erff(__fmul_rn(x, kGeluInvSqrt2)), 0.5f);
}

// φ(x) = e^(-x²/2)/√(2π). x² overflows to inf for |x| > 1.8e19, which gives 2^-inf = 0.
__device__ __forceinline__ float gelu_normal_pdf(float x) {
  return __fmul_rn(kGeluInvSqrt2Pi, exp2f(__fmul_rn(__fmul_rn(x, x), -kGeluHalfLog2e)));
}

// The hardware's approximate reciprocal and 2^g (MUFU.RCP, MUFU.EX2: 1 and 2 ulp), subnormals flushed:
// their inputs here are >= 1 (the reciprocal) and a result under 2^-126 (e^(−x²/2) for |x| > 13.2) only
// scales terms that are then far below the result's rounding.
__device__ __forceinline__ float gelu_rcp_approx(float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return r;
}
__device__ __forceinline__ float gelu_exp2_approx(float g) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(g));
  return r;
}

// Φ(x) for 16-bit outputs (Abramowitz & Stegun 7.1.26), and gauss = e^(−x²/2) on the side: with
// a = |x|/√2 and t = 1/(1 + p·a), q = ½·erfc(a) = t·(b1 + t·(b2 + t·(b3 + t·(b4 + t·b5))))·e^(−a²), the
// b's half of A&S's a's; Φ = q below 0 and 1 − q above. a itself is never formed: p·a = (p/√2)·|x| and
// a² = x²/2, which saves a multiply and a rounding.
inline constexpr float kGeluAsPOverSqrt2 = 0.2316418882663604f;  // 0.3275911/√2
__device__ __forceinline__ float gelu_normal_cdf_narrow(float x, float& gauss) {
  const float t = gelu_rcp_approx(__fmaf_rn(kGeluAsPOverSqrt2, fabsf(x), 1.0f));
  float r = __fmaf_rn(t, 0.5307027145f, -0.7265760135f);
  r = __fmaf_rn(t, r, 0.7107068705f);
  r = __fmaf_rn(t, r, -0.142248368f);
  r = __fmaf_rn(t, r, 0.127414796f);
  r = __fmul_rn(t, r);
  gauss = gelu_exp2_approx(__fmul_rn(__fmul_rn(x, -kGeluHalfLog2e), x));
  const float q = __fmul_rn(r, gauss);
  return x < 0.0f ? q : __fsub_rn(1.0f, q);
}

// σ(2u) = 1 / (1 + e^(-2u)). __frcp_rn(d) is the correctly rounded 1/d, the bits of __fdiv_rn(1, d) for
// every d, in fewer instructions.
__device__ __forceinline__ float gelu_sigmoid_of_2u(float x) {
  const float cube = __fmul_rn(__fmul_rn(__fmul_rn(kGeluCubic, x), x), x);
  const float u = __fmul_rn(kGeluSqrt2OverPi, __fadd_rn(x, cube));
  return __frcp_rn(__fadd_rn(1.0f, expf(__fmul_rn(-2.0f, u))));
}

// x -> y. (The second operand is unused: the elementwise map passes one to every op.) kNarrow: the
// output is 16-bit (bf16, f16), which picks the erf form's cheaper Φ; the tanh form has one formula.
template <bool kTanh, bool kNarrow = false>
struct GeluForward {
  __device__ __forceinline__ float operator()(float x, float) const {
    if constexpr (kTanh) {
      return __fmul_rn(x, gelu_sigmoid_of_2u(x));
    } else if constexpr (kNarrow) {
      float gauss;
      return __fmul_rn(x, gelu_normal_cdf_narrow(x, gauss));
    } else {
      return __fmul_rn(x, gelu_normal_cdf(x));
    }
  }
};

// (dy, x) -> dx
template <bool kTanh, bool kNarrow = false>
struct GeluBackward {
  __device__ __forceinline__ float operator()(float dy, float x) const {
    if constexpr (kTanh) {
      const float s = gelu_sigmoid_of_2u(x);
      const float sech2 = __fmul_rn(__fmul_rn(4.0f, s), __fsub_rn(1.0f, s));
      // Far out in the tails sech² is exactly 0 while x² may overflow; 0·inf would give NaN.
      float tail = 0.0f;
      if (sech2 != 0.0f) {
        const float slope = __fadd_rn(1.0f, __fmul_rn(__fmul_rn(3.0f * kGeluCubic, x), x));
        tail = __fmul_rn(__fmul_rn(__fmul_rn(__fmul_rn(0.5f, x), sech2), kGeluSqrt2OverPi), slope);
      }
      return __fmul_rn(dy, __fadd_rn(s, tail));
    } else if constexpr (kNarrow) {
      float gauss;
      const float cdf = gelu_normal_cdf_narrow(x, gauss);
      return __fmul_rn(dy, __fmaf_rn(x, __fmul_rn(kGeluInvSqrt2Pi, gauss), cdf));
    } else {
      // Φ + x·φ with one rounding: Φ and x·φ nearly cancel in the left tail (x = -4: 3.2e-5 and -5.4e-4).
      return __fmul_rn(dy, __fmaf_rn(x, gelu_normal_pdf(x), gelu_normal_cdf(x)));
    }
  }
};

// The forms for a storage type T (float, __nv_bfloat16, __half): what gelu.cu maps and gelu_fp8.cu fuses.
template <class T, bool kTanh>
using GeluForwardOf = GeluForward<kTanh, sizeof(T) == 2>;
template <class T, bool kTanh>
using GeluBackwardOf = GeluBackward<kTanh, sizeof(T) == 2>;

}  // namespace octet::kernels::cuda
