#pragma once
// Helpers shared by the GPU tests of the kernels that write FP8 casts (test_cuda_fp8.cpp,
// test_cuda_layernorm_fp8.cpp, test_cuda_gelu_fp8.cpp).
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "tests/cuda/cuda_testing.h"

namespace octet::testing {

// The bytes of t, on the host.
inline std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  const auto* p = static_cast<const uint8_t*>(h.data_ptr());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

// Which copies a cast writes, and the three combinations the tests run.
struct Fp8Copies {
  bool rowwise, transposed;
};
inline constexpr Fp8Copies kFp8Copies[] = {{true, true}, {true, false}, {false, true}};

}  // namespace octet::testing
