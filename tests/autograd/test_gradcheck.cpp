// The checkers every other test leans on fail where they must: gradcheck on a backward that is wrong
// (scaled by 1 + 1e-3, one Jacobian entry dropped, NaN, missing, misshapen), and the comparison
// helpers of tests/testing.h on tensors that differ by one element, one bit or one part in 1e5.
// About a hundred finite-difference assertions would pass whatever the code did if gradcheck could
// not fail.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/function.h"
#include "autograd/gradcheck.h"
#include "kernels/elementwise.h"
#include "tests/testing.h"

namespace octet {
namespace {

using autograd::gradcheck;
using autograd::Grads;
using Inputs = std::vector<Tensor>;
using testing::random_tensor;

Tensor leaf(const Shape& shape, uint64_t seed) {
  Tensor t = random_tensor(shape, DType::f64, seed);
  t.requires_grad_();
  return t;
}

// a * b, elementwise, with the backward `grads` makes from (g, a, b): the right one returns
// {g*b, g*a}; the tests break it one way at a time.
using BackwardOf = std::function<Grads(const Tensor& g, const Tensor& a, const Tensor& b)>;
Tensor mul_with(const Tensor& a, const Tensor& b, BackwardOf backward) {
  return autograd::record("mul_under_test", kernels::mul(a, b), {a, b},
                          [a = a.detach(), b = b.detach(), backward](const Grads& g) { return backward(g[0], a, b); });
}

const BackwardOf kRight = [](const Tensor& g, const Tensor& a, const Tensor& b) -> Grads {
  return {kernels::mul(g, b), kernels::mul(g, a)};
};

autograd::GradcheckResult check(const BackwardOf& backward) {
  return gradcheck([backward](const Inputs& x) { return mul_with(x[0], x[1], backward); },
                   {leaf({3, 5}, 1), leaf({3, 5}, 2)});
}

TEST(Gradcheck, PassesTheRightBackward) {
  const auto result = check(kRight);
  EXPECT_TRUE(result) << result.message;
}

TEST(Gradcheck, FailsABackwardScaledByOnePartInAThousand) {
  // 1e-3 relative is ten times gradcheck's rtol (1e-4); central differences at eps 1e-6 are exact
  // for a product to ~1e-10.
  const auto result = check([](const Tensor& g, const Tensor& a, const Tensor& b) -> Grads {
    return {kernels::mul_scalar(kernels::mul(g, b), 1.001), kernels::mul(g, a)};
  });
  EXPECT_FALSE(result);
  EXPECT_NE(result.message.find("input 0"), std::string::npos) << result.message;
}

TEST(Gradcheck, FailsOneWrongJacobianEntry) {
  const auto result = check([](const Tensor& g, const Tensor& a, const Tensor& b) -> Grads {
    Tensor da = kernels::mul(g, b).clone();
    da.data<double>()[7] = 0.0;  // one element of one input's gradient lost
    return {da, kernels::mul(g, a)};
  });
  EXPECT_FALSE(result);
  EXPECT_NE(result.message.find("input 0"), std::string::npos) << result.message;
}

TEST(Gradcheck, FailsANanGradient) {
  const auto result = check([](const Tensor& g, const Tensor& a, const Tensor& b) -> Grads {
    Tensor db = kernels::mul(g, a).clone();
    db.data<double>()[0] = std::numeric_limits<double>::quiet_NaN();
    return {kernels::mul(g, b), db};
  });
  EXPECT_FALSE(result);
  EXPECT_NE(result.message.find("input 1"), std::string::npos) << result.message;
}

TEST(Gradcheck, FailsAMissingGradient) {
  // An input that requires grad and gets none: its gradient reads as zero, where it is b.
  const auto result = check([](const Tensor& g, const Tensor& a, const Tensor&) -> Grads {
    return {Tensor(), kernels::mul(g, a)};
  });
  EXPECT_FALSE(result);
}

TEST(Gradcheck, FailsOrThrowsOnAGradientOfTheWrongShape) {
  bool failed = false;
  try {
    failed = !check([](const Tensor& g, const Tensor& a, const Tensor& b) -> Grads {
      return {kernels::mul(g, b).reshape({5, 3}), kernels::mul(g, a)};
    });
  } catch (const Error&) {
    failed = true;  // the engine refuses a gradient whose shape is not its input's
  }
  EXPECT_TRUE(failed);
}

// ---- tests/testing.h ---------------------------------------------------------------------------------

TEST(TestingHelpers, SameBitsSeesOneFlippedBitAndADtypeOrShapeChange) {
  const Tensor a = random_tensor({4, 6}, DType::f32, 3);
  EXPECT_TRUE(testing::same_bits(a, a.clone()));
  Tensor b = a.clone();
  reinterpret_cast<unsigned char*>(b.data_ptr())[4 * 13] ^= 1;  // the lowest mantissa bit of element 13
  const auto r = testing::same_bits(b, a);
  EXPECT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("element 13"), std::string::npos) << r.message();
  EXPECT_FALSE(testing::same_bits(a.to(DType::f64), a));
  EXPECT_FALSE(testing::same_bits(a.reshape({6, 4}), a));
  EXPECT_FALSE(testing::same_bits(Tensor(), a));
}

TEST(TestingHelpers, AllCloseFailsOneElementJustOutsideItsBound) {
  const Tensor want = random_tensor({100}, DType::f64, 4);
  const std::vector<double> w = want.to_vector<double>();
  std::vector<double> g = w;
  const double atol = 1e-6, rtol = 1e-4;
  g[57] += 1.01 * (atol + rtol * std::abs(w[57]));
  const Tensor got = from_vector(g, {100});
  const auto r = testing::all_close(got, want, atol, rtol);
  EXPECT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("element 57"), std::string::npos) << r.message();
  g[57] = w[57] + 0.99 * (atol + rtol * std::abs(w[57]));
  EXPECT_TRUE(testing::all_close(from_vector(g, {100}), want, atol, rtol));
  g[57] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(testing::all_close(from_vector(g, {100}), want, atol, rtol));
}

TEST(TestingHelpers, RelativeErrorIsTheNormOfTheDifferenceOverTheReferences) {
  // got = want + (3e-5, 4e-5) against want = (1, 0): ||(3e-5, 4e-5)|| / ||(1, 0)|| = 5e-5.
  const Tensor want = from_vector(std::vector<double>{1.0, 0.0}, {2});
  const Tensor got = from_vector(std::vector<double>{1.0 + 3e-5, 4e-5}, {2});
  EXPECT_NEAR(testing::relative_error(got, want), 5e-5, 1e-15);
  EXPECT_EQ(testing::relative_error(want, want), 0.0);
  const Tensor with_nan = from_vector(std::vector<double>{1.0, std::nan("")}, {2});
  EXPECT_TRUE(std::isnan(testing::relative_error(with_nan, want)));  // fails every bound
}

}  // namespace
}  // namespace octet
