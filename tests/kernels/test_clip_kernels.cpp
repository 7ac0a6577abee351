// The device-side pieces of gradient clipping (kernels/optimizers.h): the sum of squares left in a
// tensor, the norm and coefficient computed from it, and the multi-tensor scale by a tensor, against
// the host arithmetic they replace (std::sqrt, the coefficient in double, mul_scalar_), bit for bit.
// None of them reads a tensor value on the host (core/host_sync.h).
#include <cmath>
#include <limits>
#include <vector>

#include "core/host_sync.h"
#include "kernels/elementwise.h"
#include "kernels/optimizers.h"
#include "tests/testing.h"

namespace {

using namespace octet;
using octet::testing::random_tensor;
using octet::testing::throws_with;

// Same dtype and the same bytes.
::testing::AssertionResult same_bits(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape()) {
    return ::testing::AssertionFailure() << got.describe() << " should be " << want.describe();
  }
  const auto* g = static_cast<const unsigned char*>(got.data_ptr());
  const auto* w = static_cast<const unsigned char*>(want.data_ptr());
  for (size_t i = 0; i < got.nbytes(); ++i) {
    if (g[i] != w[i]) return ::testing::AssertionFailure() << "byte " << i << " of " << got.describe() << " differs";
  }
  return ::testing::AssertionSuccess();
}

TEST(ClipKernels, SumOfSquaresTensorHoldsTheTotalOnTheDevice) {
  const std::vector<Tensor> tensors = {random_tensor({1000}, DType::f32, 1), random_tensor({300}, DType::bf16, 2),
                                       random_tensor({7}, DType::f64, 3)};
  const host_sync::Counts before = host_sync::counts();
  const Tensor total = kernels::sum_of_squares_multi_tensor(tensors, Device::cpu());
  EXPECT_EQ((host_sync::counts() - before).total(), 0) << (host_sync::counts() - before).describe();
  EXPECT_EQ(total.dtype(), DType::f64);
  EXPECT_EQ(total.shape(), Shape{});
  EXPECT_EQ(total.item(), kernels::sum_of_squares_multi(tensors));
  EXPECT_EQ(kernels::sum_of_squares_multi_tensor({}, Device::cpu()).item(), 0.0);
  EXPECT_TRUE(throws_with([&] { kernels::sum_of_squares_multi_tensor(tensors, Device::cuda(0)); },
                          {"sum_of_squares_multi", "tensors[0]", "cuda:0", "one device"}));
}

TEST(ClipKernels, NormAndCoefficientAreTheHostRule) {
  for (double ss : {0.0, 1e-20, 0.25, 2.0, 169.0, 1e30}) {
    for (double max_norm : {1e-3, 1.0, 6.5, 1e6}) {
      const kernels::ClipScalars c = kernels::clip_scalars(from_vector<double>({ss}, {}), max_norm);
      const double norm = std::sqrt(ss), coef = max_norm / (norm + 1e-6);
      EXPECT_EQ(c.norm.item(), norm);
      EXPECT_EQ(c.coef.item(), coef < 1.0 ? coef : 1.0) << "ss " << ss << ", max_norm " << max_norm;
    }
  }
  // A non-finite norm leaves the gradients alone: coefficient 1.
  for (double ss : {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    const kernels::ClipScalars c = kernels::clip_scalars(from_vector<double>({ss}, {}), 1.0);
    EXPECT_FALSE(std::isfinite(c.norm.item()));
    EXPECT_EQ(c.coef.item(), 1.0);
  }
  EXPECT_TRUE(throws_with([] { kernels::clip_scalars(zeros({2}, DType::f64), 1.0); },
                          {"clip_scalars", "one-element f64", "f64[2]"}));
  EXPECT_TRUE(throws_with([] { kernels::clip_scalars(zeros({}, DType::f64), 0.0); }, {"clip_scalars", "max_norm"}));
}

TEST(ClipKernels, ScaleMultiIsMulScalarBitForBit) {
  // Large tensors take the OpenMP path; the scale is rounded to f32 for all but f64, as mul_scalar_ does.
  const double s = 0.123456789012345;
  std::vector<Tensor> got, want;
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
      got.push_back(random_tensor({n}, d, static_cast<uint64_t>(n) + 10 * static_cast<uint64_t>(d)));
      want.push_back(got.back().clone());
    }
  }
  for (DType scale_dtype : {DType::f64, DType::f32}) {
    const Tensor scale = from_vector<double>({s}, {}, scale_dtype);
    const host_sync::Counts before = host_sync::counts();
    kernels::scale_multi_(got, scale);
    EXPECT_EQ((host_sync::counts() - before).total(), 0) << (host_sync::counts() - before).describe();
    const double rounded = scale.item();  // an f32 scale is s rounded to f32
    for (const Tensor& w : want) kernels::mul_scalar_(w, rounded);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_bits(got[i], want[i])) << got[i].describe();
  }
}

TEST(ClipKernels, ScaleOfOneWritesNothingAndBumpsVersions) {
  Tensor t = random_tensor({64}, DType::bf16, 5);
  const Tensor before = t.clone();
  const uint64_t version = t.version();
  kernels::scale_multi_({t}, from_vector<double>({1.0}, {}));
  EXPECT_TRUE(same_bits(t, before));
  EXPECT_GT(t.version(), version);
  EXPECT_NO_THROW(kernels::scale_multi_({}, from_vector<double>({0.5}, {})));
}

TEST(ClipKernels, ScaleMultiErrorsNameTheFix) {
  const Tensor t = random_tensor({6});
  EXPECT_TRUE(throws_with([&] { kernels::scale_multi_({t}, zeros({2})); }, {"scale_multi_", "one-element", "f32[2]"}));
  EXPECT_TRUE(throws_with([&] { kernels::scale_multi_({t}, zeros({}, DType::bf16)); },
                          {"scale_multi_", "f32 or f64", "bf16"}));
  EXPECT_TRUE(throws_with([&] { kernels::scale_multi_({t, arange(3)}, ones({})); },
                          {"scale_multi_", "tensors[1]", "i64[3]", "mul_scalar_"}));
  EXPECT_TRUE(throws_with([&] { kernels::scale_multi_({t, t.narrow(2, 2)}, ones({})); },
                          {"scale_multi_", "share memory"}));
}

}  // namespace
