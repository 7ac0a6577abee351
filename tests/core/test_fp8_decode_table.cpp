// The host conversion FP8 -> f32 (convert_elements, behind Tensor::to) decodes through a 256-entry
// table per format; every code, NaN bit patterns included, must give e4m3_to_float / e5m2_to_float's
// bits, on the one-thread path and on the parallel one for long buffers.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/float_formats.h"

namespace {

using namespace octet;

void expect_table_matches(DType fp8_dtype, float (*decode)(uint8_t)) {
  // 2^17 elements (every code 512 times) take the parallel loop; the first 256 alone the serial one.
  std::vector<uint8_t> codes(1 << 17);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i);
  for (const int64_t n : {int64_t{256}, static_cast<int64_t>(codes.size())}) {
    std::vector<float> decoded(static_cast<size_t>(n));
    convert_elements(codes.data(), fp8_dtype, decoded.data(), DType::f32, n);
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t code = codes[static_cast<size_t>(i)];
      ASSERT_EQ(detail::float_bits(decoded[static_cast<size_t>(i)]), detail::float_bits(decode(code)))
          << dtype_name(fp8_dtype) << " code 0x" << std::hex << int(code) << " at element " << std::dec << i
          << " of " << n;
    }
  }
}

TEST(Fp8DecodeTable, E4M3EveryCodeMatchesTheDecoderBitForBit) {
  expect_table_matches(DType::e4m3, [](uint8_t c) { return e4m3_to_float(c); });
}

TEST(Fp8DecodeTable, E5M2EveryCodeMatchesTheDecoderBitForBit) {
  expect_table_matches(DType::e5m2, [](uint8_t c) { return e5m2_to_float(c); });
}

}  // namespace
