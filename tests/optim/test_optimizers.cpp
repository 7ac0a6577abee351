// SGD and AdamW against closed forms computed in double here: a constant gradient makes Adam's
// bias-corrected moments exact (m̂ = g, v̂ = g²) and SGD's momentum buffer a geometric series; on
// f(p) = ½·a·p² (gradient from autograd) plain SGD contracts by (1 - lr·a) per step and heavy-ball
// momentum follows the second-order recurrence p' = (1 + μ - lr·a)·p - μ·p_prev.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "autograd/ops.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "tests/testing.h"

namespace {

using namespace octet;
using octet::testing::all_close;
using octet::testing::random_tensor;
using octet::testing::throws_with;
using Vec = std::vector<double>;

Vec vals(const Tensor& t) { return t.to_vector<double>(); }

Tensor make_param(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor p = random_tensor(shape, dtype, seed);
  p.requires_grad_();
  return p;
}

// ---- AdamW ---------------------------------------------------------------------------------------------

// p_k after k AdamW steps on the constant gradient g: each step is p ← c·p - u with c = 1 - lr·wd and
// u = lr·g / (|g| + eps), so p_k = c^k·p_0 - u·(1 + c + ... + c^(k-1)).
Vec adamw_constant_gradient(const Vec& p0, const Vec& g, double lr, double wd, double eps, int k) {
  const double c = 1 - lr * wd;
  double geometric = 0;
  for (int j = 0; j < k; ++j) geometric += std::pow(c, j);
  Vec p(p0.size());
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] = std::pow(c, k) * p0[i] - lr * g[i] / (std::abs(g[i]) + eps) * geometric;
  }
  return p;
}

class AdamWConstantGradient : public ::testing::TestWithParam<DType> {};

TEST_P(AdamWConstantGradient, MatchesClosedFormPerGroup) {
  const DType dtype = GetParam();
  const int k = 25;
  const double eps = 1e-3;  // large enough that the closed form tells |g| + eps from |g|
  Tensor w = make_param({6, 5}, dtype, 1), b = make_param({5}, dtype, 2);
  const Tensor gw = random_tensor({6, 5}, dtype, 3), gb = random_tensor({5}, dtype, 4, 0.01);
  const Vec w0 = vals(w), b0 = vals(b);
  optim::AdamW opt({optim::ParamGroup{{w}, 0.02, 0.1}, optim::ParamGroup{{b}, 0.005, 0.0}}, 1.0, 0.9, 0.99,
                   eps);
  for (int step = 0; step < k; ++step) {
    w.set_grad(gw.clone());
    b.set_grad(gb.clone());
    opt.step();
  }
  const double tol = dtype == DType::f64 ? 1e-12 : 2e-5;
  EXPECT_TRUE(all_close(w, adamw_constant_gradient(w0, vals(gw), 0.02, 0.1, eps, k), tol, tol));
  EXPECT_TRUE(all_close(b, adamw_constant_gradient(b0, vals(gb), 0.005, 0.0, eps, k), tol, tol));
  EXPECT_EQ(opt.step_count(0, 0), k);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AdamWConstantGradient, ::testing::Values(DType::f64, DType::f32),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(AdamW, GroupsInheritTheConstructorsLrAndWeightDecayAndSetLrKeepsTheirRatios) {
  Tensor a = make_param({3}, DType::f64, 5), b = make_param({3}, DType::f64, 6);
  optim::AdamW opt({optim::ParamGroup{{a}}, optim::ParamGroup{{b}, 0.5, 0.0}}, 0.01, 0.9, 0.999, 1e-8, 0.2);
  EXPECT_EQ(opt.param_groups()[0].lr, 0.01);
  EXPECT_EQ(opt.param_groups()[0].weight_decay, 0.2);
  EXPECT_EQ(opt.param_groups()[1].lr, 0.5);
  EXPECT_EQ(opt.param_groups()[1].weight_decay, 0.0);
  // A schedule's lr: the inheriting group takes it, the group with its own lr (50x the optimizer's)
  // keeps that ratio, as PyTorch's schedulers scale each group's initial lr.
  opt.set_lr(0.25);
  EXPECT_EQ(opt.param_groups()[0].lr, 0.25);
  EXPECT_EQ(opt.param_groups()[1].lr, 0.25 * (0.5 / 0.01));
  opt.set_lr(0.0);
  EXPECT_EQ(opt.param_groups()[1].lr, 0.0);
  EXPECT_TRUE(throws_with([&] { opt.set_lr(-1); }, {"AdamW", "lr", ">= 0", "-1"}));
}

// As in PyTorch, a parameter whose grad is undefined neither moves nor gets state.
TEST(AdamW, ParametersWithoutGradAreSkippedAndKeepNoState) {
  Tensor used = make_param({4}, DType::f32, 7), unused = make_param({4}, DType::f32, 8);
  const Vec unused0 = vals(unused);
  optim::AdamW opt(std::vector<Tensor>{used, unused}, 0.1);
  for (int step = 0; step < 3; ++step) {
    used.set_grad(random_tensor({4}, DType::f32, 100 + step));
    opt.step();
  }
  EXPECT_EQ(vals(unused), unused0);
  EXPECT_EQ(opt.step_count(0, 0), 3);
  EXPECT_EQ(opt.step_count(0, 1), 0);
  EXPECT_EQ(opt.state_dict().count("state.0.1.exp_avg"), 0u);
  EXPECT_EQ(opt.state_dict().count("state.0.0.exp_avg"), 1u);
}

TEST(AdamW, Bf16GradientsUpdateF32Parameters) {
  Tensor w = make_param({16}, DType::f32, 9);
  const Tensor g = random_tensor({16}, DType::bf16, 10);
  const Vec w0 = vals(w);
  optim::AdamW opt(std::vector<Tensor>{w}, 0.01, 0.9, 0.999, 1e-2, 0.0);
  w.set_grad(g);
  opt.step();
  EXPECT_TRUE(all_close(w, adamw_constant_gradient(w0, vals(g), 0.01, 0.0, 1e-2, 1), 1e-6, 1e-6));
}

// ---- SGD -------------------------------------------------------------------------------------------------

// Σ_{t=1..k} of the step SGD takes on a constant gradient g, per unit of g. The buffer is
// b_t = μ^(t-1) + (1-τ)(1 - μ^(t-1))/(1 - μ); nesterov (τ = 0) steps by 1 + μ·b_t with
// b_t = (1 - μ^t)/(1 - μ).
double sgd_total_step(double mu, double tau, bool nesterov, int k) {
  const double geo_k = (1 - std::pow(mu, k)) / (1 - mu);  // Σ_{t=1..k} μ^(t-1)
  if (nesterov) return k + mu / (1 - mu) * (k - mu * geo_k);
  return geo_k + (1 - tau) / (1 - mu) * (k - geo_k);
}

struct SgdMomentumCase {
  double momentum, dampening;
  bool nesterov;
};

class SgdConstantGradient : public ::testing::TestWithParam<SgdMomentumCase> {};

TEST_P(SgdConstantGradient, MatchesGeometricSeries) {
  const SgdMomentumCase c = GetParam();
  const int k = 30;
  const double lr = 0.01;
  for (DType dtype : {DType::f64, DType::f32}) {
    Tensor p = make_param({7}, dtype, 20);
    const Tensor g = random_tensor({7}, dtype, 21);
    const Vec p0 = vals(p), gv = vals(g);
    optim::SGD opt(std::vector<Tensor>{p}, lr, c.momentum, c.dampening, c.nesterov);
    for (int step = 0; step < k; ++step) {
      p.set_grad(g.clone());
      opt.step();
    }
    const double total = sgd_total_step(c.momentum, c.dampening, c.nesterov, k);
    Vec want(7);
    for (int i = 0; i < 7; ++i) want[i] = p0[i] - lr * gv[i] * total;
    const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
    EXPECT_TRUE(all_close(p, want, tol, tol)) << dtype_name(dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(Momentum, SgdConstantGradient,
                         ::testing::Values(SgdMomentumCase{0.9, 0.0, false}, SgdMomentumCase{0.8, 0.3, false},
                                           SgdMomentumCase{0.9, 0.0, true}, SgdMomentumCase{0.5, 0.0, true}));

// f(p) = ½·a·Σp²: the gradient a·p comes from autograd.
void quadratic_backward(const Tensor& p, double a) { (0.5 * a * sum(p * p)).backward(); }

TEST(SGD, PlainSgdOnAQuadraticContractsGeometrically) {
  const double a = 3.0, lr = 0.1, wd = 0.05;
  Tensor p = make_param({5}, DType::f64, 30);
  const Vec p0 = vals(p);
  optim::SGD opt(std::vector<Tensor>{p}, lr, 0.0, 0.0, false, wd);
  const int k = 12;
  for (int step = 0; step < k; ++step) {
    opt.zero_grad();
    quadratic_backward(p, a);
    opt.step();
  }
  Vec want(5);
  for (int i = 0; i < 5; ++i) want[i] = std::pow(1 - lr * (a + wd), k) * p0[i];
  EXPECT_TRUE(all_close(p, want, 1e-14, 1e-12));
}

TEST(SGD, HeavyBallOnAQuadraticFollowsTheSecondOrderRecurrence) {
  const double a = 2.0, lr = 0.05, mu = 0.9;
  for (DType dtype : {DType::f64, DType::f32}) {
    Tensor p = make_param({6}, dtype, 31);
    Vec prev = vals(p), cur(6);
    for (int i = 0; i < 6; ++i) cur[i] = (1 - lr * a) * prev[i];  // the first step has no momentum yet
    optim::SGD opt(std::vector<Tensor>{p}, lr, mu);
    opt.zero_grad();
    quadratic_backward(p, a);
    opt.step();
    for (int step = 1; step < 40; ++step) {
      opt.zero_grad();
      quadratic_backward(p, a);
      opt.step();
      for (int i = 0; i < 6; ++i) {
        const double next = (1 + mu - lr * a) * cur[i] - mu * prev[i];
        prev[i] = cur[i];
        cur[i] = next;
      }
    }
    const double tol = dtype == DType::f64 ? 1e-13 : 1e-5;
    EXPECT_TRUE(all_close(p, cur, tol, tol)) << dtype_name(dtype);
  }
}

TEST(SGD, ZeroGradSetsGradsToNone) {
  Tensor p = make_param({3}, DType::f32, 40);
  optim::SGD opt(std::vector<Tensor>{p}, 0.1);
  quadratic_backward(p, 1.0);
  ASSERT_TRUE(p.grad().defined());
  opt.zero_grad();
  EXPECT_FALSE(p.grad().defined());
  const Vec before = vals(p);
  opt.step();  // nothing has a gradient: nothing moves
  EXPECT_EQ(vals(p), before);
}

// ---- preconditions ----------------------------------------------------------------------------------------

TEST(OptimizerPreconditions, ErrorsNameTheProblemAndTheFix) {
  Tensor p = make_param({3}, DType::f32, 50);
  EXPECT_TRUE(throws_with([&] { optim::SGD(std::vector<Tensor>{}, 0.1); },
                          {"SGD", "no parameters", "parameters()"}));
  EXPECT_TRUE(throws_with([&] { optim::SGD(std::vector<Tensor>{p}, -0.1); }, {"SGD", "lr", ">= 0"}));
  EXPECT_TRUE(throws_with([&] { optim::AdamW(std::vector<Tensor>{p}, 0.1, 0.9, 0.999, 1e-8, -0.01); },
                          {"AdamW", "weight_decay", ">= 0"}));
  EXPECT_TRUE(throws_with([&] { optim::AdamW(std::vector<Tensor>{p}, 0.1, 1.0); },
                          {"AdamW", "beta1", "[0, 1)"}));
  EXPECT_TRUE(throws_with([&] { optim::AdamW(std::vector<Tensor>{p}, 0.1, 0.9, 1.5); }, {"AdamW", "beta2"}));
  EXPECT_TRUE(throws_with([&] { optim::AdamW(std::vector<Tensor>{p}, 0.1, 0.9, 0.9, -1e-8); },
                          {"AdamW", "eps"}));
  EXPECT_TRUE(throws_with([&] { optim::SGD(std::vector<Tensor>{p}, 0.1, 0.0, 0.0, true); },
                          {"SGD", "nesterov", "momentum > 0"}));
  EXPECT_TRUE(throws_with([&] { optim::SGD(std::vector<Tensor>{p}, 0.1, -0.5); }, {"SGD", "momentum"}));
  EXPECT_TRUE(throws_with([&] { optim::SGD({optim::ParamGroup{{p}, -2.0}}, 0.1); },
                          {"SGD", "group's lr", "-2"}));

  const Tensor non_leaf = p * 2.0;
  EXPECT_TRUE(throws_with([&] { optim::SGD(std::vector<Tensor>{non_leaf}, 0.1); },
                          {"SGD", "not a leaf", "f32[3]", "model.parameters()"}));
  const Tensor ints = arange(3);
  EXPECT_TRUE(throws_with([&] { optim::AdamW(std::vector<Tensor>{ints}, 0.1); }, {"AdamW", "i64[3]", "f32"}));
  const Tensor fp8 = random_tensor({3}).to(DType::e4m3);
  EXPECT_TRUE(throws_with([&] { optim::AdamW(std::vector<Tensor>{fp8}, 0.1); },
                          {"AdamW", "e4m3[3]", "keep the parameter in bf16 or f32"}));
  EXPECT_TRUE(throws_with([&] { optim::SGD({optim::ParamGroup{{p}}, optim::ParamGroup{{p}}}, 0.1); },
                          {"SGD", "more than once", "one group"}));
  EXPECT_TRUE(throws_with([&] { optim::SGD(std::vector<Tensor>{Tensor()}, 0.1); }, {"SGD", "undefined"}));
}

TEST(OptimizerPreconditions, ChangingWhichTensorsAreOptimizedIsRefused) {
  Tensor p = make_param({3}, DType::f32, 51), q = make_param({3}, DType::f32, 52);
  optim::SGD opt(std::vector<Tensor>{p}, 0.1);
  opt.param_groups()[0].params.push_back(q);
  EXPECT_TRUE(throws_with([&] { opt.step(); }, {"SGD.step", "from 1 to 2", "new optimizer"}));
}

TEST(OptimizerPreconditions, AGradientOfTheWrongShapeOrDtypeIsNamedAtStep) {
  Tensor p = make_param({3}, DType::f32, 53);
  optim::AdamW opt(std::vector<Tensor>{p}, 0.1);
  p.set_grad(random_tensor({3}, DType::f64));
  EXPECT_TRUE(throws_with([&] { opt.step(); }, {"adamw_step_", "f64[3]", ".to(f32)"}));
  EXPECT_EQ(opt.step_count(0, 0), 0);  // a failed update does not count
}

}  // namespace
