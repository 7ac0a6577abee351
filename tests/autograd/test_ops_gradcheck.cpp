// Every differentiable function in autograd/ops.h against central finite differences, in f64.
#include <gtest/gtest.h>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "core/random.h"
#include "tests/testing.h"

namespace octet {
namespace {

using autograd::gradcheck;
using autograd::GradcheckOptions;
using Inputs = std::vector<Tensor>;
using octet::testing::random_tensor;
using octet::testing::uniform_tensor;

#define EXPECT_GRADCHECK(...)                       \
  do {                                              \
    const auto result_ = gradcheck(__VA_ARGS__);    \
    EXPECT_TRUE(result_) << result_.message;        \
  } while (0)

Tensor leaf(Tensor t) {
  t.requires_grad_();
  return t;
}
// Standard normal f64 leaf.
Tensor param(const Shape& shape, uint64_t seed) { return leaf(random_tensor(shape, DType::f64, seed)); }
// Uniform in [0.5, 2): the domain of log, sqrt, rsqrt, pow and divisors.
Tensor positive(const Shape& shape, uint64_t seed) { return leaf(uniform_tensor(shape, 0.5, 2.0, DType::f64, seed)); }

// ---- arithmetic ---------------------------------------------------------------------------------------

// b's shapes against a [2, 3, 4]: equal, trailing, middle-with-1, and a scalar.
const std::vector<Shape> kBroadcastShapes = {{2, 3, 4}, {4}, {3, 1}, {}};

TEST(OpsGradcheck, AddSubMulBroadcast) {
  for (const Shape& sb : kBroadcastShapes) {
    SCOPED_TRACE(::testing::Message() << "b " << sb);
    const Tensor a = param({2, 3, 4}, 1), b = param(sb, 2);
    EXPECT_GRADCHECK([](const Inputs& x) { return add(x[0], x[1]); }, {a, b});
    EXPECT_GRADCHECK([](const Inputs& x) { return add(x[1], x[0]); }, {a, b});  // broadcast on the left
    EXPECT_GRADCHECK([](const Inputs& x) { return sub(x[0], x[1]); }, {a, b});
    EXPECT_GRADCHECK([](const Inputs& x) { return sub(x[1], x[0]); }, {a, b});
    EXPECT_GRADCHECK([](const Inputs& x) { return mul(x[0], x[1]); }, {a, b});
  }
}

TEST(OpsGradcheck, DivPowBroadcast) {
  for (const Shape& sb : kBroadcastShapes) {
    SCOPED_TRACE(::testing::Message() << "b " << sb);
    const Tensor a = param({2, 3, 4}, 3), b = positive(sb, 4), pa = positive({2, 3, 4}, 5), e = param(sb, 6);
    EXPECT_GRADCHECK([](const Inputs& x) { return div(x[0], x[1]); }, {a, b});
    EXPECT_GRADCHECK([](const Inputs& x) { return div(x[1], x[0]); }, {pa, b});
    EXPECT_GRADCHECK([](const Inputs& x) { return pow(x[0], x[1]); }, {pa, e});
  }
}

TEST(OpsGradcheck, OnlyOneOperandRequiresGrad) {
  const Tensor a = param({2, 3}, 7);
  const Tensor b = uniform_tensor({3}, 0.5, 2.0, DType::f64, 8);  // a constant
  EXPECT_GRADCHECK([](const Inputs& x) { return mul(x[0], x[1]); }, {a, b});
  EXPECT_GRADCHECK([](const Inputs& x) { return div(x[1], x[0]); }, {positive({2, 3}, 9), b});
  EXPECT_GRADCHECK([](const Inputs& x) { return pow(x[1], x[0]); }, {a, b});
}

TEST(OpsGradcheck, ScalarOps) {
  const Tensor a = param({3, 4}, 10), p = positive({3, 4}, 11);
  EXPECT_GRADCHECK([](const Inputs& x) { return add(x[0], 1.5); }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return mul(x[0], -2.5); }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return pow(x[0], 2.5); }, {p});
  EXPECT_GRADCHECK([](const Inputs& x) { return pow(x[0], -0.5); }, {p});
  EXPECT_GRADCHECK([](const Inputs& x) { return pow(x[0], 3.0); }, {a});  // negative bases, integer exponent
}

TEST(OpsGradcheck, UnaryOps) {
  const Tensor a = param({3, 4}, 12), p = positive({3, 4}, 13);
  EXPECT_GRADCHECK([](const Inputs& x) { return neg(x[0]); }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return exp(x[0]); }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return log(x[0]); }, {p});
  EXPECT_GRADCHECK([](const Inputs& x) { return tanh(x[0]); }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return sqrt(x[0]); }, {p});
  EXPECT_GRADCHECK([](const Inputs& x) { return rsqrt(x[0]); }, {p});
}

TEST(OpsGradcheck, Operators) {
  const Tensor a = param({2, 3}, 14), b = param({3}, 15), p = positive({2, 3}, 16), q = positive({3}, 17);
  EXPECT_GRADCHECK([](const Inputs& x) { return x[0] + x[1]; }, {a, b});
  EXPECT_GRADCHECK([](const Inputs& x) { return x[0] - x[1]; }, {a, b});
  EXPECT_GRADCHECK([](const Inputs& x) { return x[0] * x[1]; }, {a, b});
  EXPECT_GRADCHECK([](const Inputs& x) { return x[0] / x[1]; }, {a, q});
  EXPECT_GRADCHECK([](const Inputs& x) { return -x[0]; }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return x[0] + 2.0; }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return 2.0 + x[0]; }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return x[0] - 2.0; }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return 2.0 - x[0]; }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return x[0] * 3.0; }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return 3.0 * x[0]; }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return x[0] / 3.0; }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return 3.0 / x[0]; }, {p});
}

TEST(OpsGradcheck, SharedInputAndChains) {
  const Tensor a = param({2, 3}, 18), b = param({3}, 19);
  // a reaches the output along several paths; the engine must sum them.
  EXPECT_GRADCHECK([](const Inputs& x) { return tanh(x[0] * x[0] + x[1]) * x[0] - exp(x[1]); }, {a, b});
}

// ---- reductions and softmax -------------------------------------------------------------------------

TEST(OpsGradcheck, SumMean) {
  const Tensor a = param({2, 3, 4}, 20);
  EXPECT_GRADCHECK([](const Inputs& x) { return sum(x[0]); }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return mean(x[0]); }, {a});
  for (int64_t dim : {0, 1, 2, -1}) {
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "dim " << dim << " keepdim " << keepdim);
      EXPECT_GRADCHECK([=](const Inputs& x) { return sum(x[0], dim, keepdim); }, {a});
      EXPECT_GRADCHECK([=](const Inputs& x) { return mean(x[0], dim, keepdim); }, {a});
    }
  }
}

TEST(OpsGradcheck, Max) {
  // Normal samples are distinct, and far further apart than eps, so the argmax is stable.
  const Tensor a = param({3, 4, 2}, 21);
  for (int64_t dim : {0, 1, -1}) {
    for (bool keepdim : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "dim " << dim << " keepdim " << keepdim);
      EXPECT_GRADCHECK([=](const Inputs& x) { return max(x[0], dim, keepdim); }, {a});
    }
  }
}

TEST(OpsGradcheck, SoftmaxLogSoftmax) {
  const Tensor a = param({3, 5}, 22), b = param({2, 3, 4}, 23);
  for (int64_t dim : {0, -1}) {
    SCOPED_TRACE(::testing::Message() << "dim " << dim);
    EXPECT_GRADCHECK([=](const Inputs& x) { return softmax(x[0], dim); }, {a});
    EXPECT_GRADCHECK([=](const Inputs& x) { return log_softmax(x[0], dim); }, {a});
    EXPECT_GRADCHECK([=](const Inputs& x) { return softmax(x[0], dim); }, {b});
    EXPECT_GRADCHECK([=](const Inputs& x) { return log_softmax(x[0], dim); }, {b});
  }
  EXPECT_GRADCHECK([](const Inputs& x) { return softmax(x[0], 1); }, {b});  // a middle dim
}

// ---- shape ops ------------------------------------------------------------------------------------------

TEST(OpsGradcheck, ReshapeFlatten) {
  const Tensor a = param({2, 3, 4}, 30);
  // The views are multiplied afterwards so a wrong gradient layout shows up as wrong values.
  const Tensor w = random_tensor({6, 4}, DType::f64, 31);
  EXPECT_GRADCHECK([w](const Inputs& x) { return reshape(x[0], {6, 4}) * w; }, {a});
  EXPECT_GRADCHECK([w](const Inputs& x) { return reshape(x[0], {-1, 4}) * w; }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return flatten(x[0]); }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return flatten(x[0], 1); }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return flatten(x[0], -1); }, {a});
}

TEST(OpsGradcheck, PermuteTranspose) {
  const Tensor a = param({2, 3, 4}, 32);
  EXPECT_GRADCHECK([](const Inputs& x) { return permute(x[0], {2, 0, 1}); }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return permute(x[0], {1, -1, 0}); }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return transpose(x[0]); }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return transpose(x[0]) * 2.0; }, {param({3, 5}, 33)});
}

TEST(OpsGradcheck, SliceNarrowSelect) {
  const Tensor a = param({3, 4, 2}, 34);
  EXPECT_GRADCHECK([](const Inputs& x) { return slice(x[0], 0, 1, 2); }, {a});   // a view
  EXPECT_GRADCHECK([](const Inputs& x) { return slice(x[0], 1, 1, 2); }, {a});   // a copy
  EXPECT_GRADCHECK([](const Inputs& x) { return slice(x[0], -1, 1, 1); }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return narrow(x[0], 2, 1); }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return select(x[0], 0, 1); }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return select(x[0], 1, 3); }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return select(x[0], -1, 0); }, {a});
  // [1, 5, 3]: dim 1 has only unit dims before it, so the slice is a view too.
  EXPECT_GRADCHECK([](const Inputs& x) { return select(x[0], 1, 0) * slice(x[0], 1, 2, 1); }, {param({1, 5, 3}, 35)});
}

TEST(OpsGradcheck, ConcatSplit) {
  const Tensor a = param({2, 3}, 36), b = param({2, 1}, 37), c = random_tensor({2, 2}, DType::f64, 38);
  EXPECT_GRADCHECK([](const Inputs& x) { return concat({x[0], x[1], x[2]}, 1); }, {a, b, c});
  EXPECT_GRADCHECK([](const Inputs& x) { return concat({x[0], x[0]}, 0); }, {a});
  const Tensor s = param({2, 6}, 39);
  EXPECT_GRADCHECK([](const Inputs& x) { return split(x[0], {1, 3, 2}, 1); }, {s});
  EXPECT_GRADCHECK([](const Inputs& x) { return split(x[0], {1, 1}, 0); }, {s});
  // Only the last piece is used: the others must get zeros from the engine.
  EXPECT_GRADCHECK([](const Inputs& x) { return split(x[0], {4, 2}, -1)[1]; }, {s});
}

TEST(OpsGradcheck, BroadcastTo) {
  EXPECT_GRADCHECK([](const Inputs& x) { return broadcast_to(x[0], {3, 2, 4}); }, {param({1, 1, 4}, 40)});
  EXPECT_GRADCHECK([](const Inputs& x) { return broadcast_to(x[0], {2, 3, 4}); }, {param({3, 1}, 41)});
  EXPECT_GRADCHECK([](const Inputs& x) { return broadcast_to(x[0], {2, 3}); }, {param({}, 42)});
}

TEST(OpsGradcheck, IndexSelect) {
  const Tensor a = param({4, 3}, 43);
  const Tensor idx = from_vector<int64_t>({2, 0, 2, 3}, {4});  // a repeated row accumulates
  EXPECT_GRADCHECK([idx](const Inputs& x) { return index_select(x[0], 0, idx); }, {a});
  const Tensor idx32 = from_vector<int32_t>({1, 1}, {2});
  EXPECT_GRADCHECK([idx32](const Inputs& x) { return index_select(x[0], -1, idx32); }, {a});
}

TEST(OpsGradcheck, Patchify) {
  EXPECT_GRADCHECK([](const Inputs& x) { return patchify(x[0], 2); }, {param({1, 2, 4, 4}, 44)});
  EXPECT_GRADCHECK([](const Inputs& x) { return patchify(x[0], 3); }, {param({2, 1, 3, 6}, 45)});
}

TEST(OpsGradcheck, CastToDeviceClone) {
  const Tensor a = param({2, 3}, 46);
  EXPECT_GRADCHECK([](const Inputs& x) { return cast(x[0], DType::f64) * 2.0; }, {a});
  // Through f32 the function is a staircase of f32 steps; a wider eps sees through them.
  GradcheckOptions coarse;
  coarse.eps = 1e-3;
  coarse.atol = 1e-3;
  coarse.rtol = 1e-3;
  EXPECT_GRADCHECK([](const Inputs& x) { return cast(cast(x[0], DType::f32) * 3.0, DType::f64); }, {a}, coarse);
  EXPECT_GRADCHECK([](const Inputs& x) { return to_device(x[0], Device::cpu()); }, {a});
  EXPECT_GRADCHECK([](const Inputs& x) { return clone(x[0]) * x[0]; }, {a});
}

// ---- linear algebra ---------------------------------------------------------------------------------------

TEST(OpsGradcheck, MatmulTransposeCombos) {
  // op(a) is [3, 4] and op(b) is [4, 2] in every combination.
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "trans_a " << ta << " trans_b " << tb);
      const Tensor a = param(ta ? Shape{4, 3} : Shape{3, 4}, 50), b = param(tb ? Shape{2, 4} : Shape{4, 2}, 51);
      EXPECT_GRADCHECK([=](const Inputs& x) { return matmul(x[0], x[1], ta, tb); }, {a, b});
      // Batched, both operands [2, ...].
      const Tensor ba = param(ta ? Shape{2, 4, 3} : Shape{2, 3, 4}, 52), bb = param(tb ? Shape{2, 2, 4} : Shape{2, 4, 2}, 53);
      EXPECT_GRADCHECK([=](const Inputs& x) { return matmul(x[0], x[1], ta, tb); }, {ba, bb});
      // Batched a against a shared 2-D b: b's gradient sums over the batch.
      EXPECT_GRADCHECK([=](const Inputs& x) { return matmul(x[0], x[1], ta, tb); }, {ba, b});
    }
  }
}

TEST(OpsGradcheck, MatmulTwoBatchDims) {
  const Tensor a = param({2, 2, 3, 2}, 54), b = param({2, 2, 2, 3}, 55), w = param({3, 4}, 56);
  EXPECT_GRADCHECK([](const Inputs& x) { return matmul(x[0], x[1]); }, {a, b});
  EXPECT_GRADCHECK([](const Inputs& x) { return matmul(x[0], x[1], true, false); }, {a, w});
}

TEST(OpsGradcheck, Linear) {
  const Tensor w = param({3, 4}, 57), bias = param({3}, 58);
  const Tensor x2 = param({5, 4}, 59), x3 = param({2, 3, 4}, 60), x1 = param({4}, 61);
  EXPECT_GRADCHECK([](const Inputs& x) { return linear(x[0], x[1], x[2]); }, {x2, w, bias});
  EXPECT_GRADCHECK([](const Inputs& x) { return linear(x[0], x[1]); }, {x2, w});
  EXPECT_GRADCHECK([](const Inputs& x) { return linear(x[0], x[1], x[2]); }, {x3, w, bias});
  EXPECT_GRADCHECK([](const Inputs& x) { return linear(x[0], x[1]); }, {x3, w});
  EXPECT_GRADCHECK([](const Inputs& x) { return linear(x[0], x[1], x[2]); }, {x1, w, bias});
  // A frozen weight: only x and the bias need gradients.
  const Tensor frozen = random_tensor({3, 4}, DType::f64, 62);
  EXPECT_GRADCHECK([](const Inputs& x) { return linear(x[0], x[1], x[2]); }, {x3, frozen, bias});
}

// ---- neural-network functions -----------------------------------------------------------------------------

TEST(OpsGradcheck, LayerNorm) {
  const Tensor x = param({2, 3, 5}, 63), w = param({5}, 64), b = param({5}, 65);
  EXPECT_GRADCHECK([](const Inputs& t) { return layer_norm(t[0], t[1], t[2]); }, {x, w, b});
  EXPECT_GRADCHECK([](const Inputs& t) { return layer_norm(t[0], Tensor(), Tensor()); }, {x});
  EXPECT_GRADCHECK([](const Inputs& t) { return layer_norm(t[0], t[1], t[2], 1e-2); }, {param({4, 3}, 66), param({3}, 67), param({3}, 68)});
}

// Both outputs, h = x + y and layer_norm(h), get random projections: every input's gradient goes
// through h's own gradient and through the LayerNorm's, summed in one pass.
TEST(OpsGradcheck, AddLayerNorm) {
  const Tensor x = param({2, 3, 5}, 160), y = param({2, 3, 5}, 161), w = param({5}, 162), b = param({5}, 163);
  auto both = [](const Inputs& t) {
    auto [h, ln] = add_layer_norm(t[0], t[1], t[2], t[3]);
    return Inputs{h, ln};
  };
  EXPECT_GRADCHECK(both, {x, y, w, b});
  EXPECT_GRADCHECK(
      [](const Inputs& t) {
        auto [h, ln] = add_layer_norm(t[0], t[1], Tensor(), Tensor());
        return Inputs{h, ln};
      },
      {x, y});
  // One output alone: the other's gradient is zeros.
  EXPECT_GRADCHECK([](const Inputs& t) { return add_layer_norm(t[0], t[1], t[2], t[3], 1e-2).second; },
                   {x, y, w, b});
  EXPECT_GRADCHECK([](const Inputs& t) { return add_layer_norm(t[0], t[1], t[2], t[3]).first; }, {x, y, w, b});
  // h used again downstream (the next residual add, then a nonlinearity), as in a transformer block.
  EXPECT_GRADCHECK(
      [](const Inputs& t) {
        auto [h, ln] = add_layer_norm(t[0], t[1], t[2], t[3]);
        return gelu(h + ln * 0.5);
      },
      {x, y, w, b});
}

// residual_layer_norm: r (x passed on) and layer_norm(x) both feed the output, r through another op, as
// the residual add does in a block: x's gradient is the sum the LayerNorm's pass makes.
TEST(OpsGradcheck, ResidualLayerNorm) {
  const Tensor x = param({2, 3, 5}, 170), w = param({5}, 171), b = param({5}, 172), y = param({2, 3, 5}, 173);
  auto both = [](const Inputs& t) {
    auto [r, ln] = residual_layer_norm(t[0], t[1], t[2]);
    return Inputs{r, ln};
  };
  EXPECT_GRADCHECK(both, {x, w, b});
  EXPECT_GRADCHECK(
      [](const Inputs& t) {
        auto [r, ln] = residual_layer_norm(t[0], Tensor(), Tensor(), 1e-2);
        return Inputs{r, ln};
      },
      {x});
  // One output alone: the other's gradient is zeros.
  EXPECT_GRADCHECK([](const Inputs& t) { return residual_layer_norm(t[0], t[1], t[2]).second; }, {x, w, b});
  EXPECT_GRADCHECK([](const Inputs& t) { return residual_layer_norm(t[0], t[1], t[2]).first * 3.0; }, {x, w, b});
  // The block's shape: r into the add_layer_norm after a branch computed from the LayerNorm's output.
  EXPECT_GRADCHECK(
      [](const Inputs& t) {
        auto [r, ln] = residual_layer_norm(t[0], t[1], t[2]);
        auto [h, ln2] = add_layer_norm(r, gelu(ln * t[3]), t[1], t[2]);
        return h + ln2;
      },
      {x, w, b, y});
}

TEST(OpsGradcheck, Gelu) {
  const Tensor x = param({3, 5}, 69);
  EXPECT_GRADCHECK([](const Inputs& t) { return gelu(t[0]); }, {x});
  EXPECT_GRADCHECK([](const Inputs& t) { return gelu(t[0], kernels::GeluApproximation::Tanh); }, {x});
}

TEST(OpsGradcheck, GeluLinear) {
  const Tensor h = param({2, 3, 5}, 71), w = param({4, 5}, 72), b = param({4}, 73);
  for (auto approximation : {kernels::GeluApproximation::None, kernels::GeluApproximation::Tanh}) {
    EXPECT_GRADCHECK([approximation](const Inputs& t) { return gelu_linear(t[0], approximation, t[1], t[2]); },
                     {h, w, b});
    EXPECT_GRADCHECK([approximation](const Inputs& t) { return gelu_linear(t[0], approximation, t[1]); }, {h, w});
  }
}

// fc1 -> GELU -> fc2 as one node: every input's gradient, with and without each bias, and with some
// inputs not requiring grad (fc1's bias gradient then comes from fc1's own wgrad or is skipped).
TEST(OpsGradcheck, LinearGeluLinear) {
  const Tensor x = param({2, 3, 5}, 81), w1 = param({6, 5}, 82), b1 = param({6}, 83), w2 = param({4, 6}, 84),
               b2 = param({4}, 85);
  for (auto approximation : {kernels::GeluApproximation::None, kernels::GeluApproximation::Tanh}) {
    EXPECT_GRADCHECK(
        [approximation](const Inputs& t) { return linear_gelu_linear(t[0], t[1], t[2], approximation, t[3], t[4]); },
        {x, w1, b1, w2, b2});
    EXPECT_GRADCHECK(
        [approximation](const Inputs& t) { return linear_gelu_linear(t[0], t[1], Tensor(), approximation, t[2]); },
        {x, w1, w2});
    // Only fc1's bias and fc2's weight train (x, fc1's weight and fc2's bias fixed).
    EXPECT_GRADCHECK(
        [approximation, x, w1, b2](const Inputs& t) {
          return linear_gelu_linear(x.detach(), w1.detach(), t[0], approximation, t[1], b2.detach());
        },
        {b1, w2});
    // With the residual added (a block's last residual add), the residual a function of x as in a block.
    const Tensor r = param({2, 3, 4}, 86);
    EXPECT_GRADCHECK(
        [approximation](const Inputs& t) {
          return linear_gelu_linear(t[0], t[1], t[2], approximation, t[3], t[4], t[5] * 2.0);
        },
        {x, w1, b1, w2, b2, r});
    EXPECT_GRADCHECK(
        [approximation](const Inputs& t) {
          return linear_gelu_linear(t[0], t[1], t[2], approximation, t[3], t[4], slice(t[0], 2, 0, 4));
        },
        {x, w1, b1, w2, b2});
  }
}

TEST(OpsGradcheck, CrossEntropy) {
  const Tensor logits = param({4, 5}, 70);
  const Tensor targets = from_vector<int64_t>({3, 0, -100, 4}, {4});  // row 2 is ignored
  EXPECT_GRADCHECK([targets](const Inputs& t) { return cross_entropy(t[0], targets); }, {logits});
  EXPECT_GRADCHECK([targets](const Inputs& t) { return cross_entropy(t[0], targets, 0.1); }, {logits});
  const Tensor other = from_vector<int64_t>({1, 7, 2, 7}, {4});
  EXPECT_GRADCHECK([other](const Inputs& t) { return cross_entropy(t[0], other, 0.2, 7); }, {logits});
  // The loss gradient is scaled by whatever flows into it.
  EXPECT_GRADCHECK([targets](const Inputs& t) { return cross_entropy(t[0], targets, 0.1) * 3.0; }, {logits});
}

TEST(OpsGradcheck, Dropout) {
  const Tensor x = param({4, 6}, 71);
  // Each call re-seeds its own generator, so every forward gradcheck runs draws the same mask.
  EXPECT_GRADCHECK(
      [](const Inputs& t) {
        Generator gen(2024);
        return dropout(t[0], 0.3, true, &gen);
      },
      {x});
  EXPECT_GRADCHECK([](const Inputs& t) { return dropout(t[0], 0.3, false) * 2.0; }, {x});
  EXPECT_GRADCHECK([](const Inputs& t) { return dropout(t[0], 0.0) * 2.0; }, {x});
}

TEST(OpsGradcheck, Attention) {
  // B=1, S=4, Sk=3 with the default scale; B=2, S=3, Sk=5 with an explicit one.
  const Tensor q1 = param({1, 2, 4, 4}, 72), k1 = param({1, 2, 3, 4}, 73), v1 = param({1, 2, 3, 4}, 74);
  EXPECT_GRADCHECK([](const Inputs& t) { return scaled_dot_product_attention(t[0], t[1], t[2]); }, {q1, k1, v1});
  const Tensor q2 = param({2, 2, 3, 4}, 75), k2 = param({2, 2, 5, 4}, 76), v2 = param({2, 2, 5, 4}, 77);
  EXPECT_GRADCHECK([](const Inputs& t) { return scaled_dot_product_attention(t[0], t[1], t[2], 0.7); }, {q2, k2, v2});
}

TEST(OpsGradcheck, PackedQkvAttention) {
  // qkv [B, S, 3·H·D]: 3 heads of dim 2 over 5 tokens; 1 head of dim 3 over 7 tokens, explicit scale.
  const Tensor qkv1 = param({2, 5, 3 * 3 * 2}, 78);
  EXPECT_GRADCHECK([](const Inputs& t) { return packed_qkv_attention(t[0], 3); }, {qkv1});
  const Tensor qkv2 = param({1, 7, 3 * 1 * 3}, 79);
  EXPECT_GRADCHECK([](const Inputs& t) { return packed_qkv_attention(t[0], 1, 0.6); }, {qkv2});
}

TEST(OpsGradcheck, PackedQkvAttentionEqualsPermuteSelectAttention) {
  // The formulation it replaces: reshape, permute to [3, B, H, S, D], select q, k, v, attend, permute
  // back. Same values (f64), and the same gradient for the same upstream gradient.
  const int64_t B = 2, S = 5, H = 3, D = 4;
  const Tensor qkv = param({B, S, 3 * H * D}, 90);
  const Tensor qkv_ref = qkv.detach().clone().requires_grad_();
  const Tensor packed = packed_qkv_attention(qkv, H);
  const Tensor heads = permute(reshape(qkv_ref, {B, S, 3, H, D}), {2, 0, 3, 1, 4});
  const Tensor att = scaled_dot_product_attention(select(heads, 0, 0), select(heads, 0, 1), select(heads, 0, 2));
  const Tensor unpacked = reshape(permute(att, {0, 2, 1, 3}), {B, S, H * D});
  EXPECT_TRUE(testing::all_close(packed, unpacked, 1e-13, 1e-12));
  const Tensor upstream = param({B, S, H * D}, 91).detach();
  sum(packed * upstream).backward();
  sum(unpacked * upstream).backward();
  EXPECT_TRUE(testing::all_close(qkv.grad(), qkv_ref.grad(), 1e-13, 1e-12));
}

TEST(OpsGradcheck, PackedQkvAttentionErrorsNameTheShape) {
  EXPECT_TRUE(testing::throws_with([] { packed_qkv_attention(param({2, 5, 10}, 1), 2); },
                                   {"packed_qkv_attention", "[2, 5, 10]", "3·num_heads = 6"}));
  EXPECT_TRUE(testing::throws_with([] { packed_qkv_attention(param({5, 12}, 1), 2); }, {"[5, 12]"}));
}

TEST(OpsGradcheck, SmallNetwork) {
  // patchify -> linear -> layer_norm -> attention -> gelu -> select -> linear -> cross_entropy.
  const Tensor images = param({2, 1, 4, 4}, 80), w1 = param({4, 4}, 81), b1 = param({4}, 82);
  const Tensor ln_w = param({4}, 83), ln_b = param({4}, 84), w2 = param({3, 4}, 85);
  const Tensor targets = from_vector<int64_t>({2, 0}, {2});
  EXPECT_GRADCHECK(
      [targets](const Inputs& t) {
        Tensor h = layer_norm(linear(patchify(t[0], 2), t[1], t[2]), t[3], t[4]);  // [2, 4, 4]
        Tensor q = reshape(h, {2, 1, 4, 4});
        Tensor a = gelu(scaled_dot_product_attention(q, q, q));
        Tensor cls = select(reshape(a, {2, 4, 4}), 1, 0);  // [2, 4]
        return cross_entropy(linear(cls, t[5]), targets, 0.1);
      },
      {images, w1, b1, ln_w, ln_b, w2});
}

}  // namespace
}  // namespace octet
