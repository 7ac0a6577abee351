#pragma once
// Inputs and expected results for the collective tests (test_collectives.cpp, test_local_group.cpp).
//
// Every rank can rebuild every rank's input from (salt, rank), so each rank computes the expected
// result of a collective by itself, from first principles, and checks its own output against it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "distributed/process_group.h"
#include "tests/testing.h"

namespace octet::testing {

inline const std::vector<DType> kFloatingDtypes = {DType::f32, DType::f64, DType::bf16, DType::f16};
inline const std::vector<DType> kCollectiveDtypes = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i64};
// The device the collective tests put their tensors on: the CPU, or the device OCTET_TEST_DEVICE
// names ("cuda:0"). tools/gpu_check.sh runs the mpi suites at 2 ranks sharing one GPU that way, so
// the MPI backend's staging of CUDA tensors through the host meets every collective, reduction,
// dtype and odd size below. The expected values are always computed on the host.
inline Device collective_device() {
  static const Device device = [] {
    const char* name = std::getenv("OCTET_TEST_DEVICE");
    return name != nullptr && *name != '\0' ? Device::parse(name) : Device::cpu();
  }();
  return device;
}

// Odd sizes: a single element, less than a vector register, and sizes no chunking divides evenly.
inline const std::vector<int64_t> kOddSizes = {1, 7, 1001, 4099};

// A shape with `n` elements; 1001 = 7·11·13 becomes three-dimensional, so shapes other than 1-D
// go through the collectives too.
inline Shape odd_shape(int64_t n) { return n == 1001 ? Shape{7, 11, 13} : Shape{n}; }

// Rank `rank`'s input in the test numbered `salt`. Floating values are ±[0.5, 2)·2^k, k in [-3, 3]:
// never zero, mixed signs and magnitudes, exactly representable in f16 and bf16 after rounding.
// i64 values lie between 2^55 and 2^56, so a reduction that went through double would lose their
// low bits (four of them still sum below 2^63).
inline Tensor rank_input(int rank, const Shape& shape, DType dtype, uint64_t salt) {
  std::mt19937_64 rng(salt * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank) + 1);
  const int64_t n = shape.numel();
  if (dtype == DType::i64) {
    std::vector<int64_t> values(n);
    for (int64_t& v : values) {
      const int64_t magnitude = (int64_t{1} << 55) + static_cast<int64_t>(rng() >> 9);  // rng() >> 9 < 2^55
      v = (rng() & 1) ? magnitude : -magnitude;
    }
    return from_vector<int64_t>(values, shape, DType::i64).to(collective_device());
  }
  std::uniform_real_distribution<double> mantissa(0.5, 2.0);
  std::uniform_int_distribution<int> exponent(-3, 3);
  std::vector<double> values(n);
  for (double& v : values) {
    v = std::ldexp(mantissa(rng), exponent(rng));
    if (rng() & 1) v = -v;
  }
  return from_vector<double>(values, shape, dtype).to(collective_device());
}

// Every rank's input in test `salt`, indexed by rank.
inline std::vector<Tensor> all_rank_inputs(int world_size, const Shape& shape, DType dtype, uint64_t salt) {
  std::vector<Tensor> inputs;
  for (int r = 0; r < world_size; ++r) inputs.push_back(rank_input(r, shape, dtype, salt));
  return inputs;
}

// The relative rounding error of one operation in `dtype` (half an ulp at 1).
inline double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::f64: return std::ldexp(1.0, -53);
    case DType::f32: return std::ldexp(1.0, -24);
    case DType::bf16: return std::ldexp(1.0, -8);
    case DType::f16: return std::ldexp(1.0, -11);
    default: return 0.0;  // integers reduce exactly
  }
}

// Element i of `got` must be `op` over element offset + i of every rank's input.
//   Max and integer sums: exactly.
//   Floating sums: however the backend pairs the N terms, each of its N − 1 additions rounds once in
//   the dtype, with every partial sum bounded by Σ|x|, so |error| ≤ (N − 1)·u·Σ|x|; Avg adds one
//   division (u·|S|/N ≤ u·Σ|x|/N). The bound used, (N + 1)·u·Σ|x| (/N for Avg), covers both with a
//   margin, and is still far below the O(1) error of a wrong or missing term.
inline ::testing::AssertionResult reduced_correctly(const Tensor& got, const std::vector<Tensor>& inputs, int64_t offset,
                                                    distributed::ReduceOp op) {
  const int64_t n_ranks = static_cast<int64_t>(inputs.size());
  const DType dtype = got.dtype();
  const char* op_name = distributed::reduce_op_name(op);
  if (dtype == DType::i64) {
    const std::vector<int64_t> out = got.to_vector<int64_t>();
    std::vector<std::vector<int64_t>> in;
    for (const Tensor& t : inputs) in.push_back(t.to_vector<int64_t>());
    for (int64_t i = 0; i < got.numel(); ++i) {
      int64_t expected = op == distributed::ReduceOp::Max ? in[0][offset + i] : 0;
      for (const auto& x : in) {
        expected = op == distributed::ReduceOp::Max ? std::max(expected, x[offset + i]) : expected + x[offset + i];
      }
      if (op == distributed::ReduceOp::Avg) expected /= n_ranks;
      if (out[i] != expected) {
        return ::testing::AssertionFailure() << op_name << " over " << n_ranks << " ranks, element " << i << " of "
                                             << got.describe() << ": got " << out[i] << ", expected " << expected;
      }
    }
    return ::testing::AssertionSuccess();
  }
  const std::vector<double> out = got.to_vector<double>();
  std::vector<std::vector<double>> in;
  for (const Tensor& t : inputs) in.push_back(t.to_vector<double>());
  const double u = unit_roundoff(dtype);
  for (int64_t i = 0; i < got.numel(); ++i) {
    long double sum = 0, abs_sum = 0;
    double max = in[0][offset + i];
    for (const auto& x : in) {
      sum += x[offset + i];
      abs_sum += std::abs(x[offset + i]);
      max = std::max(max, x[offset + i]);
    }
    double expected = static_cast<double>(sum), tolerance = static_cast<double>((n_ranks + 1) * u * abs_sum);
    if (op == distributed::ReduceOp::Avg) {
      expected = static_cast<double>(sum / n_ranks);
      tolerance /= static_cast<double>(n_ranks);
    } else if (op == distributed::ReduceOp::Max) {
      expected = max;
      tolerance = 0;
    }
    if (!(std::abs(out[i] - expected) <= tolerance)) {
      return ::testing::AssertionFailure() << op_name << " over " << n_ranks << " ranks, element " << i << " of "
                                           << got.describe() << ": got " << out[i] << ", expected " << expected
                                           << " within " << tolerance;
    }
  }
  return ::testing::AssertionSuccess();
}

// `got` holds exactly the values of `expected` (same dtype and element count; shapes may differ).
inline ::testing::AssertionResult equals_exactly(const Tensor& got, const Tensor& expected) {
  if (got.dtype() != expected.dtype() || got.numel() != expected.numel()) {
    return ::testing::AssertionFailure() << "got " << got.describe() << ", expected the values of " << expected.describe();
  }
  auto first_difference = [&](const auto& a, const auto& b) -> ::testing::AssertionResult {
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] != b[i]) {
        return ::testing::AssertionFailure() << "element " << i << " of " << got.describe() << ": got " << a[i]
                                             << ", expected " << b[i];
      }
    }
    return ::testing::AssertionSuccess();
  };
  // i64 compares as integers (double would drop low bits); every floating dtype converts to double exactly.
  if (got.dtype() == DType::i64) return first_difference(got.to_vector<int64_t>(), expected.to_vector<int64_t>());
  return first_difference(got.to_vector<double>(), expected.to_vector<double>());
}

// An output buffer that a collective must overwrite: every element -77, which no input ever holds.
inline Tensor sentinel(const Shape& shape, DType dtype) { return full(shape, -77.0, dtype).to(collective_device()); }

// "f32 x 1001 sum", for SCOPED_TRACE.
inline std::string case_name(DType dtype, int64_t n, const char* what = "") {
  std::ostringstream os;
  os << dtype_name(dtype) << " x " << n << " " << what;
  return os.str();
}

}  // namespace octet::testing
