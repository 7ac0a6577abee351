#pragma once
// GELU's element arithmetic on the GPU, erf and tanh forms, shared by gelu.cu and the GELU writing FP8
// (gelu_fp8.cu), so that the fused kernels compute every element with the very code gelu_forward and
// gelu_backward run. The formulas are the CPU kernel's (kernels/cpu/gelu.cpp):
//   erf:  y = x·Φ(x),                       dy/dx = Φ(x) + x·φ(x)
//   tanh: y = x·σ(2u), u = √(2/π)(x + 0.044715x³),
//         dy/dx = σ(2u) + ½·x·4σ(1-σ)·√(2/π)(1 + 3·0.044715x²)
// Φ is normcdff, which keeps its relative accuracy in the left tail where 1 + erf would cancel.
//
// Bits. The compiler contracts a·b + c into an FMA (nvcc's default --fmad=true) where it sees fit, and
// it did not see fit alike in every instantiation of one inlined function (the LayerNorm's element,
// layernorm_rows.cuh). So every multiply and add here is an _rn intrinsic, which is never contracted:
// each rounds once, in the order written, whichever kernel inlines it. expf and normcdff are the CUDA
// library's, the same code in every kernel. Included by .cu files only.
#include "kernels/cuda/common.cuh"

namespace octet::kernels::cuda {

inline constexpr float kGeluInvSqrt2Pi = 0.3989422804014327f;
inline constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
inline constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float gelu_sigmoid_of_2u(float x) {
  const float cube = __fmul_rn(__fmul_rn(__fmul_rn(kGeluCubic, x), x), x);
  const float u = __fmul_rn(kGeluSqrt2OverPi, __fadd_rn(x, cube));
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(__fmul_rn(-2.0f, u))));
}

// x -> y. (The second operand is unused: the elementwise map passes one to every op.)
template <bool kTanh>
struct GeluForward {
  __device__ __forceinline__ float operator()(float x, float) const {
    if constexpr (kTanh) return __fmul_rn(x, gelu_sigmoid_of_2u(x));
    else return __fmul_rn(x, normcdff(x));
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
      const float pdf = __fmul_rn(kGeluInvSqrt2Pi, expf(__fmul_rn(__fmul_rn(-0.5f, x), x)));
      return __fmul_rn(dy, __fadd_rn(normcdff(x), __fmul_rn(x, pdf)));
    }
  }
};

}  // namespace octet::kernels::cuda
