// The FP8 GEMM's CPU emulation (kernels/fp8_gemm.h) against float64:
//   - on the decoded FP8 values, where the only error is f32 accumulation and the output's rounding;
//   - on the original f32 values before quantisation, where the error is the formats' own, within a
//     bound derived from their unit roundoff (and above a floor, so the test proves quantisation ran);
//   - the bias, accumulate and k = 0 cases, and the refusals of the interface's rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/fp8_gemm.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::all_close;
using testing::random_tensor;
using testing::throws_with;

double max_of(DType fp8) { return fp8 == DType::e4m3 ? 448.0 : 57344.0; }

// Unit roundoff 2^-p of a format with p significand bits (the implicit one included): E4M3 has 3
// stored mantissa bits, so u = 2^-4; E5M2 has 2, so u = 2^-3.
double unit_roundoff(DType fp8) { return fp8 == DType::e4m3 ? 0.0625 : 0.125; }

// Normal values with standard deviation max/64: inside the range by far (no saturation) and, with
// more than a few thousand of them, essentially none small enough to round to zero.
Tensor random_fp8(const Shape& shape, DType fp8, uint64_t seed) {
  return random_tensor(shape, DType::f32, seed, max_of(fp8) / 64).to(fp8);
}

Tensor scalar_f32(float value) { return from_vector<float>({value}, {1}); }

// scale_a·scale_b·Σ_p a[i, p]·b[j, p] + bias[j] + old[i, j] in float64 from the tensors' exact values
// (FP8 values decode exactly to double).
std::vector<double> reference(const Tensor& a, double scale_a, const Tensor& b, double scale_b, const Tensor& bias,
                              const Tensor& old) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  const std::vector<double> biasv = bias.defined() ? bias.to_vector<double>() : std::vector<double>(n, 0.0);
  const std::vector<double> oldv = old.defined() ? old.to_vector<double>() : std::vector<double>(m * n, 0.0);
  std::vector<double> out(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) sum += av[i * k + p] * bv[j * k + p];
      out[i * n + j] = scale_a * scale_b * sum + biasv[j] + oldv[i * n + j];
    }
  }
  return out;
}

// ||got - want||_2 / ||want||_2.
double relative_error(const Tensor& got, const std::vector<double>& want) {
  const std::vector<double> g = got.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (g[i] - want[i]) * (g[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

double rms(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s / static_cast<double>(v.size()));
}

// The emulation against the float64 reference on the same FP8 values.
// f32 out: the error is the f32 summation's, which for k random-signed terms grows like
// sqrt(k)·2^-24 relative to the result; we allow 4·sqrt(k)·2^-24 + 2^-20 norm-wise (below 2e-6 at
// k = 768). Measured: ~4e-8, since sums of FP8 products, each with at most 8 significant bits, are
// nearly exact in f32.
// bf16 out: one rounding of that f32 value, at most 2^-9 relative; each element must be within 2^-8
// relative, plus an absolute 1e-5·rms(result) for the elements that cancel to nearly zero, where the
// f32 summation error is larger than the element itself.
::testing::AssertionResult matches_reference(const Tensor& out, const std::vector<double>& want, int64_t k) {
  if (out.dtype() == DType::f32) {
    const double error = relative_error(out, want);
    const double bound = 4 * std::sqrt(static_cast<double>(k)) * std::ldexp(1.0, -24) + std::ldexp(1.0, -20);
    if (error <= bound) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "norm-wise relative error " << error << " above " << bound;
  }
  return all_close(out, want, 1e-5 * rms(want), std::ldexp(1.0, -8));
}

struct DTypePair {
  DType a, b;
};
const DTypePair kAllowedPairs[] = {{DType::e4m3, DType::e4m3}, {DType::e4m3, DType::e5m2}, {DType::e5m2, DType::e4m3}};

std::string describe_case(DTypePair pair, DType out, int64_t m, int64_t k, int64_t n) {
  return std::string(dtype_name(pair.a)) + "·" + dtype_name(pair.b) + " -> " + dtype_name(out) + " m=" +
         std::to_string(m) + " k=" + std::to_string(k) + " n=" + std::to_string(n);
}

TEST(Fp8Gemm, MatchesFloat64OnTheDecodedValues) {
  const float scale_inv_a = 0.37f, scale_inv_b = 3.1f;
  const int64_t k_n[][2] = {{16, 16}, {48, 48}, {768, 112}, {96, 768}};
  uint64_t seed = 10;
  for (DTypePair pair : kAllowedPairs) {
    for (DType out_dtype : {DType::f32, DType::bf16}) {
      for (int64_t m : {1, 37, 197}) {
        for (const auto& kn : k_n) {
          const int64_t k = kn[0], n = kn[1];
          const Tensor a = random_fp8({m, k}, pair.a, seed++), b = random_fp8({n, k}, pair.b, seed++);
          const Tensor out = empty({m, n}, out_dtype);
          kernels::fp8_gemm(a, scalar_f32(scale_inv_a), b, scalar_f32(scale_inv_b), out);
          EXPECT_TRUE(matches_reference(out, reference(a, scale_inv_a, b, scale_inv_b, Tensor(), Tensor()), k))
              << describe_case(pair, out_dtype, m, k, n);
        }
      }
    }
  }
}

TEST(Fp8Gemm, AddsTheBiasAndAccumulatesIntoOut) {
  const float scale_inv_a = 0.37f, scale_inv_b = 3.1f;
  const int64_t m = 37, k = 48, n = 32;
  uint64_t seed = 200;
  for (DTypePair pair : kAllowedPairs) {
    for (DType out_dtype : {DType::f32, DType::bf16}) {
      const Tensor a = random_fp8({m, k}, pair.a, seed++), b = random_fp8({n, k}, pair.b, seed++);
      // The bias and old out on the product's scale, rms(a)·rms(b)·sqrt(k)·scale_inv_a·scale_inv_b, so
      // that dropping either would fail the comparison.
      const double product_rms =
          max_of(pair.a) / 64 * max_of(pair.b) / 64 * std::sqrt(double(k)) * scale_inv_a * scale_inv_b;
      const Tensor bias = random_tensor({n}, out_dtype, seed++, product_rms);
      const Tensor old = random_tensor({m, n}, out_dtype, seed++, product_rms);
      for (bool with_bias : {false, true}) {
        for (bool accumulate : {false, true}) {
          const Tensor out = old.clone();
          const Tensor b_or_none = with_bias ? bias : Tensor();
          kernels::fp8_gemm(a, scalar_f32(scale_inv_a), b, scalar_f32(scale_inv_b), out, b_or_none, accumulate);
          const auto want = reference(a, scale_inv_a, b, scale_inv_b, b_or_none, accumulate ? old : Tensor());
          EXPECT_TRUE(matches_reference(out, want, k))
              << describe_case(pair, out_dtype, m, k, n) << " bias=" << with_bias << " accumulate=" << accumulate;
        }
      }
    }
  }
}

// An addend is added as accumulate adds the old out, before the one rounding: bit for bit the same
// out, with the addend left as it was; and it is refused with accumulate, or in another shape or dtype.
TEST(Fp8Gemm, AnAddendIsAddedAsAccumulateAddsTheOldOut) {
  const int64_t m = 37, k = 48, n = 32;
  uint64_t seed = 260;
  for (DType out_dtype : {DType::f32, DType::bf16}) {
    for (bool with_bias : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(out_dtype)) + (with_bias ? " with bias" : ""));
      const Tensor a = random_fp8({m, k}, DType::e4m3, seed++), b = random_fp8({n, k}, DType::e4m3, seed++);
      const Tensor bias = with_bias ? random_tensor({n}, out_dtype, seed++, 50.0) : Tensor();
      const Tensor addend = random_tensor({m, n}, out_dtype, seed++, 50.0), before = addend.clone();
      const Tensor accumulated = addend.clone();
      kernels::fp8_gemm(a, scalar_f32(0.37f), b, scalar_f32(3.1f), accumulated, bias, /*accumulate=*/true);
      const Tensor out = full({m, n}, 7.0, out_dtype);  // overwritten, never read
      kernels::fp8_gemm(a, scalar_f32(0.37f), b, scalar_f32(3.1f), out, bias, false, false, addend);
      EXPECT_TRUE(testing::same_bits(out, accumulated));
      EXPECT_TRUE(testing::same_bits(addend, before));
    }
  }
  const Tensor a = random_fp8({m, k}, DType::e4m3, 1), b = random_fp8({n, k}, DType::e4m3, 2);
  const Tensor out = empty({m, n}, DType::bf16);
  EXPECT_TRUE(testing::throws_with(
      [&] { kernels::fp8_gemm(a, scalar_f32(1), b, scalar_f32(1), out, Tensor(), true, false, out.clone()); },
      {"fp8_gemm", "addend", "accumulate"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { kernels::fp8_gemm(a, scalar_f32(1), b, scalar_f32(1), out, Tensor(), false, false, empty({m, n})); },
      {"fp8_gemm", "addend", "f32[37, 32]", "bf16[37, 32]"}));
}

TEST(Fp8Gemm, FastAccumulateChangesNothingOnTheCpu) {
  const Tensor a = random_fp8({37, 48}, DType::e4m3, 1), b = random_fp8({32, 48}, DType::e4m3, 2);
  const Tensor plain = empty({37, 32}, DType::f32), fast = empty({37, 32}, DType::f32);
  kernels::fp8_gemm(a, scalar_f32(0.5f), b, scalar_f32(2.0f), plain);
  kernels::fp8_gemm(a, scalar_f32(0.5f), b, scalar_f32(2.0f), fast, Tensor(), false, /*fast_accumulate=*/true);
  EXPECT_EQ(plain.to_vector<float>(), fast.to_vector<float>());
}

// k = 0 (a wgrad over no tokens): the sum is empty, so out becomes bias (+ the old out). m = 0 is a no-op.
TEST(Fp8Gemm, EmptyProblemsLeaveBiasPlusTheOldOut) {
  const Tensor a = empty({3, 0}, DType::e4m3), b = empty({16, 0}, DType::e5m2);
  const Tensor bias = random_tensor({16}, DType::f32, 5), old = random_tensor({3, 16}, DType::f32, 6);
  const Tensor out = old.clone();
  kernels::fp8_gemm(a, scalar_f32(0.37f), b, scalar_f32(3.1f), out, bias, /*accumulate=*/true);
  EXPECT_TRUE(all_close(out, reference(a, 1, b, 1, bias, old), 1e-6, 1e-6));  // one f32 addition
  kernels::fp8_gemm(a, scalar_f32(0.37f), b, scalar_f32(3.1f), out, bias, /*accumulate=*/false);
  EXPECT_TRUE(all_close(out, reference(a, 1, b, 1, bias, Tensor()), 0, 0));  // exact

  // m = 0: nothing to write.
  const Tensor no_rows = empty({0, 16}, DType::e4m3), square = random_fp8({16, 16}, DType::e4m3, 7);
  EXPECT_NO_THROW(kernels::fp8_gemm(no_rows, scalar_f32(1), square, scalar_f32(1), empty({0, 16}, DType::bf16)));
}

// The error the FP8 formats themselves bring. x [m, k] and w [n, k] are f32 standard normals; each is
// quantised as a recipe would, q = fp8(x·scale) with scale = fp8_max/amax(x), and the GEMM of the
// quantised operands (scale_inv = 1/scale) is compared with the float64 GEMM of the original x and w.
//
// Bound. Rounding to nearest gives x̂ = x(1 + δ) with |δ| <= u. For values spread over binades, the
// absolute error is uniform over ±ulp/2 with ulp = 2u·2^e, so E[δ²] = (2u)²/12 · E[(2^e/x)²], and for
// a log-uniform significand in [1, 2), E[(2^e/x)²] = (1/ln 2)(1/2 - 1/8) = 0.541: rms(δ) = 0.425·u.
// To first order the output error is Σ_p x_p·w_p·(δx_p + δw_p): a sum of independent zero-mean terms,
// so the norm-wise relative error is sqrt(E[δx²] + E[δw²]) = 0.425·sqrt(u_a² + u_b²): 0.0375 for
// E4M3·E4M3 and 0.059 for E4M3·E5M2. With thousands of outputs each summing hundreds of terms the
// measured value sits within a few percent of that, so we assert it lies in [0.3, 0.55]·sqrt(u_a² +
// u_b²): the upper end says the emulation is as accurate as the formats allow, the lower end that
// the operands really were quantised (an unquantised GEMM would be at ~1e-7).
TEST(Fp8Gemm, QuantisationErrorIsWhatTheFormatsUnitRoundoffPredicts) {
  const int64_t m = 197, k = 768, n = 64;
  uint64_t seed = 300;
  for (DTypePair pair : kAllowedPairs) {
    const Tensor x = random_tensor({m, k}, DType::f32, seed++), w = random_tensor({n, k}, DType::f32, seed++);
    auto quantise = [](const Tensor& t, DType fp8, float* scale_inv) {
      const std::vector<float> v = t.to_vector<float>();
      float amax = 0;
      for (float e : v) amax = std::max(amax, std::abs(e));
      const float scale = static_cast<float>(max_of(fp8)) / amax;
      *scale_inv = 1.0f / scale;
      std::vector<float> scaled(v.size());
      for (size_t i = 0; i < v.size(); ++i) scaled[i] = v[i] * scale;
      return from_vector<float>(scaled, t.shape()).to(fp8);
    };
    float scale_inv_x = 0, scale_inv_w = 0;
    const Tensor qx = quantise(x, pair.a, &scale_inv_x), qw = quantise(w, pair.b, &scale_inv_w);
    const Tensor out = empty({m, n}, DType::f32);
    kernels::fp8_gemm(qx, scalar_f32(scale_inv_x), qw, scalar_f32(scale_inv_w), out);

    const double error = relative_error(out, reference(x, 1, w, 1, Tensor(), Tensor()));
    const double ua = unit_roundoff(pair.a), ub = unit_roundoff(pair.b);
    const double predicted = 0.425 * std::sqrt(ua * ua + ub * ub);
    EXPECT_LT(error, 0.55 * std::sqrt(ua * ua + ub * ub)) << dtype_name(pair.a) << "·" << dtype_name(pair.b)
                                                          << ": predicted " << predicted;
    EXPECT_GT(error, 0.3 * std::sqrt(ua * ua + ub * ub)) << dtype_name(pair.a) << "·" << dtype_name(pair.b)
                                                         << ": predicted " << predicted;
  }
}

TEST(Fp8Gemm, RefusesWhatHopperCannotRun) {
  const Tensor one = scalar_f32(1.0f);
  const Tensor a = random_fp8({5, 32}, DType::e4m3, 1), b = random_fp8({16, 32}, DType::e4m3, 2);
  const Tensor out = empty({5, 16}, DType::bf16);

  const Tensor a5 = random_fp8({5, 32}, DType::e5m2, 3), b5 = random_fp8({16, 32}, DType::e5m2, 4);
  EXPECT_TRUE(throws_with([&] { kernels::fp8_gemm(a5, one, b5, one, out); }, {"fp8_gemm", "both e5m2", "e4m3"}));

  const Tensor a40 = random_fp8({5, 40}, DType::e4m3, 5), b40 = random_fp8({16, 40}, DType::e4m3, 6);
  EXPECT_TRUE(throws_with([&] { kernels::fp8_gemm(a40, one, b40, one, out); },
                          {"fp8_gemm", "k = 40", "multiples of 16", "Hopper", "pad"}));

  const Tensor b24 = random_fp8({24, 32}, DType::e4m3, 7);
  const Tensor out24 = empty({5, 24}, DType::bf16);
  EXPECT_TRUE(throws_with([&] { kernels::fp8_gemm(a, one, b24, one, out24); },
                          {"fp8_gemm", "n = 24", "multiples of 16", "Hopper"}));

  const Tensor out_f16 = empty({5, 16}, DType::f16);
  EXPECT_TRUE(throws_with([&] { kernels::fp8_gemm(a, one, b, one, out_f16); }, {"fp8_gemm", "bf16 or f32", "f16"}));
  const Tensor out_fp8 = empty({5, 16}, DType::e4m3);
  EXPECT_TRUE(throws_with([&] { kernels::fp8_gemm(a, one, b, one, out_fp8); }, {"fp8_gemm", "bf16 or f32"}));

  const Tensor a_bf16 = random_tensor({5, 32}, DType::bf16);
  EXPECT_TRUE(throws_with([&] { kernels::fp8_gemm(a_bf16, one, b, one, out); }, {"fp8_gemm", "FP8", "fp8_cast"}));

  const Tensor b_other_k = random_fp8({16, 48}, DType::e4m3, 8);
  EXPECT_TRUE(throws_with([&] { kernels::fp8_gemm(a, one, b_other_k, one, out); }, {"fp8_gemm", "[n, k]"}));

  const Tensor out_wrong = empty({5, 32}, DType::bf16);
  EXPECT_TRUE(throws_with([&] { kernels::fp8_gemm(a, one, b, one, out_wrong); }, {"fp8_gemm", "[5, 16]"}));

  const Tensor bias_f32 = random_tensor({16}, DType::f32);
  EXPECT_TRUE(throws_with([&] { kernels::fp8_gemm(a, one, b, one, out, bias_f32); },
                          {"fp8_gemm", "bias", "out's dtype bf16"}));
  const Tensor bias_short = random_tensor({8}, DType::bf16);
  EXPECT_TRUE(throws_with([&] { kernels::fp8_gemm(a, one, b, one, out, bias_short); }, {"fp8_gemm", "bias", "[16]"}));

  const Tensor scale_bf16 = from_vector<float>({1.0f}, {1}, DType::bf16);
  const Tensor scale_two = from_vector<float>({1.0f, 2.0f}, {2});
  EXPECT_TRUE(throws_with([&] { kernels::fp8_gemm(a, scale_bf16, b, one, out); }, {"fp8_gemm", "[1] f32"}));
  EXPECT_TRUE(throws_with([&] { kernels::fp8_gemm(a, one, b, scale_two, out); }, {"fp8_gemm", "[1] f32"}));

  EXPECT_TRUE(throws_with([&] { kernels::fp8_gemm(a, Tensor(), b, one, out); }, {"fp8_gemm", "undefined"}));
}

}  // namespace
}  // namespace octet
