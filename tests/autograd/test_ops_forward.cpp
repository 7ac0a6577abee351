// What the differentiable ops compute and what they record: values against the kernels or a
// hand reference, requires_grad propagation, views, and the dtypes gradients come back in.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/random.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::all_close;
using testing::random_tensor;

Tensor leaf(Tensor t) {
  t.requires_grad_();
  return t;
}

TEST(OpsForward, ValuesMatchKernels) {
  const Tensor a = random_tensor({2, 3}, DType::f32, 1), b = random_tensor({3}, DType::f32, 2);
  EXPECT_TRUE(all_close(a + b, kernels::add(a, b), 0, 0));
  EXPECT_TRUE(all_close(a * b, kernels::mul(a, b), 0, 0));
  EXPECT_TRUE(all_close(2.0 - a, kernels::rsub_scalar(a, 2.0), 0, 0));
  EXPECT_TRUE(all_close(softmax(a, 0), kernels::softmax(a, 0), 0, 0));
  EXPECT_TRUE(all_close(sum(a, 1, true), kernels::sum(a, 1, true), 0, 0));
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  const Tensor c = a + b;
  EXPECT_EQ(c.shape(), Shape({2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(c.to_vector<float>()[i], static_cast<float>(av[i] + bv[i % 3]));
}

TEST(OpsForward, RequiresGradPropagates) {
  const Tensor a = leaf(random_tensor({2, 3}, DType::f32, 3));
  const Tensor b = random_tensor({2, 3}, DType::f32, 4);
  const Tensor c = a * b;
  EXPECT_TRUE(c.requires_grad());
  EXPECT_NE(c.grad_fn(), nullptr);
  EXPECT_EQ(c.grad_fn()->name(), "mul");
  // Without any input requiring grad, nothing is recorded.
  const Tensor d = b * b + 1.0;
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.grad_fn(), nullptr);
  EXPECT_EQ(reshape(b, {3, 2}).grad_fn(), nullptr);
}

TEST(OpsForward, NoGraphUnderNoGradGuard) {
  const Tensor a = leaf(random_tensor({2, 3}, DType::f32, 5));
  NoGradGuard no_grad;
  const Tensor c = exp(a * a);
  EXPECT_FALSE(c.requires_grad());
  EXPECT_EQ(c.grad_fn(), nullptr);
  EXPECT_EQ(linear(a, a).grad_fn(), nullptr);
}

TEST(OpsForward, BackwardAccumulatesIntoLeaves) {
  const Tensor a = leaf(from_vector<float>({1, -2, 3}, {3}));
  sum(a * a).backward();  // d/da Σa² = 2a, from both uses of a
  EXPECT_TRUE(all_close(a.grad(), {2, -4, 6}, 0, 0));
}

TEST(OpsForward, ViewsShareStorage) {
  const Tensor a = leaf(random_tensor({3, 4}, DType::f32, 6));
  EXPECT_EQ(reshape(a, {4, 3}).storage(), a.storage());
  EXPECT_EQ(flatten(a).storage(), a.storage());
  const Tensor row = select(a, 0, 2);
  EXPECT_EQ(row.storage(), a.storage());
  EXPECT_EQ(row.shape(), Shape({4}));
  const std::vector<double> av = a.detach().to_vector<double>();
  EXPECT_TRUE(all_close(row, std::vector<double>(av.begin() + 8, av.end()), 0, 0));
  EXPECT_EQ(narrow(a, 1, 2).storage(), a.storage());
  EXPECT_NE(select(a, 1, 0).storage(), a.storage());  // a column is not contiguous: copied
  // The view carries its own graph node; the input stays a leaf.
  EXPECT_NE(row.grad_fn(), nullptr);
  EXPECT_TRUE(a.is_leaf());
  sum(row).backward();
  std::vector<double> expected(12, 0.0);
  for (int i = 8; i < 12; ++i) expected[i] = 1.0;
  EXPECT_TRUE(all_close(a.grad(), expected, 0, 0));
}

TEST(OpsForward, CastGradientComesBackInInputDtype) {
  // A bf16 parameter computed on in f32: its gradient must be bf16.
  const Tensor p = leaf(from_vector<float>({0.5f, -1.0f, 2.0f}, {3}, DType::bf16));
  const Tensor y = cast(p, DType::f32);
  EXPECT_EQ(y.dtype(), DType::f32);
  sum(y * y).backward();
  ASSERT_TRUE(p.grad().defined());
  EXPECT_EQ(p.grad().dtype(), DType::bf16);
  EXPECT_TRUE(all_close(p.grad(), {1.0, -2.0, 4.0}, 0, 0));
  // An integer cast is a plain conversion: nothing to differentiate.
  EXPECT_FALSE(cast(p, DType::i64).requires_grad());
}

TEST(OpsForward, LinearMatchesF64Reference) {
  const Tensor x = random_tensor({2, 3, 4}, DType::f32, 7), w = random_tensor({5, 4}, DType::f32, 8);
  const Tensor b = random_tensor({5}, DType::f32, 9);
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> expected(6 * 5), expected_nobias(6 * 5);
  for (int r = 0; r < 6; ++r) {
    for (int o = 0; o < 5; ++o) {
      double acc = 0;
      for (int i = 0; i < 4; ++i) acc += xv[r * 4 + i] * wv[o * 4 + i];
      expected_nobias[r * 5 + o] = acc;
      expected[r * 5 + o] = acc + bv[o];
    }
  }
  const Tensor y = linear(x, w, b);
  EXPECT_EQ(y.shape(), Shape({2, 3, 5}));
  EXPECT_TRUE(all_close(y, expected, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(linear(x, w), expected_nobias, 1e-5, 1e-5));
}

TEST(OpsForward, LinearMixedPrecisionGradientDtypes) {
  // bf16 activations against an f32 master weight: each gradient in its own input's dtype.
  const Tensor x = leaf(random_tensor({2, 4}, DType::bf16, 10));
  const Tensor w = leaf(random_tensor({3, 4}, DType::f32, 11)), b = leaf(random_tensor({3}, DType::f32, 12));
  const Tensor y = linear(x, w, b);
  EXPECT_EQ(y.dtype(), DType::bf16);
  sum(cast(y, DType::f32)).backward();
  EXPECT_EQ(x.grad().dtype(), DType::bf16);
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_EQ(b.grad().dtype(), DType::f32);
  EXPECT_TRUE(all_close(b.grad(), {2, 2, 2}, 0, 0));  // Σ over the two rows of ones
}

TEST(OpsForward, ConcatInputWithoutGradGetsNone) {
  const Tensor a = leaf(random_tensor({2, 2}, DType::f32, 13));
  Tensor c = random_tensor({2, 1}, DType::f32, 14);
  sum(concat({a, c}, 1)).backward();
  EXPECT_TRUE(all_close(a.grad(), {1, 1, 1, 1}, 0, 0));
  EXPECT_FALSE(c.grad().defined());
}

TEST(OpsForward, SplitUnusedPiecesGetZeros) {
  const Tensor a = leaf(random_tensor({1, 5}, DType::f32, 15));
  const std::vector<Tensor> parts = split(a, {2, 3}, 1);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].grad_fn(), parts[1].grad_fn());  // one node, two outputs
  sum(parts[1] * 2.0).backward();
  EXPECT_TRUE(all_close(a.grad(), {0, 0, 2, 2, 2}, 0, 0));
}

// A fused node's two outputs against the unfused ops' two: backward from both outputs (or from the
// second alone, when the first gets no gradient) with the same gradients, then every defined input's
// gradient bit for bit, the fused inputs' against the unfused ones'.
void expect_same_input_gradients(const std::vector<Tensor>& fused, const std::vector<Tensor>& unfused,
                                 const std::vector<Tensor>& grads, bool first_has_grad,
                                 const std::vector<Tensor>& fused_inputs, const std::vector<Tensor>& unfused_inputs) {
  if (first_has_grad) {
    autograd::backward(fused, grads);
    autograd::backward(unfused, grads);
  } else {
    autograd::backward({fused[1]}, {grads[1]});
    autograd::backward({unfused[1]}, {grads[1]});
  }
  for (size_t i = 0; i < fused_inputs.size(); ++i) {
    if (!fused_inputs[i].defined()) continue;
    EXPECT_TRUE(testing::same_bits(fused_inputs[i].grad(), unfused_inputs[i].grad())) << "input " << i;
  }
}

// add_layer_norm against x + y and layer_norm(h) recorded separately, in f32: the outputs and every
// input's gradient bit for bit, with gradients flowing into both outputs or into one.
TEST(OpsForward, AddLayerNormEqualsAddThenLayerNorm) {
  using testing::same_bits;
  for (int64_t C : {7, 33, 768}) {
    for (bool affine : {true, false}) {
      for (bool h_has_grad : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "C " << C << (affine ? " affine" : " no affine")
                                          << (h_has_grad ? "" : ", no gradient into h"));
        auto inputs = [&] {
          return std::vector<Tensor>{leaf(random_tensor({3, 4, C}, DType::f32, 30 + C, 2.0)),
                                     leaf(random_tensor({3, 4, C}, DType::f32, 31 + C)),
                                     affine ? leaf(random_tensor({C}, DType::f32, 32 + C)) : Tensor(),
                                     affine ? leaf(random_tensor({C}, DType::f32, 33 + C)) : Tensor()};
        };
        const Tensor dh = random_tensor({3, 4, C}, DType::f32, 34 + C);
        const Tensor dln = random_tensor({3, 4, C}, DType::f32, 35 + C);
        const std::vector<Tensor> f = inputs(), u = inputs();
        const auto [h, ln] = add_layer_norm(f[0], f[1], f[2], f[3]);
        EXPECT_EQ(h.grad_fn(), ln.grad_fn());  // one node, two outputs
        const Tensor h_unfused = u[0] + u[1];
        const Tensor ln_unfused = layer_norm(h_unfused, u[2], u[3]);
        EXPECT_TRUE(same_bits(h, h_unfused));
        EXPECT_TRUE(same_bits(ln, ln_unfused));
        expect_same_input_gradients({h, ln}, {h_unfused, ln_unfused}, {dh, dln}, h_has_grad, f, u);
      }
    }
  }
}

// residual_layer_norm against x used twice (x itself and layer_norm(x)), in f32: the outputs and every
// input's gradient bit for bit (dh + LN-backward summed in one pass is the add's f32 sum), with
// gradients into both outputs or into one; r is x's data under a node of its own.
TEST(OpsForward, ResidualLayerNormEqualsXAndLayerNorm) {
  using testing::same_bits;
  for (int64_t C : {7, 33, 768}) {
    for (bool affine : {true, false}) {
      for (bool r_has_grad : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "C " << C << (affine ? " affine" : " no affine")
                                          << (r_has_grad ? "" : ", no gradient into r"));
        auto inputs = [&] {
          return std::vector<Tensor>{leaf(random_tensor({3, 4, C}, DType::f32, 40 + C, 2.0)),
                                     affine ? leaf(random_tensor({C}, DType::f32, 42 + C)) : Tensor(),
                                     affine ? leaf(random_tensor({C}, DType::f32, 43 + C)) : Tensor()};
        };
        const Tensor dr = random_tensor({3, 4, C}, DType::f32, 44 + C);
        const Tensor dln = random_tensor({3, 4, C}, DType::f32, 45 + C);
        const std::vector<Tensor> f = inputs(), u = inputs();
        const auto [r, ln] = residual_layer_norm(f[0], f[1], f[2]);
        EXPECT_EQ(r.grad_fn(), ln.grad_fn());  // one node, two outputs
        EXPECT_NE(r.grad_fn(), nullptr);
        EXPECT_EQ(r.data_ptr(), f[0].data_ptr());  // x's data, not a copy
        const Tensor ln_unfused = layer_norm(u[0], u[1], u[2]);
        EXPECT_TRUE(same_bits(r, u[0]));
        EXPECT_TRUE(same_bits(ln, ln_unfused));
        expect_same_input_gradients({r, ln}, {u[0], ln_unfused}, {dr, dln}, r_has_grad, f, u);
      }
    }
  }
}

TEST(OpsForward, MaxRoutesToFirstArgmax) {
  const Tensor a = leaf(from_vector<float>({1, 3, 3, 2, 5, 5, 5, 0}, {2, 4}));
  const Tensor m = max(a, 1);
  EXPECT_TRUE(all_close(m, {3, 5}, 0, 0));
  m.backward(from_vector<float>({10, 20}, {2}));
  EXPECT_TRUE(all_close(a.grad(), {0, 10, 0, 0, 20, 0, 0, 0}, 0, 0));
}

TEST(OpsForward, Dropout) {
  const Tensor x = ones({1000}, DType::f32);
  Generator gen(5);
  const Tensor y = dropout(x, 0.25, true, &gen);
  EXPECT_EQ(gen.offset(), 250u);  // the mask's stream was reserved: 1000 values, four per block
  int kept = 0;
  for (float v : y.to_vector<float>()) {
    if (v != 0.0f) {
      ++kept;
      EXPECT_FLOAT_EQ(v, 1.0f / 0.75f);
    }
  }
  EXPECT_NEAR(kept, 750, 60);
  // The next call draws a fresh mask.
  const Tensor y2 = dropout(x, 0.25, true, &gen);
  EXPECT_FALSE(all_close(y2, y, 0, 0));
  // Identity when not training or p == 0: same values, and the gradient passes unchanged.
  const Tensor p = leaf(random_tensor({4}, DType::f32, 16));
  EXPECT_TRUE(all_close(dropout(p, 0.5, false), p, 0, 0));
  sum(dropout(p, 0.0, true, &gen)).backward();
  EXPECT_TRUE(all_close(p.grad(), {1, 1, 1, 1}, 0, 0));
  // The backward mask is the forward mask.
  const Tensor q = leaf(ones({64}, DType::f32));
  Generator g2(9);
  const Tensor z = dropout(q, 0.5, true, &g2);
  sum(z).backward();
  EXPECT_TRUE(all_close(q.grad(), z, 0, 0));
}

TEST(OpsForward, CrossEntropyDtypes) {
  const Tensor logits = leaf(random_tensor({3, 4}, DType::bf16, 17));
  const Tensor loss = cross_entropy(logits, from_vector<int64_t>({1, 0, 3}, {3}));
  EXPECT_EQ(loss.dtype(), DType::f32);
  EXPECT_EQ(loss.shape(), Shape({}));
  loss.backward();
  EXPECT_EQ(logits.grad().dtype(), DType::bf16);
  // Each row's gradient is (softmax - onehot)/N: it sums to zero.
  const std::vector<double> g = logits.grad().to_vector<double>();
  for (int r = 0; r < 3; ++r) EXPECT_NEAR(g[r * 4] + g[r * 4 + 1] + g[r * 4 + 2] + g[r * 4 + 3], 0.0, 1e-2);
}

TEST(OpsForward, AttentionOutputIsAConvexMixOfValues) {
  // With all keys equal, attention averages the values.
  const Tensor q = random_tensor({1, 1, 2, 4}, DType::f64, 18);
  const Tensor kk = zeros({1, 1, 3, 4}, DType::f64);
  const Tensor v = from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {1, 1, 3, 4});
  EXPECT_TRUE(all_close(scaled_dot_product_attention(q, kk, v), {5, 6, 7, 8, 5, 6, 7, 8}, 1e-12, 1e-12));
}

}  // namespace
}  // namespace octet
