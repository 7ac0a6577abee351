// Initialisers: statistics on large tensors against closed forms, the truncated normal's mapping
// element by element, reproducibility from a seed, and timm's ViT scheme.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "nn/init.h"
#include "nn/layers.h"
#include "tests/testing.h"

namespace octet::nn {
namespace {

using octet::testing::throws_with;

struct Stats {
  double mean, std, min, max;
};
Stats stats_of(const Tensor& t) {
  const std::vector<double> v = t.to_vector<double>();
  double mean = 0, var = 0;
  for (double x : v) mean += x / static_cast<double>(v.size());
  for (double x : v) var += (x - mean) * (x - mean) / static_cast<double>(v.size());
  return {mean, std::sqrt(var), *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())};
}

double phi(double x) { return std::exp(-x * x / 2) / std::sqrt(2 * std::numbers::pi); }
double Phi(double x) { return 0.5 * std::erfc(-x / std::numbers::sqrt2); }

constexpr int64_t kN = 1 << 20;

TEST(Init, TruncNormalAsTimmUsesItIsNormalWithStd002) {
  Generator gen(1);
  const Tensor t = empty({kN});
  trunc_normal_(t, 0.0, 0.02, gen);  // bounds ±2: absolute, so 100 std away
  const Stats s = stats_of(t);
  EXPECT_NEAR(s.mean, 0.0, 5 * 0.02 / std::sqrt(kN));
  EXPECT_NEAR(s.std, 0.02, 0.02 * 0.005);
  EXPECT_GT(s.max, 4 * 0.02) << "the tails are there: nothing was truncated";
}

TEST(Init, TruncNormalHasTheTruncatedMoments) {
  const double mu = 0.3, sigma = 1.0, a = -1.0, b = 1.5;
  Generator gen(2);
  const Tensor t = empty({kN}, DType::f64);
  trunc_normal_(t, mu, sigma, a, b, gen);
  const Stats s = stats_of(t);
  // Closed forms for Normal(mu, sigma) restricted to [a, b].
  const double al = (a - mu) / sigma, be = (b - mu) / sigma, Z = Phi(be) - Phi(al);
  const double mean = mu + sigma * (phi(al) - phi(be)) / Z;
  const double var =
      sigma * sigma * (1 + (al * phi(al) - be * phi(be)) / Z - std::pow((phi(al) - phi(be)) / Z, 2));
  EXPECT_NEAR(s.mean, mean, 5 * std::sqrt(var / kN));
  EXPECT_NEAR(s.std, std::sqrt(var), std::sqrt(var) * 0.005);
  EXPECT_GE(s.min, a);
  EXPECT_LE(s.max, b);
  EXPECT_LT(s.min, a + 1e-3) << "samples reach the bounds";
  EXPECT_GT(s.max, b - 1e-3);
}

TEST(Init, TruncNormalMapsEachUniformThroughTheInverseCdf) {
  // The same seed gives the uniforms trunc_normal_ drew; Φ of each output must land on
  // Φ(α) + u·(Φ(β) − Φ(α)), checked with the forward CDF (std::erfc) only.
  const double mu = -0.5, sigma = 2.0, a = -4.0, b = 3.0;
  const int64_t n = 4096;
  Generator draw(3), same(3);
  const Tensor t = empty({n}, DType::f64);
  trunc_normal_(t, mu, sigma, a, b, draw);
  const std::vector<double> u = rand({n}, same, DType::f32).to_vector<double>();
  const std::vector<double> x = t.to_vector<double>();
  const double cdf_a = Phi((a - mu) / sigma), cdf_b = Phi((b - mu) / sigma);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(Phi((x[i] - mu) / sigma), cdf_a + u[i] * (cdf_b - cdf_a), 1e-13) << "element " << i;
  }
}

TEST(Init, NormalAndUniformStatistics) {
  Generator gen(4);
  const Tensor n = empty({kN});
  normal_(n, 1.5, 0.25, gen);
  const Stats sn = stats_of(n);
  EXPECT_NEAR(sn.mean, 1.5, 5 * 0.25 / std::sqrt(kN));
  EXPECT_NEAR(sn.std, 0.25, 0.25 * 0.005);

  const Tensor u = empty({kN});
  uniform_(u, -3.0, 1.0, gen);
  const Stats su = stats_of(u);
  const double width = 4.0;
  EXPECT_NEAR(su.mean, -1.0, 5 * width / std::sqrt(12.0 * kN));
  EXPECT_NEAR(su.std, width / std::sqrt(12.0), 0.005);
  EXPECT_GE(su.min, -3.0);
  EXPECT_LT(su.max, 1.0);
  EXPECT_LT(su.min, -3.0 + 1e-3);
  EXPECT_GT(su.max, 1.0 - 1e-3);

  zeros_(u);
  EXPECT_EQ(stats_of(u).max, 0.0);
  ones_(u);
  EXPECT_EQ(stats_of(u).min, 1.0);
}

TEST(Init, PytorchDefaultIsUniformInOneOverSqrtFanIn) {
  Generator gen(5);
  const Tensor weight = empty({512, 3, 16, 16}), bias = empty({512});  // a patch conv: fan_in 768
  pytorch_default_init_(weight, bias, gen);
  const double bound = 1.0 / std::sqrt(768.0);
  const Stats sw = stats_of(weight), sb = stats_of(bias);
  EXPECT_GE(sw.min, -bound);
  EXPECT_LE(sw.max, bound);
  EXPECT_GT(sw.max, bound * 0.999);
  EXPECT_NEAR(sw.std, bound / std::sqrt(3.0), bound * 0.005);
  EXPECT_NEAR(sw.mean, 0.0, 5 * bound / std::sqrt(3.0 * weight.numel()));
  EXPECT_GE(sb.min, -bound);
  EXPECT_LE(sb.max, bound);
  EXPECT_GT(sb.std, bound / 3) << "the bias is drawn too, not left at zero";
}

TEST(Init, SameSeedSameValuesAnyDtype) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    Generator g1(6), g2(6), g3(7);
    const Tensor a = empty({1000}, dtype), b = empty({1000}, dtype), c = empty({1000}, dtype);
    trunc_normal_(a, 0.0, 1.0, g1);
    trunc_normal_(b, 0.0, 1.0, g2);
    trunc_normal_(c, 0.0, 1.0, g3);
    EXPECT_EQ(a.to_vector<double>(), b.to_vector<double>()) << dtype_name(dtype);
    EXPECT_NE(a.to_vector<double>(), c.to_vector<double>()) << dtype_name(dtype);
    EXPECT_NEAR(stats_of(a).std, 0.88, 0.05) << "Normal(0, 1) on [-2, 2] has std 0.880";
  }
}

TEST(Init, BadArgumentsSayWhatIsWrong) {
  Generator gen;
  const Tensor t = empty({4});
  EXPECT_TRUE(throws_with([&] { trunc_normal_(t, 0.0, 1.0, 2.0, -2.0, gen); }, {"trunc_normal_", "a < b"}));
  EXPECT_TRUE(throws_with([&] { trunc_normal_(t, 0.0, 1.0, 50.0, 60.0, gen); }, {"too far in the tail"}));
  EXPECT_TRUE(throws_with([&] { uniform_(t, 1.0, 0.0, gen); }, {"uniform_", "swap"}));
  EXPECT_TRUE(throws_with([&] { normal_(empty({4}, DType::i64), 0.0, 1.0, gen); }, {"floating", "i64"}));
  EXPECT_TRUE(throws_with([&] { pytorch_default_init_(empty({4}), Tensor(), gen); }, {"[out, in, ...]"}));
}

TEST(Init, LayersInitialiseLikePytorchUnlessSkipped) {
  EXPECT_TRUE(init_enabled());
  {
    SkipInitGuard outer;
    EXPECT_FALSE(init_enabled());
    {
      SkipInitGuard inner;
      EXPECT_FALSE(init_enabled());
    }
    EXPECT_FALSE(init_enabled()) << "the inner guard restores the outer state";
  }
  EXPECT_TRUE(init_enabled());

  manual_seed(8);
  Linear a(400, 300);
  manual_seed(8);
  Linear b(400, 300);
  EXPECT_EQ(a.weight.to_vector<float>(), b.weight.to_vector<float>()) << "drawn from default_generator()";
  const double bound = 1 / std::sqrt(400.0);
  const Stats s = stats_of(a.weight);
  EXPECT_LE(s.max, bound);
  EXPECT_NEAR(s.std, bound / std::sqrt(3.0), bound * 0.01);
}

TEST(Init, VitTimmSchemeOnEachLayerKind) {
  Generator gen(9);
  Linear linear(1024, 512);
  LayerNorm norm(64);
  PatchProjection proj(3, 256, 16);
  norm.weight.fill_(3.0);
  init_weights_vit_timm(linear, gen);
  init_weights_vit_timm(norm, gen);
  init_weights_vit_timm(proj, gen);
  const Stats w = stats_of(linear.weight);
  EXPECT_NEAR(w.std, 0.02, 0.02 * 0.01);
  EXPECT_NEAR(w.mean, 0.0, 5 * 0.02 / std::sqrt(1024.0 * 512));
  EXPECT_EQ(stats_of(linear.bias).max, 0.0);
  EXPECT_EQ(stats_of(linear.bias).min, 0.0);
  EXPECT_EQ(stats_of(norm.weight).min, 1.0);
  EXPECT_EQ(stats_of(norm.bias).max, 0.0);
  const double bound = 1 / std::sqrt(3.0 * 16 * 16);
  EXPECT_LE(stats_of(proj.weight).max, bound);
  EXPECT_NEAR(stats_of(proj.weight).std, bound / std::sqrt(3.0), bound * 0.01);
}

}  // namespace
}  // namespace octet::nn
