#pragma once
// The element arithmetic of the GPU FP8 casts, shared by fp8.cu and the LayerNorm writing FP8
// (layernorm_fp8.cu), so that both write the same byte and the same amax for the same value.
// q = float_to_e4m3/e5m2(v·scale, saturate) with v·scale one correctly rounded f32 product, from the
// host/device code the CPU runs (core/float_formats.h); amax is the largest |v| bit pattern, and
// atomicMax on those bits is valid because they are non-negative integers in the order of the
// values (NaN and inf propagate). Included by .cu files only.
#include <cstdint>
#include <type_traits>

#include "core/float_formats.h"
#include "kernels/cuda/common.cuh"

namespace octet::kernels::cuda {

__device__ __forceinline__ uint32_t magnitude_bits(float v) { return __float_as_uint(v) & 0x7FFFFFFFu; }

template <bool kE5M2>
__device__ __forceinline__ uint8_t quantise(float v, float scale) {
  const float scaled = __fmul_rn(v, scale);
  return kE5M2 ? float_to_e5m2(scaled, /*saturate=*/true) : float_to_e4m3(scaled, /*saturate=*/true);
}

// The block's largest value of `v` (unsigned), in every thread. scratch: __shared__ uint32_t[32].
__device__ __forceinline__ uint32_t block_max_bits(uint32_t v, uint32_t* scratch) {
  return block_reduce(v, scratch, 0u, [](uint32_t x, uint32_t y) { return max(x, y); });
}

// amax ← max(amax, bits) for the block's result; a block that saw only zeros changes nothing.
// Every thread of the block calls it.
__device__ __forceinline__ void publish_amax(uint32_t local, uint32_t* scratch, unsigned int* amax_bits) {
  const uint32_t block = block_max_bits(local, scratch);
  if (threadIdx.x == 0 && amax_bits != nullptr && block != 0) atomicMax(amax_bits, block);
}

// The value fp8_cast reads from an element stored as T (the device types of common.cuh): widened by
// core/float_formats.h's code, as fp8.cu widens through the host types. Equal to to_float(t) except
// for NaN, which core/float_formats.h makes the one positive quiet NaN for f16; the amax bits see it.
template <class T>
__device__ __forceinline__ float widen_stored(T t) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return bf16_bits_to_float(__bfloat16_as_ushort(t));
  } else if constexpr (std::is_same_v<T, __half>) {
    return f16_bits_to_float(__half_as_ushort(t));
  } else {
    return t;
  }
}

// Four consecutive elements, loaded (or stored) as one access.
template <class X>
struct alignas(4 * sizeof(X)) Quad {
  X v[4];
};

// Four FP8 bytes as one 32-bit word, b[0] at the lowest address.
__device__ __forceinline__ uint32_t pack_bytes(const uint8_t b[4]) {
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
}

// pack_bytes of quantise<kE5M2>(v[j], scale) for j = 0..3, with the same products: on sm_89 and later
// the conversions are the hardware's cvt.rn.satfinite.{e4m3,e5m2}x2.f32, two values per instruction,
// against ~45 instructions per value for core/float_formats.h's integer code. Both round to nearest
// even once from the f32 product, saturate finite overflow and ±inf to ±max, and give 0x7F for every
// NaN; the GPU test CudaFp8Elements.HardwareConversionEqualsQuantiseForEveryFloat compares the two for
// all 2^32 float inputs in both formats.
template <bool kE5M2>
__device__ __forceinline__ uint32_t quantise4(const float v[4], float scale) {
  const float p0 = __fmul_rn(v[0], scale), p1 = __fmul_rn(v[1], scale);
  const float p2 = __fmul_rn(v[2], scale), p3 = __fmul_rn(v[3], scale);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t word;
  // cvt d, a, b puts a's byte in d's upper half: (p1, p0) gives p0 the lowest byte.
  if constexpr (kE5M2) {
    asm("{ .reg .b16 lo, hi;\n"
        "  cvt.rn.satfinite.e5m2x2.f32 lo, %2, %1;\n"
        "  cvt.rn.satfinite.e5m2x2.f32 hi, %4, %3;\n"
        "  mov.b32 %0, {lo, hi}; }"
        : "=r"(word)
        : "f"(p0), "f"(p1), "f"(p2), "f"(p3));
  } else {
    asm("{ .reg .b16 lo, hi;\n"
        "  cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        "  cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        "  mov.b32 %0, {lo, hi}; }"
        : "=r"(word)
        : "f"(p0), "f"(p1), "f"(p2), "f"(p3));
  }
  return word;
#else
  const uint8_t b[4] = {quantise<kE5M2>(v[0], scale), quantise<kE5M2>(v[1], scale), quantise<kE5M2>(v[2], scale),
                        quantise<kE5M2>(v[3], scale)};
  return pack_bytes(b);
#endif
}

// The 4×4 byte block whose row i is the word row[i] (byte j = column j), transposed: col[j] holds
// column j, row 0 in its lowest byte. Eight byte permutes.
__device__ __forceinline__ void transpose_bytes_4x4(const uint32_t row[4], uint32_t col[4]) {
  const uint32_t r01_lo = __byte_perm(row[0], row[1], 0x5140);  // r0.b0 r1.b0 r0.b1 r1.b1
  const uint32_t r01_hi = __byte_perm(row[0], row[1], 0x7362);  // r0.b2 r1.b2 r0.b3 r1.b3
  const uint32_t r23_lo = __byte_perm(row[2], row[3], 0x5140);
  const uint32_t r23_hi = __byte_perm(row[2], row[3], 0x7362);
  col[0] = __byte_perm(r01_lo, r23_lo, 0x5410);
  col[1] = __byte_perm(r01_lo, r23_lo, 0x7632);
  col[2] = __byte_perm(r01_hi, r23_hi, 0x5410);
  col[3] = __byte_perm(r01_hi, r23_hi, 0x7632);
}

}  // namespace octet::kernels::cuda
