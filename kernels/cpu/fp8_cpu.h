#pragma once
// CPU implementations behind kernels/fp8.h. The entry points in kernels/fp8.cpp have checked the
// arguments; here x is a contiguous buffer of storage type X (float, bfloat16 or float16 from
// core/float_formats.h), read as [rows, cols], and every scale tensor is a plain f32 array.
//
// The element arithmetic is the CUDA kernels' (kernels/cuda/fp8.cu), from the same headers:
// q = float_to_e4m3/e5m2(float(x) · scale, saturate) (here through float_to_fp8_saturating below,
// which gives the same bits) and the rules of kernels/fp8_scale_rule.h, so both backends agree.
#include <algorithm>
#include <cstdint>

#include "core/dtype.h"
#include "core/float_formats.h"

namespace octet::kernels::cpu {

// float_to_e4m3(x, /*saturate=*/true) (kE5M2 false) or float_to_e5m2(x, true), bit for bit for every
// float (checked over all 2^32 inputs), written without branches so that the cast's loop vectorises:
// with the branchy reference the casts took about a third of an FP8 training step on the CPU.
// A magnitude that is normal in FP8 is rounded in the integer domain (rebias, then round to nearest
// even by adding just under half an ulp plus the kept part's low bit); a smaller one is rounded by one
// f32 addition of 2^e whose ulp is FP8's smallest subnormal, so the sum's low bits are the code. That
// addition rounds to nearest even in the default rounding mode, and denormals-are-zero or
// flush-to-zero would change nothing (an f32 subnormal is far below half FP8's smallest subnormal).
template <bool kE5M2>
inline uint8_t float_to_fp8_saturating(float x) {
  constexpr int32_t kMant = kE5M2 ? 2 : 3, kBias = kE5M2 ? 15 : 7;
  constexpr int32_t kShift = 23 - kMant;
  constexpr int32_t kSmallestNormal = (127 - kBias + 1) << 23;  // f32 bits of FP8's smallest normal
  constexpr int32_t kRebias = (127 - kBias) << 23;
  constexpr int32_t kMaxCode = kE5M2 ? 0x7B : 0x7E;
  const float subnormal_magic = detail::bits_float(static_cast<uint32_t>(127 + 23 + 1 - kBias - kMant) << 23);
  const uint32_t u = detail::float_bits(x);
  const int32_t mag = static_cast<int32_t>(u & 0x7FFFFFFFu);
  const int32_t sign = static_cast<int32_t>((u >> 24) & 0x80u);
  const int32_t kept = mag - kRebias;
  const int32_t normal = (kept + ((1 << (kShift - 1)) - 1) + ((kept >> kShift) & 1)) >> kShift;
  const int32_t subnormal = static_cast<int32_t>(
      detail::float_bits(detail::bits_float(static_cast<uint32_t>(mag)) + subnormal_magic) -
      detail::float_bits(subnormal_magic));
  // Masks rather than ?: so that the compiler keeps the f32 addition outside any branch (under its
  // default -ftrapping-math it does not move a float operation out of one, and the loop stays scalar).
  const int32_t normal_mask = -static_cast<int32_t>(mag >= kSmallestNormal);
  const int32_t nan_mask = -static_cast<int32_t>(mag > 0x7F800000);
  const int32_t code = std::min((normal & normal_mask) | (subnormal & ~normal_mask), kMaxCode);  // inf saturates
  return static_cast<uint8_t>((0x7F & nan_mask) | ((sign | code) & ~nan_mask));  // a NaN is 0x7F, sign dropped
}

// Writes data[r, c] = fp8(x[r, c]·scale) when data is non-null and transposed[c, r] = the same byte
// when transposed is non-null, with transposed[c, rows..padded_rows) = 0. Returns amax(x) as bits:
// the largest of (bits of float(x[i])) & 0x7FFFFFFF, an order- and thread-count-independent result.
template <class X>
uint32_t fp8_cast(const X* x, int64_t rows, int64_t cols, float scale, DType fp8_dtype, uint8_t* data,
                  uint8_t* transposed, int64_t padded_rows);

// fp8_cast, and column_sums[c] = Σ_r float(x[r, c]) in f32, summed in exactly the order of
// kernels::sum over dim 0 of a [rows, cols] tensor with cols > 1 (kernels/cpu/reduce.cpp's
// pairwise_rows), so that the sums are the same bits. One sweep over x (kernels/cpu/fp8.cpp).
template <class X>
uint32_t fp8_cast_column_sums(const X* x, int64_t rows, int64_t cols, float scale, DType fp8_dtype, uint8_t* data,
                              uint8_t* transposed, int64_t padded_rows, float* column_sums);

// amax(x) as bits, as fp8_cast returns it.
template <class X>
uint32_t fp8_amax_bits(const X* x, int64_t n);

// Delayed scaling for one group: history is [L, n], scale and scale_inv [n] (kernels/fp8.h).
void fp8_update_scales(float* history, float* scale, float* scale_inv, int64_t L, int64_t n, float fp8_max,
                       float two_pow_margin, bool most_recent);

// Current scaling: scale[j], scale_inv[j] from amax[j], for j < n.
void fp8_scale_from_amax(const float* amax, float* scale, float* scale_inv, int64_t n, float fp8_max,
                         float two_pow_margin);

}  // namespace octet::kernels::cpu
