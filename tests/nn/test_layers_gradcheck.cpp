// Every layer's gradients against finite differences, in f64, with respect to its input and its
// parameters. gradcheck perturbs the tensors it is given in place, and a module's parameters are
// those very tensors, so passing them as inputs checks the parameter gradients.
#include <gtest/gtest.h>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "nn/layers.h"
#include "tests/testing.h"

namespace octet::nn {
namespace {

using autograd::gradcheck;
using Inputs = std::vector<Tensor>;
using octet::testing::random_tensor;

#define EXPECT_GRADCHECK(...)                    \
  do {                                           \
    const auto result_ = gradcheck(__VA_ARGS__); \
    EXPECT_TRUE(result_) << result_.message;     \
  } while (0)

// An f64 leaf input.
Tensor input(const Shape& shape, uint64_t seed) {
  Tensor t = random_tensor(shape, DType::f64, seed);
  t.requires_grad_();
  return t;
}

// The module in f64 with seeded parameters (biases non-zero, norms away from 1), and the input
// followed by every parameter, ready for gradcheck.
Inputs prepare(Module& m, const Tensor& x, uint64_t seed) {
  m.to(DType::f64);
  Inputs inputs = {x};
  for (const Tensor& p : m.parameters()) {
    p.copy_(random_tensor(p.shape(), DType::f64, seed++, 0.5));
    inputs.push_back(p);
  }
  return inputs;
}

// fn(inputs) = module(inputs[0]); the parameters are read through the module.
autograd::SingleOutputFn call(Module& m) {
  return [&m](const Inputs& in) { return m(in[0]); };
}

TEST(LayersGradcheck, Linear) {
  Linear linear(4, 3);
  EXPECT_GRADCHECK(call(linear), prepare(linear, input({2, 2, 4}, 1), 10));
  Linear no_bias(4, 3, false);
  EXPECT_GRADCHECK(call(no_bias), prepare(no_bias, input({5, 4}, 2), 20));
}

TEST(LayersGradcheck, LayerNormAndGelu) {
  LayerNorm norm(5);
  EXPECT_GRADCHECK(call(norm), prepare(norm, input({3, 5}, 3), 30));
  GELU act;
  EXPECT_GRADCHECK(call(act), {input({4, 3}, 4)});
}

TEST(LayersGradcheck, Mlp) {
  Mlp mlp(4, 6, 3);
  EXPECT_GRADCHECK(call(mlp), prepare(mlp, input({2, 3, 4}, 5), 40));
}

TEST(LayersGradcheck, MultiheadAttention) {
  MultiheadAttention attn(6, 2);
  EXPECT_GRADCHECK(call(attn), prepare(attn, input({2, 3, 6}, 6), 50));
}

TEST(LayersGradcheck, TransformerBlock) {
  TransformerBlock block(4, 2, /*mlp_ratio=*/2.0);
  EXPECT_GRADCHECK(call(block), prepare(block, input({2, 3, 4}, 7), 60));
}

TEST(LayersGradcheck, TransformerBlockWithDropoutAndDropPath) {
  // Re-seeding at every call makes each evaluation draw the same masks, so the function is
  // deterministic and its gradient is the masked one.
  Generator gen;
  TransformerBlock block(4, 2, 2.0, true, /*proj_drop=*/0.3, 0.0, /*drop_path=*/0.4, &gen);
  const Inputs inputs = prepare(block, input({4, 3, 4}, 8), 70);
  EXPECT_GRADCHECK(
      [&](const Inputs& in) {
        gen.manual_seed(5);
        return block(in[0]);
      },
      inputs);
}

TEST(LayersGradcheck, PatchEmbed) {
  PatchEmbed pe(4, 2, 2, 3);
  EXPECT_GRADCHECK(call(pe), prepare(pe, input({2, 2, 4, 4}, 9), 80));
}

TEST(LayersGradcheck, CrossEntropyLoss) {
  const Tensor targets = from_vector<int64_t>({2, 0, 1}, {3});
  const CrossEntropyLoss loss(0.1);
  EXPECT_GRADCHECK([&](const Inputs& in) { return loss(in[0], targets); }, {input({3, 4}, 10)});
}

}  // namespace
}  // namespace octet::nn
