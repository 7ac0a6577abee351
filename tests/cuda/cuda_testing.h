#pragma once
// Helpers shared by the GPU tests: skipping without a device, the tolerances, and comparisons of a
// GPU result with the CPU's. Relative errors are norm-wise, ||got - want||_2 / ||want||_2, read as
// f64 on the host (the absolute norm ||got - want||_2 where want is all zeros).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "tests/testing.h"

// First statement of every GPU test: CI machines have no GPU, and there the suite must skip cleanly.
#define SKIP_WITHOUT_GPU()             \
  if (!::octet::cuda::is_available()) \
  GTEST_SKIP() << "no CUDA device on this machine; this test runs on the GPU machine"

namespace octet::testing {

inline const Device kGpu = Device::cuda(0);

// The suite's bounds on the norm-wise relative error: 1e-5 for f32, 1e-2 for bf16 (and anything else).
// Not for FP8 GEMMs: Hopper's FP8 tensor cores do not accumulate in f32, whatever the output dtype;
// their element-wise bound is in tests/cuda/fp8_bound.h.
inline double tolerance(DType d) { return d == DType::f32 ? 1e-5 : 1e-2; }

namespace detail {

// Both tensors must be defined and of one shape; `dtypes_must_match` adds their dtype. With
// `nans_must_match`, NaNs must stand at the same places and are left out of both norms; without it a
// NaN anywhere makes the error NaN, which fails every bound.
inline double relative_error(const Tensor& got, const Tensor& want, bool dtypes_must_match, bool nans_must_match) {
  EXPECT_TRUE(got.defined() && want.defined());
  if (!got.defined() || !want.defined()) return INFINITY;
  EXPECT_EQ(got.shape(), want.shape()) << got.describe() << " vs " << want.describe();
  if (dtypes_must_match) {
    EXPECT_EQ(got.dtype(), want.dtype()) << got.describe() << " vs " << want.describe();
  }
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < w.size() && i < g.size(); ++i) {
    if (nans_must_match && (std::isnan(w[i]) || std::isnan(g[i]))) {
      EXPECT_TRUE(std::isnan(w[i]) && std::isnan(g[i])) << "element " << i << ": " << g[i] << " vs " << w[i];
      continue;
    }
    num += (g[i] - w[i]) * (g[i] - w[i]);
    den += w[i] * w[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace detail

// Same shape and dtype; any NaN fails.
inline double relative_error(const Tensor& got, const Tensor& want) {
  return detail::relative_error(got, want, /*dtypes_must_match=*/true, /*nans_must_match=*/false);
}

// Same shape and dtype; NaNs must stand at the same places (for ops whose CPU result may hold NaNs).
inline double relative_error_matching_nans(const Tensor& got, const Tensor& want) {
  return detail::relative_error(got, want, /*dtypes_must_match=*/true, /*nans_must_match=*/true);
}

// Same shape; the reference may be computed in a wider dtype than the result. Any NaN fails.
inline double relative_error_to_reference(const Tensor& got, const Tensor& reference) {
  return detail::relative_error(got, reference, /*dtypes_must_match=*/false, /*nans_must_match=*/false);
}

// Same shape, dtype and bytes, on any devices; a failure names the first differing byte.
inline ::testing::AssertionResult same_bits(const Tensor& got_any_device, const Tensor& want_any_device) {
  const Tensor got = got_any_device.to(Device::cpu()), want = want_any_device.to(Device::cpu());
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) {
    return ::testing::AssertionFailure() << got.describe() << " should be " << want.describe();
  }
  const auto* g = static_cast<const unsigned char*>(got.data_ptr());
  const auto* w = static_cast<const unsigned char*>(want.data_ptr());
  for (size_t i = 0; i < got.nbytes(); ++i) {
    if (g[i] != w[i]) {
      return ::testing::AssertionFailure() << "bits differ at byte " << i << " (element " << i / got.element_size()
                                           << ") of " << got.describe() << " and " << want.describe();
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace octet::testing
