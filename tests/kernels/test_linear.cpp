// The Linear kernels (kernels/linear.h) on the CPU: forward against a float64 loop, backward against
// central finite differences of the f64 forward, the wgrad accumulation, and the GELU-fused dgrad.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "kernels/linear.h"
#include "tests/testing.h"

namespace octet {
namespace {

using kernels::LinearActivation;
using testing::all_close;
using testing::random_tensor;

double gelu_tanh(double z) { return 0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z))); }

// y[r, o] = act(Σ_i x[r, i]·W[o, i] + b[o]) in double; also returns the pre-activation.
std::vector<double> reference_forward(const Tensor& x, const Tensor& w, const Tensor& b, LinearActivation act,
                                      std::vector<double>* pre = nullptr) {
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const std::vector<double> bv = b.defined() ? b.to_vector<double>() : std::vector<double>();
  const int64_t out = w.size(0), in = w.size(1), rows = x.numel() / in;
  std::vector<double> y(rows * out), z(rows * out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = bv.empty() ? 0.0 : bv[o];
      for (int64_t i = 0; i < in; ++i) acc += xv[r * in + i] * wv[o * in + i];
      z[r * out + o] = acc;
      y[r * out + o] = act == LinearActivation::GeluTanh ? gelu_tanh(acc) : acc;
    }
  }
  if (pre) *pre = z;
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
  for (LinearActivation act : {LinearActivation::None, LinearActivation::GeluTanh}) {
    for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
      const Tensor x = random_tensor({2, 3, 9}, dtype, 1);
      const Tensor w = random_tensor({7, 9}, dtype, 2, 0.3);
      const Tensor b = random_tensor({7}, dtype, 3);
      std::vector<double> pre;
      const std::vector<double> expected = reference_forward(x, w, b, act, &pre);
      const kernels::LinearForward f = kernels::linear_forward(x, w, b, act);
      EXPECT_EQ(f.y.shape(), (Shape{2, 3, 7}));
      EXPECT_EQ(f.y.dtype(), dtype);
      const auto tol = testing::tolerance_for(dtype);
      EXPECT_TRUE(all_close(f.y, expected, tol.atol, tol.rtol)) << dtype_name(dtype);
      if (act == LinearActivation::GeluTanh) {
        ASSERT_TRUE(f.pre_activation.defined());
        EXPECT_TRUE(all_close(f.pre_activation, pre, tol.atol, tol.rtol));
      } else {
        EXPECT_FALSE(f.pre_activation.defined());
      }
    }
  }
}

TEST(Linear, ForwardWithoutBiasAndOneDimensionalInput) {
  const Tensor x = random_tensor({5}, DType::f64, 4);
  const Tensor w = random_tensor({3, 5}, DType::f64, 5);
  const kernels::LinearForward f = kernels::linear_forward(x, w, Tensor());
  EXPECT_EQ(f.y.shape(), (Shape{3}));
  EXPECT_TRUE(all_close(f.y, reference_forward(x, w, Tensor(), LinearActivation::None), 1e-12, 1e-12));
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  for (LinearActivation act : {LinearActivation::None, LinearActivation::GeluTanh}) {
    const Tensor x = random_tensor({2, 3, 4}, DType::f64, 11);
    const Tensor w = random_tensor({5, 4}, DType::f64, 12, 0.5);
    const Tensor b = random_tensor({5}, DType::f64, 13);
    const Tensor dy = random_tensor({2, 3, 5}, DType::f64, 14);
    const auto loss = [&] { return probe_loss(kernels::linear_forward(x, w, b, act).y, dy); };
    const kernels::LinearForward f = kernels::linear_forward(x, w, b, act);
    const kernels::LinearGrads g =
        kernels::linear_backward(dy, x, w, f.pre_activation, act, /*need_dx=*/true, true, true);
    EXPECT_EQ(g.dx.shape(), x.shape());
    EXPECT_EQ(g.dweight.shape(), w.shape());
    EXPECT_EQ(g.dbias.shape(), b.shape());
    EXPECT_TRUE(all_close(g.dx, numeric_gradient(x, loss), 1e-7, 1e-6));
    EXPECT_TRUE(all_close(g.dweight, numeric_gradient(w, loss), 1e-7, 1e-6));
    EXPECT_TRUE(all_close(g.dbias, numeric_gradient(b, loss), 1e-7, 1e-6));
  }
}

TEST(Linear, BackwardComputesOnlyWhatIsAskedFor) {
  const Tensor x = random_tensor({6, 4}, DType::f32, 21);
  const Tensor w = random_tensor({3, 4}, DType::f32, 22);
  const Tensor dy = random_tensor({6, 3}, DType::f32, 23);
  const kernels::LinearGrads g =
      kernels::linear_backward(dy, x, w, Tensor(), LinearActivation::None, false, false, true);
  EXPECT_FALSE(g.dx.defined());
  EXPECT_FALSE(g.dweight.defined());
  ASSERT_TRUE(g.dbias.defined());
  const std::vector<double> dyv = dy.to_vector<double>();
  std::vector<double> expected(3, 0.0);
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t o = 0; o < 3; ++o) expected[o] += dyv[r * 3 + o];
  EXPECT_TRUE(all_close(g.dbias, expected, 1e-5, 1e-5));
}

TEST(Linear, WgradAccumulatesIntoTheGivenGradient) {
  const Tensor x = random_tensor({2, 5, 6}, DType::bf16, 31);
  const Tensor w = random_tensor({4, 6}, DType::bf16, 32);
  const Tensor dy = random_tensor({2, 5, 4}, DType::bf16, 33);
  const Tensor master_grad = random_tensor({4, 6}, DType::f32, 34);
  const std::vector<double> before = master_grad.to_vector<double>();
  const kernels::LinearGrads fresh = kernels::linear_backward(dy, x, w, Tensor(), LinearActivation::None, false, true, true);
  const kernels::LinearGrads acc =
      kernels::linear_backward(dy, x, w, Tensor(), LinearActivation::None, false, true, true, master_grad);
  EXPECT_EQ(fresh.dweight.dtype(), DType::bf16);
  EXPECT_EQ(acc.dweight.dtype(), DType::f32);
  EXPECT_EQ(acc.dbias.dtype(), DType::f32);
  EXPECT_EQ(acc.dweight.data_ptr(), master_grad.data_ptr());
  // dW = dyᵀ·x in double, added to what master_grad held.
  const std::vector<double> xv = x.to_vector<double>(), dyv = dy.to_vector<double>();
  std::vector<double> expected = before;
  for (int64_t o = 0; o < 4; ++o)
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t r = 0; r < 10; ++r) expected[o * 6 + i] += dyv[r * 4 + o] * xv[r * 6 + i];
  EXPECT_TRUE(all_close(master_grad, expected, 1e-5, 1e-5));
}

TEST(Linear, GeluDgradMatchesFiniteDifferences) {
  // The layer's input is gelu_tanh(pre), so its dgrad through GELU is the gradient of pre.
  const Tensor pre = random_tensor({2, 3, 8}, DType::f64, 41);
  const Tensor w = random_tensor({5, 8}, DType::f64, 42, 0.5);
  const Tensor b = random_tensor({5}, DType::f64, 43);
  const Tensor dz = random_tensor({2, 3, 5}, DType::f64, 44);
  const auto loss = [&] {
    std::vector<double> h = pre.to_vector<double>();
    for (double& v : h) v = gelu_tanh(v);
    return probe_loss(kernels::linear_forward(from_vector(h, pre.shape(), DType::f64, Device::cpu()), w, b).y, dz);
  };
  const kernels::GeluDgrad g = kernels::linear_dgrad_gelu(dz, w, pre, /*need_dbias=*/true);
  EXPECT_EQ(g.d_pre_activation.shape(), pre.shape());
  const std::vector<double> expected = numeric_gradient(pre, loss);
  EXPECT_TRUE(all_close(g.d_pre_activation, expected, 1e-7, 1e-6));
  std::vector<double> expected_dbias(8, 0.0);
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t i = 0; i < 8; ++i) expected_dbias[i] += expected[r * 8 + i];
  EXPECT_TRUE(all_close(g.dbias, expected_dbias, 1e-7, 1e-6));
  EXPECT_FALSE(kernels::linear_dgrad_gelu(dz, w, pre, false).dbias.defined());
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
  EXPECT_TRUE(testing::throws_with(
      [&] { kernels::linear_backward(bad_dy, x, w_ok, Tensor(), LinearActivation::None, true, true, true); },
      {"linear_backward", "dy"}));
  const Tensor dy = random_tensor({4, 3}, DType::f32, 56);
  EXPECT_TRUE(testing::throws_with(
      [&] { kernels::linear_backward(dy, x, w_ok, Tensor(), LinearActivation::GeluTanh, true, true, true); },
      {"linear_backward", "pre_activation"}));
}

}  // namespace
}  // namespace octet
