// The vectorizable float exp and normal CDF (GELU's hot path) against double-precision std::
// functions over a dense sweep, in ulps of the float result.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/cpu/vec_math.h"

namespace octet {
namespace {

namespace vec = kernels::cpu::vec;

// Distance in float ulps between x and the exact value y (measured at y's magnitude).
double ulps(float x, double y) {
  const float yf = static_cast<float>(y);
  const double ulp = std::nextafter(std::fabs(yf), std::numeric_limits<float>::infinity()) - std::fabs(yf);
  return std::fabs(static_cast<double>(x) - y) / (ulp > 0 ? ulp : std::numeric_limits<float>::denorm_min());
}

TEST(VecMath, ExpIsWithinTwoUlpsAcrossTheNormalRange) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.0013f) worst = std::max(worst, ulps(vec::exp(x), std::exp(double(x))));
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(vec::exp(0.0f), 1.0f);
  EXPECT_EQ(vec::exp(-200.0f), 0.0f);  // underflows to zero instead of garbage
  EXPECT_TRUE(std::isnan(vec::exp(std::numeric_limits<float>::quiet_NaN())));
}

TEST(VecMath, NormalCdfIsWithinEightUlpsIncludingTheLeftTail) {
  double worst = 0;
  for (float x = -10.0f; x <= 10.0f; x += 0.00037f) {
    const double exact = 0.5 * std::erfc(-double(x) / std::sqrt(2.0));
    worst = std::max(worst, ulps(vec::normal_cdf(x), exact));
  }
  EXPECT_LE(worst, 8.0);
  EXPECT_EQ(vec::normal_cdf(-30.0f), 0.0f);
  EXPECT_EQ(vec::normal_cdf(30.0f), 1.0f);
  EXPECT_TRUE(std::isnan(vec::normal_cdf(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace octet
