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
// not the memory, sets these kernels' time. normcdff alone is ~93 PTX instructions (rational
// approximations with two reciprocals, an exponential and a branch); so Φ is taken from erff, ~25 (two
// polynomials picked by select, one ex2):
//   Φ(x) = ½ + ½·erf(x/√2)                   one FMA after erff
//   φ(x) = (1/√(2π))·2^(−x²·½·log2 e)         exp2f (ex2.approx, 2 ulp), not expf's range reduction
// PTX instructions per element of the erf form's math (`nvcc -ptx`, constant moves included): forward
// 94 -> 33, backward 119 -> 39; gelu.cu's bf16 loop over a 16-byte pack of 8 elements, loads, converts
// and stores included: forward 670 -> 258, backward 841 -> 312.
//
// Accuracy. erff is within 2 ulp, so Φ is within 1.1e-7 absolutely everywhere (with the roundings of
// x/√2 and of the FMA), and relatively where Φ >= ½. In the left tail Φ(x) is small and ½ + ½·erf
// cancels: below x ≈ -4 (Φ < 3.2e-5) Φ keeps its absolute error but loses relative accuracy, and below
// x ≈ -5.4 it is 0 (erf rounds to -1). The output's error there is 1.1e-7·|x| at most (y = x·Φ), far
// under the rounding of a bf16 output (2^-9 relative) of anything but the tail itself, and under the
// 1e-5 norm-wise tolerance the f32 tests hold the GPU to against the CPU's f32 (whose Φ keeps its
// relative accuracy) for any input with a normal spread of values: at x < -4 the exact GELU is below
// 1.3e-4 in magnitude. φ's argument x²·½·log2 e is rounded twice (relative 2.5·2^-24), which changes
// 2^(·) by 7.5e-8·x² relatively, on top of exp2f's 2 ulp and the last product: φ is within
// 3.3e-7 + 7.5e-8·x² relatively (1.5e-6 at |x| = 4, where φ = 1.3e-4); beyond, φ is negligible against Φ
// (the backward) or absent (the forward). CudaGelu.ErfFormWithinItsErrorBoundsOfTheExactGelu holds the
// GPU to these bounds against the f64 GELU over [-14, 14]. For x = ±inf both forms give what the CPU
// gives: y(+inf) = inf, y(-inf) = NaN (-inf·0), and dy/dx = NaN (inf·0 in x·φ).
//
// Bits. The compiler contracts a·b + c into an FMA (nvcc's default --fmad=true) where it sees fit, and
// it did not see fit alike in every instantiation of one inlined function (the LayerNorm's element,
// layernorm_rows.cuh). So every multiply and add here is an _rn intrinsic, which is never contracted
// (__fmaf_rn is an FMA where one is written): each rounds once, in the order written, whichever kernel
// inlines it. erff, exp2f and expf are the CUDA library's, written with explicit FMAs, the same code in
// every kernel. Included by .cu files only.
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

// σ(2u) = 1 / (1 + e^(-2u)). __frcp_rn(d) is the correctly rounded 1/d, the bits of __fdiv_rn(1, d) for
// every d, in fewer instructions.
__device__ __forceinline__ float gelu_sigmoid_of_2u(float x) {
  const float cube = __fmul_rn(__fmul_rn(__fmul_rn(kGeluCubic, x), x), x);
  const float u = __fmul_rn(kGeluSqrt2OverPi, __fadd_rn(x, cube));
  return __frcp_rn(__fadd_rn(1.0f, expf(__fmul_rn(-2.0f, u))));
}

// x -> y. (The second operand is unused: the elementwise map passes one to every op.)
template <bool kTanh>
struct GeluForward {
  __device__ __forceinline__ float operator()(float x, float) const {
    if constexpr (kTanh) return __fmul_rn(x, gelu_sigmoid_of_2u(x));
    else return __fmul_rn(x, gelu_normal_cdf(x));
  }
};

// (dy, x) -> dx
template <bool kTanh>
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
    } else {
      // Φ + x·φ with one rounding: Φ and x·φ nearly cancel in the left tail (x = -4: 3.2e-5 and -5.4e-4).
      return __fmul_rn(dy, __fmaf_rn(x, gelu_normal_pdf(x), gelu_normal_cdf(x)));
    }
  }
};

}  // namespace octet::kernels::cuda
