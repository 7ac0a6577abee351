// The CPU cast's branch-free FP8 encoder (kernels/cpu/fp8_cpu.h) against core/float_formats.h's
// saturating encoders, bit for bit. It was checked once over all 2^32 floats; here every upper half
// of a float is paired with the lower halves that decide rounding (a tie has all-zero low bits, its
// neighbours differ in the last bit), which covers every exponent, zero, subnormals, ties to even at
// both FP8 formats' rounding bits, saturation, inf and every NaN class.
#include <gtest/gtest.h>

#include <cstdint>

#include "core/float_formats.h"
#include "kernels/cpu/fp8_cpu.h"

namespace {

using namespace octet;

template <bool kE5M2>
int64_t count_mismatches() {
  int64_t mismatches = 0;
  for (uint32_t high = 0; high < 0x10000u; ++high) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      const float x = detail::bits_float(high << 16 | low);
      const uint8_t expected = kE5M2 ? float_to_e5m2(x, /*saturate=*/true) : float_to_e4m3(x, /*saturate=*/true);
      const uint8_t got = kernels::cpu::float_to_fp8_saturating<kE5M2>(x);
      if (got != expected) {
        if (mismatches < 5) {
          ADD_FAILURE() << (kE5M2 ? "e5m2" : "e4m3") << ": float bits 0x" << std::hex << (high << 16 | low)
                        << " encode to 0x" << int(got) << ", the reference gives 0x" << int(expected);
        }
        ++mismatches;
      }
    }
  }
  return mismatches;
}

TEST(Fp8CpuEncode, BranchFreeE4M3MatchesTheReferenceBitForBit) { EXPECT_EQ(count_mismatches<false>(), 0); }

TEST(Fp8CpuEncode, BranchFreeE5M2MatchesTheReferenceBitForBit) { EXPECT_EQ(count_mismatches<true>(), 0); }

}  // namespace
