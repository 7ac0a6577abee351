#pragma once
// GELU's element arithmetic on the GPU, erf and tanh forms, shared by gelu.cu and the GELU writing FP8
// (gelu_fp8.cu), so that the fused kernels compute every element with the very code gelu_forward and
// gelu_backward run. The formulas are the CPU kernel's (kernels/cpu/gelu.cpp):
//   erf:  y = x·Φ(x),                       dy/dx = Φ(x) + x·φ(x)
//   tanh: y = x·σ(2u), u = √(2/π)(x + 0.044715x³),
//         dy/dx = σ(2u) + ½·x·4σ(1-σ)·√(2/π)(1 + 3·0.044715x²)
// Φ is normcdff, which keeps its relative accuracy in the left tail where 1 + erf would cancel.
//
// Bits. The compiler contracts a·b + c into an FMA (nvcc's default --fmad=true), so the bits depend
// on the instructions chosen. Both users inline these functions (__forceinline__) in the same library
// target with the same flags, and each result goes only into a rounding to the storage type (a
// conversion, never fused with arithmetic), so the contractions made inside are the same in both.
// Included by .cu files only.
#include "kernels/cuda/common.cuh"

namespace octet::kernels::cuda {

inline constexpr float kGeluInvSqrt2Pi = 0.3989422804014327f;
inline constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
inline constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float gelu_sigmoid_of_2u(float x) {
  const float u = kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return 1.0f / (1.0f + expf(-2.0f * u));
}

// x -> y. (The second operand is unused: the elementwise map passes one to every op.)
template <bool kTanh>
struct GeluForward {
  __device__ __forceinline__ float operator()(float x, float) const {
    if constexpr (kTanh) return x * gelu_sigmoid_of_2u(x);
    else return x * normcdff(x);
  }
};

// (dy, x) -> dx
template <bool kTanh>
struct GeluBackward {
  __device__ __forceinline__ float operator()(float dy, float x) const {
    if constexpr (kTanh) {
      const float s = gelu_sigmoid_of_2u(x);
      const float sech2 = 4.0f * s * (1.0f - s);
      // Far out in the tails sech² is exactly 0 while x² may overflow; 0·inf would give NaN.
      const float tail =
          sech2 == 0.0f ? 0.0f : 0.5f * x * sech2 * kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
      return dy * (s + tail);
    } else {
      const float pdf = kGeluInvSqrt2Pi * expf(-0.5f * x * x);
      return dy * (normcdff(x) + x * pdf);
    }
  }
};

}  // namespace octet::kernels::cuda
