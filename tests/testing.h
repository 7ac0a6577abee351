#pragma once
// Shared test helpers: seeded random inputs and comparison against float64 references.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"

namespace octet::testing {

// Standard-normal values from a fixed seed, so a failure reproduces.
inline Tensor random_tensor(const Shape& shape, DType dtype = DType::f32, uint64_t seed = 1234, double scale = 1.0) {
  Generator gen(seed);
  Tensor t = randn(shape, gen, DType::f64);
  if (scale != 1.0) {
    double* p = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] *= scale;
  }
  return t.to(dtype);
}

// Uniform in [lo, hi).
inline Tensor uniform_tensor(const Shape& shape, double lo, double hi, DType dtype = DType::f32, uint64_t seed = 99) {
  Generator gen(seed);
  Tensor t = rand(shape, gen, DType::f64);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = lo + (hi - lo) * p[i];
  return t.to(dtype);
}

// Asserts |actual - expected| <= atol + rtol·|expected| elementwise, reporting the worst element.
inline ::testing::AssertionResult all_close(const Tensor& actual, const std::vector<double>& expected, double atol,
                                            double rtol) {
  if (actual.numel() != static_cast<int64_t>(expected.size())) {
    return ::testing::AssertionFailure() << "size mismatch: " << actual.describe() << " vs " << expected.size()
                                         << " expected values";
  }
  const std::vector<double> got = actual.detach().to_vector<double>();
  int64_t worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = atol + rtol * std::abs(expected[i]);
    const double err = std::abs(got[i] - expected[i]);
    const bool both_nan = std::isnan(got[i]) && std::isnan(expected[i]);
    if (!both_nan && !(err <= tol) && (worst < 0 || err - tol > worst_excess)) {
      worst = static_cast<int64_t>(i);
      worst_excess = err - tol;
    }
  }
  if (worst < 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << worst << " of " << actual.describe() << ": got "
                                       << got[worst] << ", expected " << expected[worst] << " (atol " << atol
                                       << ", rtol " << rtol << ")";
}

inline ::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double atol, double rtol) {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure() << "shape mismatch: " << actual.describe() << " vs " << expected.describe();
  }
  return all_close(actual, expected.detach().to_vector<double>(), atol, rtol);
}

// Passes when f throws an octet::Error whose message contains every part (the op, the shapes, the fix).
template <class F>
::testing::AssertionResult throws_with(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) {
      if (msg.find(p) == std::string::npos) return ::testing::AssertionFailure() << "message lacks '" << p << "': " << msg;
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no octet::Error thrown";
}

// Same shape, dtype and bytes, on any devices; a failure names the first differing byte.
inline ::testing::AssertionResult same_bits(const Tensor& got_any_device, const Tensor& want_any_device) {
  if (!got_any_device.defined() || !want_any_device.defined()) {
    return ::testing::AssertionFailure() << "an undefined tensor: " << got_any_device.describe() << " and "
                                         << want_any_device.describe();
  }
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

// Tolerances for comparing a kernel computed from dtype-d inputs against a float64 reference on
// the same (already rounded) inputs. The CPU computes bf16 and f16 in f32 and rounds each result
// once: that rounding is within u·|result| (u, the unit roundoff: 2^-8 for bf16's 8 significant
// bits, 2^-11 for f16's 11), and the f32 arithmetic before it adds a few f32 ulps of the terms. rtol
// is u plus 2^-20 (the f32 error relative to the result, which can tip the rounding the other way),
// and atol covers the f32 error where terms cancel to a small result (sums, LayerNorm, attention;
// their terms here are O(1), so 2^-24 times a few hundred terms). What this catches is a wrong
// formula, index or term; a kernel that rounds twice or truncates errs by up to one ulp and mostly
// passes it: the bit-for-bit tests of each low-precision path against its f32 kernel catch those. (Before, bf16 was held to 1e-2 and f16 to
// 2e-3, absolute and relative: 2.5 and 4 units of u, and any error at all below about 0.1.)
struct Tolerance {
  double atol, rtol;
};
inline Tolerance tolerance_for(DType d) {
  switch (d) {
    case DType::f64: return {1e-12, 1e-10};
    case DType::f32: return {1e-5, 1e-5};
    case DType::bf16: return {1e-4, 0x1p-8 + 0x1p-20};
    case DType::f16: return {1e-5, 0x1p-11 + 0x1p-20};
    default: return {0.1, 0.1};  // FP8 outputs carry 2-3 significant bits (unused: the FP8 tests have fp8_bound.h)
  }
}

// ||got - want||₂ / ||want||₂ over f64 copies of both, the error measure of every comparison with a
// reference in the tests.
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

// How many times `part` occurs in `text` (overlaps counted).
inline size_t occurrences(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// A file's bytes, and a file made anew with the given bytes (removed first: ext4 flushes a file that
// is truncated and rewritten, which is slow), for tests that read, corrupt or forge files.
inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
inline void spit(const std::filesystem::path& path, const std::string& bytes) {
  std::filesystem::remove(path);
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace octet::testing
