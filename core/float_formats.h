// Octet: narrow floating-point formats used for storage and compute.
//
// Every format here is "sign | exponent | fraction", value = (-1)^s * 1.f * 2^(e - bias)
// for a non-zero exponent field, and (-1)^s * 0.f * 2^(1 - bias) (subnormal) when the
// exponent field is zero.
//
//   format      bits  layout     bias  largest finite        specials
//   bfloat16    16    1-8-7      127   0x7F7F ~ 3.39e38      e=all ones: inf (f=0) / NaN (f!=0)
//   float16     16    1-5-10     15    0x7BFF = 65504        e=all ones: inf (f=0) / NaN (f!=0)
//   fp8 E4M3    8     1-4-3      7     0x7E   = 448          no inf; only S.1111.111 is NaN
//   fp8 E5M2    8     1-5-2      15    0x7B   = 57344        e=all ones: inf (f=0) / NaN (f!=0)
//
// E4M3 (OCP FP8) gives up infinities so that exponent field 1111 holds normal numbers,
// which buys one extra binade of range; E5M2 is simply the top byte of an IEEE half.
//
// All encoders round to nearest, ties to even, in a single step from the source value
// (double inputs are never rounded through float first). Results match the host-side
// conversion functions of the CUDA toolkit bit for bit, including their choices for
// NaN results:
//   * float/double -> bf16 or f16: any NaN becomes 0x7FFF (sign and payload dropped).
//   * float -> fp8: any NaN becomes 0x7F (positive) in both E4M3 and E5M2.
//   * double -> fp8: NaN keeps its sign; E4M3 gives S.1111.111, E5M2 gives
//     S.11111.1x where the fraction is 0b10 OR'd with the double's top two fraction bits.
//   * f16 / fp8 -> float: any NaN becomes 0x7FFFFFFF. bf16 -> float is exact (payload kept).
// FP8 overflow (a finite value whose rounded result exceeds the largest finite, or +-inf):
//   saturate=true  -> +-largest finite (inf saturates too);
//   saturate=false -> E4M3: NaN carrying the input's sign; E5M2: +-inf.
//
// Everything is header-only integer arithmetic, usable on host and in CUDA device code.
#pragma once

#include <cstdint>

#include "core/hostdevice.h"

namespace octet {

inline constexpr float kE4M3Max = 448.f;
inline constexpr float kE5M2Max = 57344.f;

namespace detail {

// Bit casts. Device code has intrinsics for this; on the host __builtin_memcpy is the
// well-defined way and compiles to a register move.
OCTET_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
#endif
}

OCTET_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
#endif
}

OCTET_HD uint64_t double_bits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  __builtin_memcpy(&u, &d, sizeof u);
  return u;
#endif
}

// Rounds a finite magnitude, given as the bit pattern of a wider IEEE format (SrcMant
// fraction bits, bias SrcBias, sign bit clear), to a narrower one (DstMant, DstBias),
// ties to even. Returns the narrow magnitude code (exponent field << DstMant | fraction).
// The code may exceed the narrow format's largest finite code; overflow policy is the
// caller's, since it differs per format.
template <typename U, int SrcMant, int SrcBias, int DstMant, int DstBias>
OCTET_HD uint32_t round_magnitude(U mag) {
  static_assert(DstMant < SrcMant && DstBias < SrcBias,
                "only narrowing conversions (a source subnormal must be a target subnormal)");
  const int src_exp = static_cast<int>(mag >> SrcMant);
  U kept;
  int shift;
  if (src_exp - SrcBias + DstBias >= 1) {
    // Normal in the target: rebias the exponent field in place and drop low fraction bits.
    // A round-up that carries out of the fraction increments the exponent field, which is
    // exactly the right answer (including rounding up into the "infinity" code).
    kept = mag - (static_cast<U>(SrcBias - DstBias) << SrcMant);
    shift = SrcMant - DstMant;
  } else {
    // Subnormal (or zero) in the target: make the implicit leading bit explicit and shift
    // right once more per binade below the target's minimum normal exponent. A round-up
    // that reaches 1 << DstMant lands exactly on the minimum normal code.
    const U frac = mag & ((U(1) << SrcMant) - 1);
    const int eff_exp = src_exp != 0 ? src_exp : 1;  // source subnormals use exponent 1
    kept = src_exp != 0 ? (frac | (U(1) << SrcMant)) : frac;
    shift = SrcMant - DstMant + 1 - (eff_exp - SrcBias + DstBias);
    // kept < 2^(SrcMant+1), so at this shift it is below half the smallest subnormal
    // (or at most exactly half, which ties to the even code 0). Also avoids shifting
    // by the full width of U.
    if (shift >= SrcMant + 2) return 0;
  }
  const U q = kept >> shift;
  const U rem = kept & ((U(1) << shift) - 1);
  const U half = U(1) << (shift - 1);
  const bool up = rem > half || (rem == half && (q & 1) != 0);
  return static_cast<uint32_t>(q) + (up ? 1u : 0u);
}

// Shared tail of the FP8 encoders once NaN has been dealt with. `is_inf` inputs and
// results beyond the largest finite code take the overflow path.
template <uint32_t kMaxCode, uint32_t kOverflowCode>
OCTET_HD uint8_t fp8_finish(uint32_t sign, uint32_t code, bool is_inf, bool saturate) {
  if (is_inf || code > kMaxCode) code = saturate ? kMaxCode : kOverflowCode;
  return static_cast<uint8_t>(sign | code);
}

}  // namespace detail

// ---------------------------------------------------------------- bfloat16

OCTET_HD uint16_t float_to_bf16_bits(float x) {
  const uint32_t u = detail::float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;
  // bf16 is the top half of a float, so RNE is "add just under half an ulp, plus one if
  // the kept part is odd, then truncate". A carry ripples into the exponent naturally;
  // FLT_MAX rounds to inf and infinities stay put. Cannot wrap: max input is 0xFF800000.
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

OCTET_HD uint16_t double_to_bf16_bits(double x) {
  const uint64_t u = detail::double_bits(x);
  const uint64_t mag = u & 0x7FFFFFFFFFFFFFFFull;
  const uint32_t sign = static_cast<uint32_t>(u >> 48) & 0x8000u;
  if (mag > 0x7FF0000000000000ull) return 0x7FFFu;
  if (mag == 0x7FF0000000000000ull) return static_cast<uint16_t>(sign | 0x7F80u);
  uint32_t code = detail::round_magnitude<uint64_t, 52, 1023, 7, 127>(mag);
  if (code > 0x7F80u) code = 0x7F80u;
  return static_cast<uint16_t>(sign | code);
}

OCTET_HD float bf16_bits_to_float(uint16_t b) {
  return detail::bits_float(static_cast<uint32_t>(b) << 16);
}

// ---------------------------------------------------------------- IEEE binary16

OCTET_HD uint16_t float_to_f16_bits(float x) {
  const uint32_t u = detail::float_bits(x);
  const uint32_t mag = u & 0x7FFFFFFFu;
  const uint32_t sign = (u >> 16) & 0x8000u;
  if (mag > 0x7F800000u) return 0x7FFFu;
  if (mag == 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u);
  uint32_t code = detail::round_magnitude<uint32_t, 23, 127, 10, 15>(mag);
  if (code > 0x7C00u) code = 0x7C00u;
  return static_cast<uint16_t>(sign | code);
}

OCTET_HD uint16_t double_to_f16_bits(double x) {
  const uint64_t u = detail::double_bits(x);
  const uint64_t mag = u & 0x7FFFFFFFFFFFFFFFull;
  const uint32_t sign = static_cast<uint32_t>(u >> 48) & 0x8000u;
  if (mag > 0x7FF0000000000000ull) return 0x7FFFu;
  if (mag == 0x7FF0000000000000ull) return static_cast<uint16_t>(sign | 0x7C00u);
  uint32_t code = detail::round_magnitude<uint64_t, 52, 1023, 10, 15>(mag);
  if (code > 0x7C00u) code = 0x7C00u;
  return static_cast<uint16_t>(sign | code);
}

OCTET_HD float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t frac = h & 0x3FFu;
  if (exp == 0x1Fu) return detail::bits_float(frac != 0 ? 0x7FFFFFFFu : (sign | 0x7F800000u));
  if (exp == 0) {
    // Subnormal: frac * 2^-24. Both factors and the product are exact floats (the product
    // is a float normal), so this is exact and unaffected by flush-to-zero modes.
    const float mag = static_cast<float>(frac) * 0x1p-24f;
    return detail::bits_float(sign | detail::float_bits(mag));
  }
  return detail::bits_float(sign | ((exp + (127 - 15)) << 23) | (frac << 13));
}

// ---------------------------------------------------------------- OCP FP8

OCTET_HD uint8_t float_to_e4m3(float x, bool saturate) {
  const uint32_t u = detail::float_bits(x);
  const uint32_t mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return 0x7Fu;  // float NaN: canonical, sign dropped (CUDA does so)
  const uint32_t sign = (u >> 24) & 0x80u;
  const bool inf = mag == 0x7F800000u;
  const uint32_t code = inf ? 0 : detail::round_magnitude<uint32_t, 23, 127, 3, 7>(mag);
  return detail::fp8_finish<0x7Eu, 0x7Fu>(sign, code, inf, saturate);
}

OCTET_HD uint8_t float_to_e5m2(float x, bool saturate) {
  const uint32_t u = detail::float_bits(x);
  const uint32_t mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return 0x7Fu;
  const uint32_t sign = (u >> 24) & 0x80u;
  const bool inf = mag == 0x7F800000u;
  const uint32_t code = inf ? 0 : detail::round_magnitude<uint32_t, 23, 127, 2, 15>(mag);
  return detail::fp8_finish<0x7Bu, 0x7Cu>(sign, code, inf, saturate);
}

OCTET_HD uint8_t double_to_e4m3(double x, bool saturate) {
  const uint64_t u = detail::double_bits(x);
  const uint64_t mag = u & 0x7FFFFFFFFFFFFFFFull;
  const uint32_t sign = static_cast<uint32_t>(u >> 56) & 0x80u;
  if (mag > 0x7FF0000000000000ull) return static_cast<uint8_t>(sign | 0x7Fu);  // keeps sign
  const bool inf = mag == 0x7FF0000000000000ull;
  const uint32_t code = inf ? 0 : detail::round_magnitude<uint64_t, 52, 1023, 3, 7>(mag);
  return detail::fp8_finish<0x7Eu, 0x7Fu>(sign, code, inf, saturate);
}

OCTET_HD uint8_t double_to_e5m2(double x, bool saturate) {
  const uint64_t u = detail::double_bits(x);
  const uint64_t mag = u & 0x7FFFFFFFFFFFFFFFull;
  const uint32_t sign = static_cast<uint32_t>(u >> 56) & 0x80u;
  if (mag > 0x7FF0000000000000ull) {
    // CUDA keeps the sign and the top two payload bits, forcing the quiet bit's slot on;
    // the result is a NaN whatever the payload.
    return static_cast<uint8_t>(sign | 0x7Eu | static_cast<uint32_t>((u >> 50) & 3u));
  }
  const bool inf = mag == 0x7FF0000000000000ull;
  const uint32_t code = inf ? 0 : detail::round_magnitude<uint64_t, 52, 1023, 2, 15>(mag);
  return detail::fp8_finish<0x7Bu, 0x7Cu>(sign, code, inf, saturate);
}

OCTET_HD float e4m3_to_float(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xFu;
  const uint32_t frac = v & 0x7u;
  if ((v & 0x7Fu) == 0x7Fu) return detail::bits_float(0x7FFFFFFFu);  // the only NaN
  if (exp == 0) {
    // Subnormal: frac * 2^-9, exact (see f16_bits_to_float).
    const float mag = static_cast<float>(frac) * 0x1p-9f;
    return detail::bits_float(sign | detail::float_bits(mag));
  }
  return detail::bits_float(sign | ((exp + (127 - 7)) << 23) | (frac << 20));
}

OCTET_HD float e5m2_to_float(uint8_t v) {
  // E5M2 is the top byte of an IEEE half with the same bias, so widen and reuse.
  return f16_bits_to_float(static_cast<uint16_t>(static_cast<uint16_t>(v) << 8));
}

// ---------------------------------------------------------------- value types
//
// Plain storage types: trivially copyable, standard layout, no padding, so arrays of
// them can be memcpy'd to and from device buffers. Construction from float is explicit
// (it rounds); widening to float is implicit (it is exact). FP8 construction saturates.

struct bfloat16 {
  uint16_t bits;
  bfloat16() = default;
  OCTET_HD explicit bfloat16(float f) : bits(float_to_bf16_bits(f)) {}
  OCTET_HD static constexpr bfloat16 from_bits(uint16_t b) {
    bfloat16 r{};
    r.bits = b;
    return r;
  }
  OCTET_HD operator float() const { return bf16_bits_to_float(bits); }
};

struct float16 {
  uint16_t bits;
  float16() = default;
  OCTET_HD explicit float16(float f) : bits(float_to_f16_bits(f)) {}
  OCTET_HD static constexpr float16 from_bits(uint16_t b) {
    float16 r{};
    r.bits = b;
    return r;
  }
  OCTET_HD operator float() const { return f16_bits_to_float(bits); }
};

struct float8_e4m3 {
  uint8_t bits;
  float8_e4m3() = default;
  OCTET_HD explicit float8_e4m3(float f) : bits(float_to_e4m3(f, /*saturate=*/true)) {}
  OCTET_HD static constexpr float8_e4m3 from_bits(uint8_t b) {
    float8_e4m3 r{};
    r.bits = b;
    return r;
  }
  OCTET_HD operator float() const { return e4m3_to_float(bits); }
};

struct float8_e5m2 {
  uint8_t bits;
  float8_e5m2() = default;
  OCTET_HD explicit float8_e5m2(float f) : bits(float_to_e5m2(f, /*saturate=*/true)) {}
  OCTET_HD static constexpr float8_e5m2 from_bits(uint8_t b) {
    float8_e5m2 r{};
    r.bits = b;
    return r;
  }
  OCTET_HD operator float() const { return e5m2_to_float(bits); }
};

}  // namespace octet
