// The FP8 kernels on the CPU: the cast (row-major, transposed and padded) against a per-element
// reference written here from the definition q = fp8(float(x)·scale) with core/float_formats.h's
// saturating encoders, the amax against a float64 maximum of |x|, and every rule of the delayed and
// current scale updates (kernels/fp8.h) against values worked out by hand, the cast fused with the bias
// gradient's column sums against the unfused sequence (fp8_cast, then kernels::sum) bit for bit, then
// the argument errors.
#include "kernels/fp8.h"

#include <omp.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <utility>
#include <vector>

#include "core/float_formats.h"
#include "kernels/reduce.h"
#include "tests/kernels/fp8_cast_case.h"
#include "tests/testing.h"

namespace {

using namespace octet;
using octet::testing::random_tensor;
using octet::testing::same_bits;
using octet::testing::throws_with;
using kernels::AmaxCompute;
using kernels::Fp8ScalingTensors;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor host = t.to(Device::cpu());
  const auto* p = static_cast<const uint8_t*>(host.data_ptr());
  return std::vector<uint8_t>(p, p + host.nbytes());
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float first_float(const Tensor& t) { return t.to_vector<float>()[0]; }

uint8_t reference_code(float x, float scale, DType fp8_dtype) {
  const float scaled = x * scale;
  return fp8_dtype == DType::e4m3 ? float_to_e4m3(scaled, true) : float_to_e5m2(scaled, true);
}

float decode(uint8_t code, DType fp8_dtype) {
  return fp8_dtype == DType::e4m3 ? e4m3_to_float(code) : e5m2_to_float(code);
}

// The largest |x| in double: exact, since every input value widens to double exactly.
float reference_amax(const Tensor& x) {
  double m = 0;
  for (double v : x.to_vector<double>()) m = std::isnan(v) || std::isnan(m) ? NAN : std::max(m, std::abs(v));
  return static_cast<float>(m);
}

using octet::testing::CastCase;

class Fp8CastKernel : public ::testing::TestWithParam<CastCase> {};

TEST_P(Fp8CastKernel, BothCopiesMatchTheReferenceBitForBit) {
  const CastCase c = GetParam();
  // Values up to about ±500 after scaling: the cast uses the whole E4M3 range and saturates a few
  // elements; the seed depends on the shape so the cases differ.
  const Tensor x = random_tensor(c.shape, c.input, 7 + c.shape.numel(), 3.0);
  const float scale = 50.f;
  const Tensor scale_t = full({1}, scale);
  const Tensor amax = zeros({1});
  const kernels::Fp8Cast out = kernels::fp8_cast(x, scale_t, amax, c.format, true, true, c.pad_rows_to);

  const int64_t cols = c.shape[c.shape.ndim() - 1], rows = c.shape.numel() / cols;
  const int64_t padded = (rows + c.pad_rows_to - 1) / c.pad_rows_to * c.pad_rows_to;
  ASSERT_EQ(out.data.shape(), Shape({rows, cols}));
  ASSERT_EQ(out.transposed.shape(), Shape({cols, padded}));
  EXPECT_EQ(out.data.dtype(), c.format);
  EXPECT_EQ(out.transposed.dtype(), c.format);
  const std::vector<float> xs = x.to_vector<float>();
  const std::vector<uint8_t> data = bytes_of(out.data), transposed = bytes_of(out.transposed);
  int64_t saturated = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t col = 0; col < cols; ++col) {
      const uint8_t want = reference_code(xs[r * cols + col], scale, c.format);
      ASSERT_EQ(data[r * cols + col], want) << "row " << r << ", col " << col;
      ASSERT_EQ(transposed[col * padded + r], want) << "transposed row " << col << ", col " << r;
      saturated += std::abs(decode(want, c.format)) == kernels::fp8_max(c.format);
    }
  }
  for (int64_t col = 0; col < cols; ++col) {
    for (int64_t r = rows; r < padded; ++r) {
      ASSERT_EQ(transposed[col * padded + r], 0) << "padding " << col << ", " << r;
    }
  }
  if (c.format == DType::e4m3 && rows * cols > 500) {
    EXPECT_GT(saturated, 0) << "the case should reach the saturation";
  }
  EXPECT_EQ(bits_of(first_float(out.scale_inv)), bits_of(1.f / scale));
  EXPECT_EQ(bits_of(first_float(amax)), bits_of(reference_amax(x)));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8CastKernel,
                         ::testing::Values(CastCase{{37, 53}, DType::f32, DType::e4m3, 16},
                                           CastCase{{37, 53}, DType::bf16, DType::e5m2, 16},
                                           CastCase{{1, 17}, DType::bf16, DType::e4m3, 16},
                                           CastCase{{1, 17}, DType::f32, DType::e5m2, 1},
                                           CastCase{{129, 16}, DType::f32, DType::e4m3, 16},
                                           CastCase{{129, 16}, DType::bf16, DType::e4m3, 7},
                                           CastCase{{3, 5, 7}, DType::f16, DType::e5m2, 16},
                                           CastCase{{64, 64}, DType::bf16, DType::e4m3, 16},
                                           CastCase{{300, 257}, DType::bf16, DType::e4m3, 16},
                                           CastCase{{300, 257}, DType::f32, DType::e5m2, 16},
                                           CastCase{{17}, DType::f32, DType::e4m3, 16}));

TEST(Fp8Cast, OneCopyAloneLeavesTheOtherUndefined) {
  const Tensor x = random_tensor({5, 9}, DType::bf16, 3);
  const Tensor scale = full({1}, 2.0);
  const auto rowwise = kernels::fp8_cast(x, scale, Tensor(), DType::e4m3, true, false);
  EXPECT_TRUE(rowwise.data.defined());
  EXPECT_FALSE(rowwise.transposed.defined());
  const auto transposed = kernels::fp8_cast(x, scale, Tensor(), DType::e4m3, false, true);
  EXPECT_FALSE(transposed.data.defined());
  ASSERT_TRUE(transposed.transposed.defined());
  EXPECT_EQ(transposed.transposed.shape(), Shape({9, 16}));
  const std::vector<uint8_t> d = bytes_of(rowwise.data), t = bytes_of(transposed.transposed);
  for (int64_t r = 0; r < 5; ++r) {
    for (int64_t c = 0; c < 9; ++c) EXPECT_EQ(d[r * 9 + c], t[c * 16 + r]);
  }
}

TEST(Fp8Cast, SaturatesHugeValuesToTheLargestFinite) {
  const std::vector<float> values = {1e6f, -1e6f, 3e38f, -3e38f, kInf, -kInf, 449.f, -60000.f, 0.5f, -0.f};
  const Tensor x = from_vector(values, {2, 5});
  for (DType format : {DType::e4m3, DType::e5m2}) {
    const float max = kernels::fp8_max(format);
    const auto out = kernels::fp8_cast(x, full({1}, 1.0), Tensor(), format, true, false);
    const std::vector<uint8_t> codes = bytes_of(out.data);
    for (size_t i = 0; i < values.size(); ++i) {
      const float got = decode(codes[i], format);
      EXPECT_FALSE(std::isnan(got) || std::isinf(got)) << dtype_name(format) << " element " << i;
      if (std::abs(values[i]) >= 60000.f || (format == DType::e4m3 && std::abs(values[i]) > 448.f)) {
        EXPECT_EQ(got, std::copysign(max, values[i])) << dtype_name(format) << " element " << i;
      }
    }
  }
}

TEST(Fp8Cast, AmaxAccumulatesWithMax) {
  const Tensor amax = zeros({1});
  const Tensor big = random_tensor({33, 31}, DType::f32, 11, 4.0), small = random_tensor({7, 8}, DType::bf16, 12);
  kernels::fp8_cast(big, full({1}, 1.0), amax, DType::e4m3, true, true);
  const float after_big = first_float(amax);
  EXPECT_EQ(after_big, reference_amax(big));
  kernels::fp8_cast(small, full({1}, 1.0), amax, DType::e4m3, true, false);
  EXPECT_EQ(first_float(amax), after_big) << "a smaller tensor leaves the amax";
  kernels::fp8_amax_(random_tensor({100}, DType::f32, 13, 100.0), amax);
  EXPECT_EQ(first_float(amax), reference_amax(random_tensor({100}, DType::f32, 13, 100.0)));
}

TEST(Fp8Cast, NaNAndInfMakeTheAmaxNaNAndInf) {
  std::vector<float> values(40, 1.5f);
  values[17] = -kInf;
  const Tensor amax = zeros({1});
  kernels::fp8_cast(from_vector(values, {5, 8}), full({1}, 1.0), amax, DType::e4m3, true, true);
  EXPECT_EQ(first_float(amax), kInf);
  values[3] = kNaN;
  const auto out = kernels::fp8_cast(from_vector(values, {5, 8}), full({1}, 1.0), amax, DType::e4m3, true, true);
  EXPECT_TRUE(std::isnan(first_float(amax)));
  EXPECT_EQ(bytes_of(out.data)[3], 0x7F) << "NaN casts to E4M3's NaN code";
  const Tensor amax2 = zeros({1});
  kernels::fp8_amax_(from_vector(values, {40}, DType::bf16), amax2);
  EXPECT_TRUE(std::isnan(first_float(amax2)));
}

TEST(Fp8Cast, AmaxAloneMatchesTheReferenceForEveryInputDtype) {
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    const Tensor x = random_tensor({100003}, d, 21, 5.0);  // large enough for the threaded path
    const Tensor amax = zeros({1});
    kernels::fp8_amax_(x, amax);
    EXPECT_EQ(first_float(amax), reference_amax(x)) << dtype_name(d);
  }
}

TEST(Fp8Cast, ResultsDoNotDependOnTheThreadCount) {
  const Tensor x = random_tensor({1000, 77}, DType::bf16, 5, 40.0);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const Tensor amax1 = zeros({1});
  const auto one = kernels::fp8_cast(x, full({1}, 3.0), amax1, DType::e4m3, true, true);
  omp_set_num_threads(3);
  const Tensor amax3 = zeros({1});
  const auto three = kernels::fp8_cast(x, full({1}, 3.0), amax3, DType::e4m3, true, true);
  omp_set_num_threads(saved);
  EXPECT_EQ(bytes_of(one.data), bytes_of(three.data));
  EXPECT_EQ(bytes_of(one.transposed), bytes_of(three.transposed));
  EXPECT_EQ(bits_of(first_float(amax1)), bits_of(first_float(amax3)));
}

// ---- the cast fused with the bias gradient -------------------------------------------------------------------

// fp8_cast_dbias against fp8_cast followed by kernels::sum(x2, 0).to(dbias_dtype), the sequence it
// replaces in the FP8 Linear's backward: every byte of both copies (the transposed padding included),
// scale_inv, the amax (both starting from the same value below x's amax) and dbias, bit for bit.
void expect_fused_is_the_unfused_sequence(const Tensor& x, DType format, bool rowwise, bool transposed, bool with_amax,
                                          DType dbias_dtype, int64_t pad_rows_to = kernels::kFp8RowPadding) {
  const Tensor scale = full({1}, 37.0);
  const Tensor amax_fused = with_amax ? full({1}, 0.5) : Tensor(), amax_unfused = with_amax ? full({1}, 0.5) : Tensor();
  const kernels::Fp8CastWithBiasGrad fused =
      kernels::fp8_cast_dbias(x, scale, amax_fused, format, rowwise, transposed, dbias_dtype, pad_rows_to);
  const kernels::Fp8Cast cast = kernels::fp8_cast(x, scale, amax_unfused, format, rowwise, transposed, pad_rows_to);
  const Tensor dbias = kernels::sum(x.reshape({-1, x.size(-1)}), 0).to(dbias_dtype);
  ASSERT_EQ(fused.data.defined(), rowwise);
  ASSERT_EQ(fused.transposed.defined(), transposed);
  if (rowwise) {
    EXPECT_TRUE(same_bits(fused.data, cast.data)) << "row-major copy";
  }
  if (transposed) {
    EXPECT_TRUE(same_bits(fused.transposed, cast.transposed)) << "transposed copy and its padding";
  }
  EXPECT_TRUE(same_bits(fused.scale_inv, cast.scale_inv)) << "scale_inv";
  if (with_amax) {
    EXPECT_TRUE(same_bits(amax_fused, amax_unfused)) << "amax";
    if (x.numel() > 0) {
      EXPECT_NE(first_float(amax_fused), 0.5f) << "the amax moved";
    }
  }
  EXPECT_TRUE(same_bits(fused.dbias, dbias)) << "dbias";
}

struct DbiasCase {
  int64_t rows, cols;
  DType input, dbias;
};

void PrintTo(const DbiasCase& c, std::ostream* os) {
  *os << "[" << c.rows << ", " << c.cols << "] " << dtype_name(c.input) << ", dbias " << dtype_name(c.dbias);
}

class Fp8CastDbias : public ::testing::TestWithParam<DbiasCase> {};

// Row counts around pairwise summation's leaves (16 rows) and the fused cast's chunks (128 rows):
// 130 rows are two chunks, 300 four in two levels, 1000 sixteen in four (and go parallel). Columns
// within one tile of 64 and across several.
TEST_P(Fp8CastDbias, IsTheUnfusedSequenceBitForBit) {
  const DbiasCase c = GetParam();
  // Values far apart in magnitude, so that a sum in any other order differs in its last bits.
  Tensor x = random_tensor({c.rows, c.cols}, DType::f32, 100 + c.rows * 7 + c.cols, 3.0);
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] *= std::exp2(static_cast<float>(i % 13) - 6.f);
  x = x.to(c.input);
  for (DType format : {DType::e4m3, DType::e5m2}) {
    for (auto [rowwise, transposed] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
      for (bool with_amax : {true, false}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(format) << (rowwise ? " rowwise" : "")
                                          << (transposed ? " transposed" : "") << (with_amax ? " amax" : ""));
        expect_fused_is_the_unfused_sequence(x, format, rowwise, transposed, with_amax, c.dbias);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8CastDbias,
                         ::testing::Values(DbiasCase{1, 16, DType::f32, DType::f32},
                                           DbiasCase{1, 48, DType::bf16, DType::bf16},
                                           DbiasCase{7, 32, DType::f32, DType::f32},
                                           DbiasCase{7, 80, DType::bf16, DType::bf16},
                                           DbiasCase{16, 64, DType::f32, DType::f32},
                                           DbiasCase{17, 64, DType::f32, DType::f32},
                                           DbiasCase{33, 160, DType::f32, DType::f32},
                                           DbiasCase{33, 48, DType::bf16, DType::f32},
                                           DbiasCase{130, 96, DType::f32, DType::f32},
                                           DbiasCase{130, 144, DType::bf16, DType::bf16},
                                           DbiasCase{300, 64, DType::f32, DType::bf16},
                                           DbiasCase{300, 16, DType::f16, DType::f32},
                                           DbiasCase{1000, 96, DType::f32, DType::f32},
                                           DbiasCase{1000, 96, DType::bf16, DType::bf16},
                                           DbiasCase{0, 32, DType::bf16, DType::bf16}));

TEST(Fp8CastDbias, OtherShapesAndPaddingsAreTheUnfusedSequenceToo) {
  // A leading batch dim (rows = 4·25), padding to 7 rows and none, a single column (summed by
  // kernels::sum as one contiguous row) and a single element.
  const Tensor batched = random_tensor({4, 25, 48}, DType::bf16, 61, 2.0);
  expect_fused_is_the_unfused_sequence(batched, DType::e4m3, true, true, true, DType::bf16);
  expect_fused_is_the_unfused_sequence(batched, DType::e5m2, false, true, true, DType::bf16, 7);
  expect_fused_is_the_unfused_sequence(batched, DType::e5m2, false, true, false, DType::f32, 1);
  expect_fused_is_the_unfused_sequence(random_tensor({200, 1}, DType::f32, 62), DType::e4m3, true, true, true,
                                       DType::f32);
  expect_fused_is_the_unfused_sequence(random_tensor({5}, DType::f32, 63), DType::e5m2, true, true, true, DType::f32);
}

TEST(Fp8CastDbias, ResultsDoNotDependOnTheThreadCount) {
  const Tensor x = random_tensor({2000, 80}, DType::bf16, 64, 10.0);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = kernels::fp8_cast_dbias(x, full({1}, 3.0), Tensor(), DType::e5m2, true, true, DType::f32);
  omp_set_num_threads(3);
  const auto three = kernels::fp8_cast_dbias(x, full({1}, 3.0), Tensor(), DType::e5m2, true, true, DType::f32);
  expect_fused_is_the_unfused_sequence(x, DType::e5m2, true, true, true, DType::f32);
  omp_set_num_threads(saved);
  EXPECT_TRUE(same_bits(one.data, three.data));
  EXPECT_TRUE(same_bits(one.transposed, three.transposed));
  EXPECT_TRUE(same_bits(one.dbias, three.dbias));
}

// ---- scale updates ----------------------------------------------------------------------------------------

// The rule as the header states it, in f32: fp8_max / amax / 2^margin.
float expected_scale(float fp8_max, float amax, double margin) {
  const float divisor = static_cast<float>(std::exp2(margin));
  return fp8_max / amax / divisor;
}

Fp8ScalingTensors group(const std::vector<float>& history, int64_t L, int64_t n, const std::vector<float>& scale,
                        DType format = DType::e4m3) {
  return {from_vector(history, {L, n}), from_vector(scale, {n}), zeros({n}), format};
}

void expect_scales(const Fp8ScalingTensors& g, const std::vector<float>& want) {
  const std::vector<float> scale = g.scale.to_vector<float>(), inv = g.scale_inv.to_vector<float>();
  ASSERT_EQ(scale.size(), want.size());
  for (size_t j = 0; j < want.size(); ++j) {
    EXPECT_EQ(bits_of(scale[j]), bits_of(want[j])) << "scale[" << j << "] = " << scale[j] << ", want " << want[j];
    EXPECT_EQ(bits_of(inv[j]), bits_of(1.f / want[j])) << "scale_inv[" << j << "]";
  }
}

TEST(Fp8UpdateScales, MaxTakesEveryRowAndMostRecentTheFirst) {
  const std::vector<float> history = {2.f, 1.f, 8.f, 0.5f, 4.f, 3.f};  // [3, 2]
  auto g = group(history, 3, 2, {1.f, 1.f});
  kernels::fp8_update_scales_({g}, 0.0, AmaxCompute::Max);
  expect_scales(g, {expected_scale(448.f, 8.f, 0), expected_scale(448.f, 3.f, 0)});
  auto r = group(history, 3, 2, {1.f, 1.f}, DType::e5m2);
  kernels::fp8_update_scales_({r}, 0.0, AmaxCompute::MostRecent);
  expect_scales(r, {expected_scale(57344.f, 2.f, 0), expected_scale(57344.f, 1.f, 0)});
  // An amax that is not a power of two: the f32 quotient, rounded once.
  auto odd = group({3.3f}, 1, 1, {1.f});
  kernels::fp8_update_scales_({odd}, 0.0, AmaxCompute::Max);
  expect_scales(odd, {448.f / 3.3f});
}

TEST(Fp8UpdateScales, ZeroAndNonFiniteAmaxKeepThePreviousScale) {
  // Columns: amax 0, NaN (in an older row), inf, and a finite one beside them.
  const std::vector<float> history = {0.f, 1.f, kInf, 2.f,  //
                                      0.f, kNaN, 1.f, 1.f};
  auto g = group(history, 2, 4, {5.f, 6.f, 7.f, 8.f});
  kernels::fp8_update_scales_({g}, 0.0, AmaxCompute::Max);
  expect_scales(g, {5.f, 6.f, 7.f, expected_scale(448.f, 2.f, 0)});
  // MostRecent reads row 0 only, so the NaN in row 1 does not count (a fresh copy: g's history rolled).
  auto recent = group(history, 2, 4, {5.f, 6.f, 7.f, 8.f});
  kernels::fp8_update_scales_({recent}, 0.0, AmaxCompute::MostRecent);
  expect_scales(recent, {5.f, expected_scale(448.f, 1.f, 0), 7.f, expected_scale(448.f, 2.f, 0)});
}

TEST(Fp8UpdateScales, AnInfiniteScaleBecomesFltMax) {
  auto g = group({1e-40f, 1e-30f}, 1, 2, {1.f, 1.f});  // 448 / 1e-40 overflows f32, 448 / 1e-30 does not
  kernels::fp8_update_scales_({g}, 0.0, AmaxCompute::Max);
  const float big = expected_scale(448.f, 1e-30f, 0);
  ASSERT_TRUE(std::isfinite(big));
  expect_scales(g, {FLT_MAX, big});
  EXPECT_GT(g.scale_inv.to_vector<float>()[0], 0.f) << "1 / FLT_MAX is a denormal, not zero";
}

TEST(Fp8UpdateScales, MarginDividesByAPowerOfTwo) {
  auto one = group({7.f, 100.f}, 1, 2, {1.f, 1.f});
  auto zero = group({7.f, 100.f}, 1, 2, {1.f, 1.f});
  auto negative = group({7.f, 100.f}, 1, 2, {1.f, 1.f});
  kernels::fp8_update_scales_({one}, 1.0, AmaxCompute::Max);
  kernels::fp8_update_scales_({zero}, 0.0, AmaxCompute::Max);
  kernels::fp8_update_scales_({negative}, -2.0, AmaxCompute::Max);
  const std::vector<float> s0 = zero.scale.to_vector<float>();
  expect_scales(one, {s0[0] / 2, s0[1] / 2});
  expect_scales(negative, {s0[0] * 4, s0[1] * 4});
  auto fractional = group({7.f}, 1, 1, {1.f});
  kernels::fp8_update_scales_({fractional}, 0.5, AmaxCompute::Max);
  expect_scales(fractional, {expected_scale(448.f, 7.f, 0.5)});
}

TEST(Fp8UpdateScales, TheHistoryRollsTowardTheFrontAndItsHeadIsZeroed) {
  // L = 4, n = 2: rows a0..a3 become 0, a2, a3, a0.
  auto g = group({1, 10, 2, 20, 3, 30, 4, 40}, 4, 2, {1.f, 1.f});
  kernels::fp8_update_scales_({g}, 0.0, AmaxCompute::Max);
  EXPECT_EQ(g.amax_history.to_vector<float>(), std::vector<float>({0, 0, 3, 30, 4, 40, 1, 10}));
  expect_scales(g, {expected_scale(448.f, 4.f, 0), expected_scale(448.f, 40.f, 0)});
  // L = 1: the only row is zeroed.
  auto single = group({5.f, 6.f, 7.f}, 1, 3, {1.f, 1.f, 1.f});
  kernels::fp8_update_scales_({single}, 0.0, AmaxCompute::Max);
  EXPECT_EQ(single.amax_history.to_vector<float>(), std::vector<float>({0, 0, 0}));
  // A second step after writing a new head: the old rows keep moving toward the front.
  g.amax_history.select(0).copy_(from_vector(std::vector<float>{5, 50}, {2}));
  kernels::fp8_update_scales_({g}, 0.0, AmaxCompute::Max);
  EXPECT_EQ(g.amax_history.to_vector<float>(), std::vector<float>({0, 0, 4, 40, 1, 10, 5, 50}));
}

TEST(Fp8UpdateScales, SeveralGroupsInOneCall) {
  auto forward = group({1, 2, 4, 8}, 2, 2, {1.f, 1.f}, DType::e4m3);
  auto backward = group({0.25f, 0.5f, 0.125f}, 3, 1, {3.f}, DType::e5m2);
  auto wide = group(std::vector<float>(5 * 7, 2.f), 5, 7, std::vector<float>(7, 1.f), DType::e4m3);
  kernels::fp8_update_scales_({forward, backward, wide}, 1.0, AmaxCompute::Max);
  expect_scales(forward, {expected_scale(448.f, 4.f, 1), expected_scale(448.f, 8.f, 1)});
  expect_scales(backward, {expected_scale(57344.f, 0.5f, 1)});
  expect_scales(wide, std::vector<float>(7, expected_scale(448.f, 2.f, 1)));
  EXPECT_EQ(backward.amax_history.to_vector<float>(), std::vector<float>({0.f, 0.125f, 0.25f}));
}

TEST(Fp8ScaleFromAmax, CurrentScalingFollowsTheSameRules) {
  const Tensor amax = from_vector(std::vector<float>{2.f, 0.f, kNaN, kInf, 1e-40f, 3.3f}, {6});
  const Tensor scale = from_vector(std::vector<float>{1.f, 5.f, 6.f, 7.f, 1.f, 1.f}, {6});
  const Tensor scale_inv = zeros({6});
  kernels::fp8_scale_from_amax_(amax, scale, scale_inv, DType::e5m2, 1.0);
  const std::vector<float> want = {expected_scale(57344.f, 2.f, 1), 5.f, 6.f, 7.f, FLT_MAX,
                                   expected_scale(57344.f, 3.3f, 1)};
  const std::vector<float> got = scale.to_vector<float>(), inv = scale_inv.to_vector<float>();
  for (size_t j = 0; j < want.size(); ++j) {
    EXPECT_EQ(bits_of(got[j]), bits_of(want[j])) << j;
    EXPECT_EQ(bits_of(inv[j]), bits_of(1.f / want[j])) << j;
  }
  EXPECT_EQ(amax.to_vector<float>()[0], 2.f) << "amax is only read";
}

// ---- errors --------------------------------------------------------------------------------------------------

TEST(Fp8Errors, CastNamesTheOpTheTensorsAndTheFix) {
  const Tensor x = random_tensor({4, 8});
  const Tensor scale = full({1}, 1.0);
  EXPECT_TRUE(throws_with([&] { kernels::fp8_cast(x.to(DType::f64), scale, Tensor(), DType::e4m3, true, true); },
                          {"fp8_cast", "f64[4, 8] on cpu", ".to(DType::f32)"}));
  EXPECT_TRUE(throws_with([&] { kernels::fp8_cast(x, full({1}, 1.0, DType::bf16), Tensor(), DType::e4m3, true, true); },
                          {"fp8_cast", "scale", "bf16[1] on cpu", "one-element f32"}));
  EXPECT_TRUE(throws_with([&] { kernels::fp8_cast(x, full({2}, 1.0), Tensor(), DType::e4m3, true, true); },
                          {"fp8_cast", "scale", "f32[2] on cpu"}));
  EXPECT_TRUE(throws_with([&] { kernels::fp8_cast(x, scale, zeros({3}), DType::e4m3, true, true); },
                          {"fp8_cast", "amax", "f32[3] on cpu"}));
  EXPECT_TRUE(throws_with([&] { kernels::fp8_cast(x, scale, Tensor(), DType::bf16, true, true); },
                          {"fp8_cast", "e4m3 or e5m2", "bf16"}));
  EXPECT_TRUE(throws_with([&] { kernels::fp8_cast(x, scale, Tensor(), DType::e4m3, true, true, 0); },
                          {"fp8_cast", "pad_rows_to", ">= 1"}));
  EXPECT_TRUE(throws_with([&] { kernels::fp8_cast(x, scale, Tensor(), DType::e4m3, false, false); },
                          {"fp8_cast", "f32[4, 8] on cpu", "at least one"}));
  EXPECT_TRUE(throws_with([&] { kernels::fp8_amax_(x.to(DType::e4m3), zeros({1})); },
                          {"fp8_amax_", "e4m3[4, 8] on cpu", ".to(DType::f32)"}));
  EXPECT_TRUE(throws_with([&] { kernels::fp8_max(DType::f16); }, {"fp8_max", "e4m3 or e5m2", "f16"}));
}

TEST(Fp8Errors, CastWithBiasGradNamesTheOpTheTensorsAndTheFix) {
  const Tensor x = random_tensor({4, 16});
  const Tensor scale = full({1}, 1.0);
  EXPECT_TRUE(throws_with(
      [&] { kernels::fp8_cast_dbias(x, scale, Tensor(), DType::e5m2, true, true, DType::e4m3); },
      {"fp8_cast_dbias", "dbias_dtype must be f32, bf16 or f16", "e4m3", "f32[4, 16] on cpu", "bias.dtype()"}));
  EXPECT_TRUE(throws_with([&] { kernels::fp8_cast_dbias(x, scale, Tensor(), DType::e5m2, true, true, DType::i64); },
                          {"fp8_cast_dbias", "dbias_dtype", "i64"}));
  EXPECT_TRUE(throws_with(
      [&] { kernels::fp8_cast_dbias(x.to(DType::f64), scale, Tensor(), DType::e5m2, true, true, DType::f32); },
      {"fp8_cast_dbias", "f64[4, 16] on cpu", ".to(DType::f32)"}));
  EXPECT_TRUE(throws_with([&] { kernels::fp8_cast_dbias(x, full({2}, 1.0), Tensor(), DType::e5m2, true, true, DType::f32); },
                          {"fp8_cast_dbias", "scale", "f32[2] on cpu", "one-element f32"}));
  EXPECT_TRUE(throws_with([&] { kernels::fp8_cast_dbias(x, scale, zeros({3}), DType::e5m2, true, true, DType::f32); },
                          {"fp8_cast_dbias", "amax", "f32[3] on cpu"}));
  EXPECT_TRUE(throws_with([&] { kernels::fp8_cast_dbias(x, scale, Tensor(), DType::bf16, true, true, DType::f32); },
                          {"fp8_cast_dbias", "e4m3 or e5m2", "bf16"}));
  EXPECT_TRUE(throws_with([&] { kernels::fp8_cast_dbias(x, scale, Tensor(), DType::e5m2, false, false, DType::f32); },
                          {"fp8_cast_dbias", "at least one"}));
  EXPECT_TRUE(throws_with(
      [&] { kernels::fp8_cast_dbias(x, scale, Tensor(), DType::e5m2, true, true, DType::f32, 0); },
      {"fp8_cast_dbias", "pad_rows_to", ">= 1"}));
}

TEST(Fp8Errors, UpdatesNameTheGroupAndTheFix) {
  auto good = group({1.f, 2.f}, 1, 2, {1.f, 1.f});
  auto flat = good;
  flat.amax_history = zeros({4});
  EXPECT_TRUE(throws_with([&] { kernels::fp8_update_scales_({good, flat}, 0.0, AmaxCompute::Max); },
                          {"fp8_update_scales_", "groups[1].amax_history", "f32[4] on cpu", "[L, n]"}));
  auto empty_history = good;
  empty_history.amax_history = zeros({0, 2});
  EXPECT_TRUE(throws_with([&] { kernels::fp8_update_scales_({empty_history}, 0.0, AmaxCompute::Max); },
                          {"groups[0].amax_history", "L >= 1"}));
  auto short_scale = good;
  short_scale.scale = zeros({3});
  EXPECT_TRUE(throws_with([&] { kernels::fp8_update_scales_({short_scale}, 0.0, AmaxCompute::Max); },
                          {"groups[0].scale", "f32[3] on cpu", "n = 2"}));
  auto bf16_inv = good;
  bf16_inv.scale_inv = zeros({2}, DType::bf16);
  EXPECT_TRUE(throws_with([&] { kernels::fp8_update_scales_({bf16_inv}, 0.0, AmaxCompute::Max); },
                          {"groups[0].scale_inv", "bf16[2] on cpu"}));
  auto wrong_format = good;
  wrong_format.fp8_dtype = DType::f32;
  EXPECT_TRUE(throws_with([&] { kernels::fp8_update_scales_({wrong_format}, 0.0, AmaxCompute::Max); },
                          {"groups[0].fp8_dtype", "e4m3 or e5m2"}));
  EXPECT_TRUE(throws_with([&] { kernels::fp8_update_scales_({good}, NAN, AmaxCompute::Max); },
                          {"fp8_update_scales_", "margin", "finite"}));
  EXPECT_TRUE(throws_with(
      [&] { kernels::fp8_scale_from_amax_(zeros({3}), zeros({2}), zeros({3}), DType::e4m3, 0.0); },
      {"fp8_scale_from_amax_", "f32[3] on cpu", "f32[2] on cpu", "amax's shape"}));
  EXPECT_TRUE(throws_with([&] { kernels::fp8_scale_from_amax_(zeros({3}), zeros({3}), zeros({3}), DType::e4m3, INFINITY); },
                          {"fp8_scale_from_amax_", "margin"}));
}

}  // namespace
