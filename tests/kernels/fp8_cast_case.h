#pragma once
// One shape of the FP8 cast tests, shared by the CPU suite (tests/kernels/test_fp8_kernels.cpp) and
// the GPU suite (tests/cuda/test_cuda_fp8.cpp).
#include <cstdint>
#include <ostream>

#include "core/dtype.h"
#include "core/shape.h"

namespace octet::testing {

struct CastCase {
  Shape shape;
  DType input;
  DType format;
  int64_t pad_rows_to;
};

// How gtest names a case in its output.
inline void PrintTo(const CastCase& c, std::ostream* os) {
  *os << c.shape << " " << dtype_name(c.input) << " -> " << dtype_name(c.format) << ", pad " << c.pad_rows_to;
}

}  // namespace octet::testing
