#pragma once
// IDX files, the format of MNIST and Fashion-MNIST: a big-endian header (a magic number whose low
// byte is the number of dims, then each dim as a u32) followed by exactly prod(dims) bytes of u8
// data. Files may be gzip'd or not; zlib reads both the same way.
#include <cstdint>
#include <string>
#include <vector>

namespace octet::data {

inline constexpr uint32_t kIdxImagesMagic = 2051;  // 0x00000803: u8 data, three dims
inline constexpr uint32_t kIdxLabelsMagic = 2049;  // 0x00000801: u8 data, one dim

struct IdxImages {
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols, image after image, row-major
};

// Read and validate a whole file: magic number, plausible dims, and exactly the bytes the header
// promises (a truncated or overlong file is an error). Errors name the file, the problem and the fix.
IdxImages read_idx_images(const std::string& path);
std::vector<uint8_t> read_idx_labels(const std::string& path);

}  // namespace octet::data
