// The Linear kernels (kernels/linear.h) on the CPU: forward against a float64 loop, backward against
// central finite differences of the f64 forward; the Linear-with-GELU pair against the same loop and
// differences, and against the composition they stand for on the CPU.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/linear.h"
#include "kernels/nn_ops.h"
#include "kernels/reduce.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::all_close;
using testing::random_tensor;

// y[r, o] = Σ_i x[r, i]·W[o, i] + b[o] in double.
std::vector<double> reference_forward(const Tensor& x, const Tensor& w, const Tensor& b) {
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const std::vector<double> bv = b.defined() ? b.to_vector<double>() : std::vector<double>();
  const int64_t out = w.size(0), in = w.size(1), rows = x.numel() / in;
  std::vector<double> y(rows * out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = bv.empty() ? 0.0 : bv[o];
      for (int64_t i = 0; i < in; ++i) acc += xv[r * in + i] * wv[o * in + i];
      y[r * out + o] = acc;
    }
  }
  return y;
}

// Σ y ⊙ probe, the scalar whose gradient linear_backward returns when dy = probe.
double probe_loss(const Tensor& y, const Tensor& probe) {
  const std::vector<double> yv = y.to_vector<double>(), pv = probe.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < yv.size(); ++i) s += yv[i] * pv[i];
  return s;
}

// Central differences of loss() over every element of t (f64, perturbed in place).
std::vector<double> numeric_gradient(const Tensor& t, const std::function<double()>& loss, double h = 1e-6) {
  double* p = t.data<double>();
  std::vector<double> g(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double saved = p[i];
    p[i] = saved + h;
    const double up = loss();
    p[i] = saved - h;
    const double down = loss();
    p[i] = saved;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

TEST(Linear, ForwardMatchesFloat64Reference) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    const Tensor x = random_tensor({2, 3, 9}, dtype, 1);
    const Tensor w = random_tensor({7, 9}, dtype, 2, 0.3);
    const Tensor b = random_tensor({7}, dtype, 3);
    const std::vector<double> expected = reference_forward(x, w, b);
    const Tensor y = kernels::linear_forward(x, w, b);
    EXPECT_EQ(y.shape(), (Shape{2, 3, 7}));
    EXPECT_EQ(y.dtype(), dtype);
    const auto tol = testing::tolerance_for(dtype);
    EXPECT_TRUE(all_close(y, expected, tol.atol, tol.rtol)) << dtype_name(dtype);
  }
}

TEST(Linear, ForwardWithoutBiasAndOneDimensionalInput) {
  const Tensor x = random_tensor({5}, DType::f64, 4);
  const Tensor w = random_tensor({3, 5}, DType::f64, 5);
  const Tensor y = kernels::linear_forward(x, w, Tensor());
  EXPECT_EQ(y.shape(), (Shape{3}));
  EXPECT_TRUE(all_close(y, reference_forward(x, w, Tensor()), 1e-12, 1e-12));
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  const Tensor x = random_tensor({2, 3, 4}, DType::f64, 11);
  const Tensor w = random_tensor({5, 4}, DType::f64, 12, 0.5);
  const Tensor b = random_tensor({5}, DType::f64, 13);
  const Tensor dy = random_tensor({2, 3, 5}, DType::f64, 14);
  const auto loss = [&] { return probe_loss(kernels::linear_forward(x, w, b), dy); };
  const kernels::LinearGrads g = kernels::linear_backward(dy, x, w, /*need_dx=*/true, true, true);
  EXPECT_EQ(g.dx.shape(), x.shape());
  EXPECT_EQ(g.dweight.shape(), w.shape());
  EXPECT_EQ(g.dbias.shape(), b.shape());
  EXPECT_TRUE(all_close(g.dx, numeric_gradient(x, loss), 1e-7, 1e-6));
  EXPECT_TRUE(all_close(g.dweight, numeric_gradient(w, loss), 1e-7, 1e-6));
  EXPECT_TRUE(all_close(g.dbias, numeric_gradient(b, loss), 1e-7, 1e-6));
}

TEST(Linear, BackwardComputesOnlyWhatIsAskedFor) {
  const Tensor x = random_tensor({6, 4}, DType::f32, 21);
  const Tensor w = random_tensor({3, 4}, DType::f32, 22);
  const Tensor dy = random_tensor({6, 3}, DType::f32, 23);
  const kernels::LinearGrads g = kernels::linear_backward(dy, x, w, false, false, true);
  EXPECT_FALSE(g.dx.defined());
  EXPECT_FALSE(g.dweight.defined());
  ASSERT_TRUE(g.dbias.defined());
  const std::vector<double> dyv = dy.to_vector<double>();
  std::vector<double> expected(3, 0.0);
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t o = 0; o < 3; ++o) expected[o] += dyv[r * 3 + o];
  EXPECT_TRUE(all_close(g.dbias, expected, 1e-5, 1e-5));
}

// A bf16 or f16 dy on the CPU is widened once for whichever of the two GEMMs and the bias sum run:
// the same bits as each of them on dy itself, for every subset asked for (1500 rows: the weight
// gradient's K takes more than one pass of the tile kernels), with weights of dy's dtype or f32
// (whose bias gradient is dy's sum rounded to dy's dtype, then widened).
TEST(Linear, HalfPrecisionBackwardOnTheCpuIsTheSeparateCallsBitForBit) {
  const std::vector<std::pair<DType, DType>> dtypes = {
      {DType::bf16, DType::bf16}, {DType::bf16, DType::f32}, {DType::f16, DType::f16}, {DType::f16, DType::f32}};
  for (const auto& [d, wd] : dtypes) {
    const Tensor x = random_tensor({3, 500, 40}, d, 71), w = random_tensor({24, 40}, wd, 72, 0.3);
    const Tensor dy = random_tensor({3, 500, 24}, d, 73);
    const Tensor x2 = x.reshape({1500, 40}), dy2 = dy.reshape({1500, 24});
    Tensor dx = empty({1500, 40}, d), dw = empty({24, 40}, wd);
    kernels::gemm(dy2, false, w, false, dx);
    kernels::gemm(dy2, true, x2, false, dw);
    const Tensor db = kernels::sum(dy2, 0).to(wd);
    for (int mask = 1; mask < 8; ++mask) {
      const bool need_dx = mask & 1, need_dw = mask & 2, need_db = mask & 4;
      SCOPED_TRACE(::testing::Message() << dtype_name(d) << ", weight " << dtype_name(wd) << ", dx " << need_dx
                                        << " dweight " << need_dw << " dbias " << need_db);
      const kernels::LinearGrads g = kernels::linear_backward(dy, x, w, need_dx, need_dw, need_db);
      EXPECT_EQ(g.dx.defined(), need_dx);
      EXPECT_EQ(g.dweight.defined(), need_dw);
      EXPECT_EQ(g.dbias.defined(), need_db);
      if (need_dx) {
        EXPECT_TRUE(testing::same_bits(g.dx, dx.reshape(x.shape())));
      }
      if (need_dw) {
        EXPECT_TRUE(testing::same_bits(g.dweight, dw));
      }
      if (need_db) {
        EXPECT_TRUE(testing::same_bits(g.dbias, db));
      }
    }
  }
}

// The GPU's bias-gradient design switch (kernels/linear.h): the column sum unless set, and the CPU's
// one way (kernels::sum) whatever it says. Both designs run on a GPU only:
// tests/cuda/test_cuda_linear.cpp (CudaLinear.BothBiasGradDesignsSumDyOnceRounded).
TEST(Linear, BiasGradDesignIsTheColumnSumUnlessSetAndLeavesTheCpuAlone) {
  using kernels::LinearBiasGradDesign;
  EXPECT_EQ(kernels::linear_bias_grad_design(), LinearBiasGradDesign::kColumnSum);
  const Tensor x = random_tensor({3, 7, 12}, DType::bf16, 61), w = random_tensor({16, 12}, DType::bf16, 62);
  const Tensor dy = random_tensor({3, 7, 16}, DType::bf16, 63);
  const kernels::LinearGrads columns = kernels::linear_backward(dy, x, w, true, true, true);
  kernels::set_linear_bias_grad_design(LinearBiasGradDesign::kEpilogue);
  EXPECT_EQ(kernels::linear_bias_grad_design(), LinearBiasGradDesign::kEpilogue);
  const kernels::LinearGrads epilogue = kernels::linear_backward(dy, x, w, true, true, true);
  kernels::set_linear_bias_grad_design(LinearBiasGradDesign::kColumnSum);
  EXPECT_EQ(kernels::linear_bias_grad_design(), LinearBiasGradDesign::kColumnSum);
  EXPECT_TRUE(testing::same_bits(columns.dx, epilogue.dx));
  EXPECT_TRUE(testing::same_bits(columns.dweight, epilogue.dweight));
  EXPECT_TRUE(testing::same_bits(columns.dbias, epilogue.dbias));
  EXPECT_TRUE(testing::same_bits(columns.dbias, kernels::sum(dy.reshape({-1, 16}), 0)));
}

TEST(Linear, ShapeErrorsNameTheTensors) {
  const Tensor x = random_tensor({4, 6}, DType::f32, 51);
  const Tensor w = random_tensor({3, 5}, DType::f32, 52);
  EXPECT_TRUE(testing::throws_with([&] { kernels::linear_forward(x, w, Tensor()); },
                                   {"linear_forward", "f32[4, 6]", "f32[3, 5]"}));
  const Tensor w_ok = random_tensor({3, 6}, DType::f32, 53);
  const Tensor bad_bias = random_tensor({4}, DType::f32, 54);
  EXPECT_TRUE(testing::throws_with([&] { kernels::linear_forward(x, w_ok, bad_bias); }, {"linear_forward", "bias"}));
  const Tensor bad_dy = random_tensor({4, 2}, DType::f32, 55);
  EXPECT_TRUE(testing::throws_with([&] { kernels::linear_backward(bad_dy, x, w_ok, true, true, true); },
                                   {"linear_backward", "dy"}));
}

// With a residual, on the CPU (3-D x): in f32, and without a bias, add(linear_forward(x, w, b),
// residual) bit for bit; in bf16 and f16 with a bias, as the GPU's epilogue, the product accumulated
// in f32 onto residual + b summed in f32, then rounded once. A residual of the wrong shape or dtype is
// named.
TEST(Linear, ForwardWithAResidualIsTheLinearThenTheAdd) {
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(d)) + (with_bias ? " with bias" : " no bias"));
      const Tensor x = random_tensor({2, 3, 6}, d, 61), w = random_tensor({5, 6}, d, 62, 0.3);
      const Tensor b = with_bias ? random_tensor({5}, d, 63) : Tensor(), r = random_tensor({2, 3, 5}, d, 64, 2.0);
      const Tensor got = kernels::linear_forward(x, w, b, r);
      if (d == DType::f32 || !with_bias) {
        EXPECT_TRUE(testing::same_bits(got, kernels::add(kernels::linear_forward(x, w, b), r)));
      } else {
        Tensor c = kernels::add(r.reshape({6, 5}).to(DType::f32),
                                kernels::broadcast_to(b.to(DType::f32), {6, 5}));
        kernels::gemm(x.reshape({6, 6}), false, w, true, c, 1.0, 1.0);
        EXPECT_TRUE(testing::same_bits(got, c.to(d).reshape({2, 3, 5})));
      }
    }
  }
  const Tensor x = random_tensor({4, 6}, DType::f32, 65), w = random_tensor({3, 6}, DType::f32, 66);
  EXPECT_TRUE(testing::throws_with([&] { kernels::linear_forward(x, w, Tensor(), random_tensor({4, 2})); },
                                   {"linear_forward", "residual", "[4, 3]"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { kernels::linear_forward(x, w, Tensor(), random_tensor({4, 3}, DType::bf16)); },
      {"linear_forward", "residual", "f32"}));
}

// The same against float64, as tests/cuda/test_cuda_linear.cpp holds the GPU's epilogue: with
// u = 2^-8 (bf16) or 2^-11 (f16) and A = Σ_k |x_k·w_k|, the f32 accumulation of K products in any
// order is within e = K·2^-24·A of exact, and the sums of residual, bias and product add a few f32
// roundings more, 3·2^-24·(|r| + |b| + A) at most; one rounding to y's dtype then adds u·(|exact| + e).
// Two roundings (y, then the sum) break that bound where y and the residual nearly cancel: the
// first rounding's error, up to u·|y|, is then large against u·|exact|.
TEST(Linear, ResidualWithABiasIsRoundedOnceInLowPrecision) {
  for (DType d : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(d));
    const Tensor x = random_tensor({2, 197, 768}, d, 71), w = random_tensor({192, 768}, d, 72, 0.06);
    const Tensor b = random_tensor({192}, d, 73), r = random_tensor({2, 197, 192}, d, 74, 2.0);
    const std::vector<double> g = kernels::linear_forward(x, w, b, r).to_vector<double>();
    const std::vector<double> y = reference_forward(x, w, b), rv = r.to_vector<double>(), bv = b.to_vector<double>();
    const std::vector<double> mag = reference_forward(kernels::abs(x.to(DType::f64)), kernels::abs(w.to(DType::f64)),
                                                      Tensor());
    const double u = d == DType::bf16 ? 0x1p-8 : 0x1p-11, K = 768.0;
    int64_t outside = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const double exact = y[i] + rv[i];
      const double e = K * 0x1p-24 * mag[i] + 3 * 0x1p-24 * (std::fabs(rv[i]) + std::fabs(bv[i % 192]) + mag[i]);
      if (std::fabs(g[i] - exact) > e + u * (std::fabs(exact) + e)) ++outside;
    }
    EXPECT_EQ(outside, 0) << "of " << g.size();
  }
}

// linear_gelu_forward: pre is the Linear's output (the f64 loop), act the GELU of it; on the CPU both
// are bit for bit linear_forward then gelu_forward, in f32 and bf16, under both forms.
TEST(Linear, GeluForwardIsTheLinearThenTheGelu) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (auto form : {kernels::GeluApproximation::None, kernels::GeluApproximation::Tanh}) {
      const Tensor x = random_tensor({2, 3, 6}, dtype, 61, 2.0), w = random_tensor({8, 6}, dtype, 62),
                   b = random_tensor({8}, dtype, 63);
      const kernels::LinearGeluOutput r = kernels::linear_gelu_forward(x, w, b, form);
      ASSERT_EQ(r.pre.shape(), Shape({2, 3, 8}));
      const Tensor pre = kernels::linear_forward(x, w, b);
      EXPECT_TRUE(testing::same_bits(r.pre, pre));
      EXPECT_TRUE(testing::same_bits(r.act, kernels::gelu_forward(pre, form)));
      if (dtype == DType::f32) {
        EXPECT_TRUE(all_close(r.pre, reference_forward(x, w, b), 1e-5, 1e-5));
      }
    }
  }
}

// linear_dgelu_backward: dpre is the gradient of Σ probe ⊙ (gelu(pre)·Wᵀ) with respect to pre, by
// central differences in f64; it is linear_backward's dgrad then gelu_backward bit for bit.
TEST(Linear, DgeluBackwardIsTheDgradThroughTheGelu) {
  for (auto form : {kernels::GeluApproximation::None, kernels::GeluApproximation::Tanh}) {
    const Tensor pre = random_tensor({5, 6}, DType::f64, 71, 2.0), w = random_tensor({4, 6}, DType::f64, 72),
                 probe = random_tensor({5, 4}, DType::f64, 73);
    const Tensor dpre = kernels::linear_dgelu_backward(probe, pre, w, form);
    const std::vector<double> numeric = numeric_gradient(pre, [&] {
      return probe_loss(kernels::linear_forward(kernels::gelu_forward(pre, form), w, Tensor()), probe);
    });
    EXPECT_TRUE(all_close(dpre, numeric, 1e-6, 1e-6));
    const Tensor pre32 = pre.to(DType::f32), w32 = w.to(DType::f32), probe32 = probe.to(DType::f32);
    const Tensor dact = kernels::linear_backward(probe32, pre32, w32, true, false, false).dx;
    EXPECT_TRUE(testing::same_bits(kernels::linear_dgelu_backward(probe32, pre32, w32, form),
                                   kernels::gelu_backward(dact, pre32, form)));
  }
  const Tensor pre = random_tensor({5, 6}, DType::f32, 74), w = random_tensor({4, 6}, DType::f32, 75);
  EXPECT_TRUE(testing::throws_with(
      [&] { kernels::linear_dgelu_backward(random_tensor({5, 3}), pre, w, kernels::GeluApproximation::Tanh); },
      {"linear_dgelu_backward", "dy", "f32[5, 3]"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { kernels::linear_gelu_forward(pre, random_tensor({4, 5}), Tensor(), kernels::GeluApproximation::Tanh); },
      {"linear_gelu_forward", "f32[4, 5]"}));
}

}  // namespace
}  // namespace octet
