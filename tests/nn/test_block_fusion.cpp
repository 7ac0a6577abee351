// TransformerBlock's fusions: its first residual add rides in attn.proj's GEMM (or, with drop path
// or proj's dropout on, in norm2: LayerNorm::add_forward), the last in fc2's, and each LayerNorm passes
// its input on to the add that uses it (autograd's residual_layer_norm, so its backward sums the
// input's two gradients). Against the block's unfused formulation written out here with the same
// submodules: the output and every parameter's and the input's gradient bit for bit in f32, and the
// hooks on norm1, norm2 and proj still see and change what they did before the fusions.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/op_ledger.h"
#include "nn/layers.h"
#include "tests/testing.h"

namespace octet::nn {
namespace {

using octet::testing::random_tensor;
using octet::testing::same_bits;

constexpr int64_t B = 3, N = 5, D = 32;

void randomise(Module& m, uint64_t seed) {
  for (const Tensor& p : m.parameters()) p.detach().copy_(random_tensor(p.shape(), DType::f32, seed++, 0.5));
}

// timm's block as TransformerBlock::forward wrote it before the fusions, its MLP module by module.
Tensor unfused_forward(TransformerBlock& block, const Tensor& x) {
  const Tensor h = x + (*block.drop_path1)((*block.attn)((*block.norm1)(x)));
  Mlp& m = *block.mlp;
  const Tensor mlp_out = (*m.drop2)((*m.fc2)((*m.drop1)((*m.act)((*m.fc1)((*block.norm2)(h))))));
  return h + (*block.drop_path2)(mlp_out);
}

struct Result {
  Tensor out, dx;
  std::map<std::string, Tensor> grads;  // by parameter name
};

// One forward and backward from fresh leaves and zeroed gradients; the generator restarts, so
// dropout and drop-path draw the same masks in both formulations (the modules run in one order).
template <class Forward>
Result run(TransformerBlock& block, Generator& gen, Forward&& forward) {
  gen.set_state(77, 0);
  block.zero_grad();
  Tensor x = random_tensor({B, N, D}, DType::f32, 5, 2.0);
  x.requires_grad_();
  Result r;
  r.out = forward(x);
  autograd::backward({r.out}, {random_tensor({B, N, D}, DType::f32, 6)});
  r.dx = x.grad();
  for (const auto& [name, p] : block.named_parameters()) r.grads[name] = p.grad();
  return r;
}

void expect_same(const Result& got, const Result& want) {
  EXPECT_TRUE(same_bits(got.out, want.out));
  EXPECT_TRUE(same_bits(got.dx, want.dx));
  ASSERT_EQ(got.grads.size(), 12u);  // norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2: weight and bias
  for (const auto& [name, g] : want.grads) {
    ASSERT_TRUE(g.defined()) << name;
    EXPECT_TRUE(same_bits(got.grads.at(name), g)) << name;
  }
}

// A forward hook that only watches: how often it ran, and the last input and output it saw.
struct Observer {
  int calls = 0;
  Tensor input, output;
};
size_t observe(Module& m, Observer& seen) {
  return m.register_forward_hook([&seen](Module&, const Tensor& in, const Tensor& out) {
    ++seen.calls;
    seen.input = in.detach();
    seen.output = out.detach();
    return Tensor();
  });
}

// The node that produced h, the block's last residual: the first operand of its last add (out = h +
// branch), or the residual input (the last) of the MLP's node when fc2's GEMM adds it.
std::shared_ptr<autograd::Node> h_node(const Tensor& out) {
  const auto& last = out.grad_fn();
  if (!last || last->next_edges.empty()) return nullptr;
  if (last->name() == "add") return last->next_edges[0].node;
  if (last->name() == "linear_gelu_linear" && last->next_edges.size() == 6) return last->next_edges[5].node;
  return nullptr;
}
std::string producer_of_h(const Tensor& out) {
  const auto node = h_node(out);
  return node ? node->name() : "?";
}

// The node that computed h = x + branch: norm2's fused add (add_layer_norm), attn.proj's GEMM (linear,
// with x as its residual; norm2's residual_layer_norm passes its h on), or an add.
std::shared_ptr<autograd::Node> first_add_node(const Tensor& out) {
  const auto node = h_node(out);
  if (node && node->name() == "residual_layer_norm" && !node->next_edges.empty()) return node->next_edges[0].node;
  return node;
}
std::string first_add(const Tensor& out) {
  const auto node = first_add_node(out);
  return node ? node->name() : "?";
}

// The node that produced that add's x operand: the block's input itself (a leaf) or norm1's node
// passing it on. x is the first operand of an add or add_layer_norm, and the residual (the fourth
// input) of proj's linear.
std::string producer_of_residual(const Tensor& out) {
  const auto node = first_add_node(out);
  const size_t operand = node && node->name() == "linear" ? 3 : 0;
  if (!node || node->next_edges.size() <= operand) return "?";
  return node->next_edges[operand].node ? node->next_edges[operand].node->name() : "?";
}

TEST(BlockFusion, OutputAndGradientsEqualTheUnfusedBlockBitForBit) {
  for (auto gelu : {kernels::GeluApproximation::None, kernels::GeluApproximation::Tanh}) {
    for (bool training : {false, true}) {
      SCOPED_TRACE(std::string(training ? "train, dropout and drop path on" : "eval") +
                   (gelu == kernels::GeluApproximation::Tanh ? ", tanh GELU" : ", erf GELU"));
      Generator gen;
      TransformerBlock block(D, 4, 4.0, true, /*proj_drop=*/0.1, 0.0, /*drop_path=*/0.25, &gen, gelu);
      randomise(block, 40);
      block.train(training);
      const Result fused = run(block, gen, [&](const Tensor& x) { return block(x); });
      const Result unfused = run(block, gen, [&](const Tensor& x) { return unfused_forward(block, x); });
      expect_same(fused, unfused);
      // The fused paths did run. Without drop path and dropout the first residual add rides in proj's
      // GEMM and norm2 passes h on; with them it is fused into norm2.
      EXPECT_EQ(first_add(fused.out), training ? "add_layer_norm" : "linear");
      EXPECT_EQ(producer_of_h(fused.out), training ? "add_layer_norm" : "residual_layer_norm");
      EXPECT_EQ(first_add(unfused.out), "add");
      // Without drop path the last residual add rides in the MLP's node (fc2's GEMM on the GPU).
      EXPECT_EQ(fused.out.grad_fn()->name(), training ? "add" : "linear_gelu_linear");
      Tensor leaf = random_tensor({B, N, D}, DType::f32, 5, 2.0);
      leaf.requires_grad_();
      EXPECT_EQ(producer_of_residual(block(leaf)), "residual_layer_norm");
    }
  }
}

// In evaluation (drop1 the identity) the block's MLP is one node, under either GELU form; a hook on fc1
// must see fc1's input, so then fc1 runs as a module and the GELU with fc2 as gelu_linear.
TEST(BlockFusion, MlpIsOneNodeUnlessFc1HasAHook) {
  for (auto gelu : {kernels::GeluApproximation::None, kernels::GeluApproximation::Tanh}) {
  SCOPED_TRACE(gelu == kernels::GeluApproximation::Tanh ? "tanh" : "erf");
  Generator gen;
  TransformerBlock block(D, 4, 4.0, true, 0.0, 0.0, 0.0, &gen, gelu);
  randomise(block, 50);
  const Tensor x = random_tensor({B, N, D}, DType::f32, 5, 2.0);
  auto mlp_node = [](const Tensor& out) {  // out = h + drop_path2(mlp): the branch's producer
    const auto& last = out.grad_fn();
    if (last && last->name() == "linear_gelu_linear") return last->name();  // h added in fc2's GEMM
    return last && last->next_edges.size() == 2 && last->next_edges[1].node ? last->next_edges[1].node->name()
                                                                           : std::string("?");
  };
  Tensor leaf = x.clone();
  leaf.requires_grad_();
  EXPECT_EQ(mlp_node(block(leaf)), "linear_gelu_linear");
  Tensor seen;
  block.mlp->fc1->register_forward_pre_hook([&seen](Module&, const Tensor& input) {
    seen = input.detach();
    return Tensor();
  });
  const Tensor out = block(leaf);
  EXPECT_EQ(mlp_node(out), "gelu_linear");
  ASSERT_TRUE(seen.defined());
  EXPECT_EQ(seen.shape(), Shape({B, N, D}));
  }
}

// An MLP's fc1, GELU and fc2 run as autograd's linear_gelu_linear when nothing sits between them (drop1
// the identity, no hooks): the output and every gradient (fc1's bias gradient summed in the GELU's
// backward pass) bit for bit those of the modules one after the other, in f32 and bf16, under both GELU
// forms; with dropout on in training they run as modules.
TEST(BlockFusion, MlpGeluLinearEqualsTheModulesBitForBit) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (auto approximation : {kernels::GeluApproximation::None, kernels::GeluApproximation::Tanh}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) +
                   (approximation == kernels::GeluApproximation::Tanh ? ", tanh" : ", erf"));
      Mlp mlp(D, 4 * D, D);
      randomise(mlp, 60);
      // (The member, which after_fc1 reads; the registered child stays the erf GELU and is not called.)
      mlp.act = std::make_shared<GELU>(approximation);
      mlp.to(dtype);
      struct Out {
        Tensor y, dx;
        std::map<std::string, Tensor> grads;
      };
      auto run_mlp = [&](bool modules) {
        mlp.zero_grad();
        Tensor x = random_tensor({B, N, D}, dtype, 7, 2.0);
        x.requires_grad_();
        Out o;
        o.y = modules ? (*mlp.fc2)((*mlp.drop1)((*mlp.act)((*mlp.fc1)(x)))) : mlp(x);
        autograd::backward({o.y}, {random_tensor({B, N, D}, dtype, 8)});
        o.dx = x.grad();
        for (const auto& [name, p] : mlp.named_parameters()) o.grads[name] = p.grad();
        return o;
      };
      const Out fused = run_mlp(false), modules = run_mlp(true);
      ASSERT_TRUE(fused.y.grad_fn() != nullptr);
      EXPECT_EQ(fused.y.grad_fn()->name(), "linear_gelu_linear");
      EXPECT_EQ(modules.y.grad_fn()->name(), "linear");
      EXPECT_TRUE(same_bits(fused.y, modules.y));
      EXPECT_TRUE(same_bits(fused.dx, modules.dx));
      ASSERT_EQ(fused.grads.size(), 4u);
      for (const auto& [name, g] : modules.grads) EXPECT_TRUE(same_bits(fused.grads.at(name), g)) << name;
    }
  }
  // With dropout between the GELU and fc2 (training), the modules: drop2's input comes from a plain linear.
  Generator gen;
  Mlp with_dropout(D, 4 * D, D, /*drop=*/0.3, &gen);
  with_dropout.train();
  const Tensor out = with_dropout(random_tensor({B, N, D}, DType::f32, 9));
  ASSERT_EQ(out.grad_fn()->name(), "dropout");  // drop2
  ASSERT_FALSE(out.grad_fn()->next_edges.empty());
  EXPECT_EQ(out.grad_fn()->next_edges[0].node->name(), "linear");
}

// A hook on norm2 runs norm2 as a module (proj's GEMM still makes h), so hooks see the input h and the
// output as before; a pre-hook's replacement input and a forward hook's replacement output take effect.
TEST(BlockFusion, HooksOnNorm2StillSeeAndChangeItsInputAndOutput) {
  Generator gen;
  TransformerBlock block(D, 4);
  randomise(block, 50);
  block.eval();
  const Result plain = run(block, gen, [&](const Tensor& x) { return block(x); });

  // An observing forward hook: same results, and it saw norm2's input and output.
  Observer seen;
  const size_t observer = observe(*block.norm2, seen);
  const Result observed = run(block, gen, [&](const Tensor& x) { return block(x); });
  EXPECT_EQ(seen.calls, 1);
  const Tensor seen_input = seen.input, seen_output = seen.output;
  expect_same(observed, plain);
  EXPECT_EQ(producer_of_h(observed.out), "linear");  // h straight from proj's GEMM: no norm2 node passes it on
  ASSERT_TRUE(seen_input.defined() && seen_output.defined());
  {
    NoGradGuard no_grad;
    EXPECT_TRUE(same_bits(seen_output, (*block.norm2).forward(seen_input)));
    const Tensor x = random_tensor({B, N, D}, DType::f32, 5, 2.0);
    EXPECT_TRUE(same_bits(seen_input, x + (*block.attn)((*block.norm1)(x))));
  }
  block.norm2->remove_hook(observer);

  // Hooks that change things: the pre-hook halves norm2's input, the forward hook adds 1 to its
  // output. The block must compute h + mlp(norm2(h / 2) + 1).
  block.norm2->register_forward_pre_hook([](Module&, const Tensor& in) { return in * 0.5; });
  block.norm2->register_forward_hook([](Module&, const Tensor&, const Tensor& out) { return out + 1.0; });
  const Result changed = run(block, gen, [&](const Tensor& x) { return block(x); });
  const Result by_hand = run(block, gen, [&](const Tensor& x) {
    const Tensor h = x + (*block.attn)((*block.norm1)(x));
    return h + (*block.mlp)(layer_norm(h * 0.5, block.norm2->weight, block.norm2->bias) + 1.0);
  });
  expect_same(changed, by_hand);
  EXPECT_FALSE(same_bits(changed.out, plain.out));
}

// A hook on norm1 runs it as a module (the block's input goes to the residual add as it is), so hooks
// see its input and output; an observing hook leaves the results alone, and a pre-hook's replacement
// input takes effect.
TEST(BlockFusion, HooksOnNorm1StillSeeAndChangeItsInput) {
  Generator gen;
  TransformerBlock block(D, 4);
  randomise(block, 55);
  block.eval();
  const Result plain = run(block, gen, [&](const Tensor& x) { return block(x); });
  Tensor leaf = random_tensor({B, N, D}, DType::f32, 5, 2.0);
  leaf.requires_grad_();
  EXPECT_EQ(producer_of_residual(block(leaf)), "residual_layer_norm");

  int calls = 0;
  const size_t observer = block.norm1->register_forward_hook([&](Module&, const Tensor&, const Tensor&) {
    ++calls;
    return Tensor();
  });
  const Result observed = run(block, gen, [&](const Tensor& x) { return block(x); });
  EXPECT_EQ(calls, 1);
  expect_same(observed, plain);
  EXPECT_NE(producer_of_residual(block(leaf)), "residual_layer_norm");
  block.norm1->remove_hook(observer);

  block.norm1->register_forward_pre_hook([](Module&, const Tensor& in) { return in * 0.5; });
  const Result changed = run(block, gen, [&](const Tensor& x) { return block(x); });
  const Result by_hand = run(block, gen, [&](const Tensor& x) {
    const Tensor h = x + (*block.attn)(layer_norm(x * 0.5, block.norm1->weight, block.norm1->bias));
    return h + (*block.mlp)((*block.norm2)(h));
  });
  expect_same(changed, by_hand);
  EXPECT_FALSE(same_bits(changed.out, plain.out));
}

// A hook on attn.proj must see proj's output before the residual add, so the add then runs in norm2
// (add_layer_norm), as with drop path on; an observing hook leaves the results alone, and a hook that
// changes proj's output takes effect.
TEST(BlockFusion, HooksOnProjStillSeeAndChangeItsOutput) {
  Generator gen;
  TransformerBlock block(D, 4);
  randomise(block, 57);
  block.eval();
  const Result plain = run(block, gen, [&](const Tensor& x) { return block(x); });
  EXPECT_EQ(first_add(plain.out), "linear");

  Observer seen;
  const size_t observer = observe(*block.attn->proj, seen);
  const Result observed = run(block, gen, [&](const Tensor& x) { return block(x); });
  EXPECT_EQ(seen.calls, 1);
  expect_same(observed, plain);
  EXPECT_EQ(first_add(observed.out), "add_layer_norm");
  {
    NoGradGuard no_grad;
    EXPECT_TRUE(same_bits(seen.output, linear(seen.input, block.attn->proj->weight, block.attn->proj->bias)));
  }
  block.attn->proj->remove_hook(observer);

  block.attn->proj->register_forward_hook([](Module&, const Tensor&, const Tensor& out) { return out + 1.0; });
  const Result changed = run(block, gen, [&](const Tensor& x) { return block(x); });
  const Result by_hand = run(block, gen, [&](const Tensor& x) { return unfused_forward(block, x); });
  expect_same(changed, by_hand);
  EXPECT_FALSE(same_bits(changed.out, plain.out));
}

// Linear::residual_forward: the module's output plus the residual, whose gradient is the output's; bit
// for bit the two calls in f32 (in bf16 the sum is rounded once: kernels::linear_forward's own test,
// Linear.ResidualWithABiasIsRoundedOnceInLowPrecision); with a hook, the hook sees the output before
// the add. Where only the residual needs a gradient, backward runs no GEMM.
TEST(BlockFusion, LinearResidualForwardEqualsTheModuleThenTheAdd) {
  Linear fc(D, 2 * D);
  randomise(fc, 66);
  Tensor x = random_tensor({B, N, D}, DType::f32, 67).requires_grad_();
  Tensor r = random_tensor({B, N, 2 * D}, DType::f32, 68, 2.0).requires_grad_();
  const Tensor upstream = random_tensor({B, N, 2 * D}, DType::f32, 69);
  const Tensor y = fc.residual_forward(x, r);
  EXPECT_EQ(y.grad_fn()->name(), "linear");
  y.backward(upstream);
  const Tensor dx = x.grad(), dr = r.grad(), dw = fc.weight.grad();
  EXPECT_TRUE(same_bits(dr, upstream));
  x.set_grad(Tensor());
  r.set_grad(Tensor());
  fc.zero_grad();
  const Tensor y2 = fc(x) + r;
  y2.backward(upstream);
  EXPECT_TRUE(same_bits(y, y2));
  EXPECT_TRUE(same_bits(dx, x.grad()));
  EXPECT_TRUE(same_bits(dw, fc.weight.grad()));
  EXPECT_TRUE(octet::testing::throws_with([&] { fc.residual_forward(x, random_tensor({B, N, D})); },
                                          {"linear_forward", "residual must have y's shape"}));

  Tensor seen;
  fc.register_forward_hook([&](Module&, const Tensor&, const Tensor& out) {
    seen = out.detach();
    return Tensor();
  });
  {
    NoGradGuard no_grad;
    EXPECT_TRUE(same_bits(fc.residual_forward(x, r), y));
    EXPECT_TRUE(same_bits(seen, linear(x, fc.weight, fc.bias)));
  }

  Tensor r2 = random_tensor({B, N, 2 * D}, DType::f32, 70).requires_grad_();
  OpLedger ledger;
  linear(x.detach(), fc.weight.detach(), fc.bias.detach(), r2).backward(upstream);
  EXPECT_TRUE(same_bits(r2.grad(), upstream));
  EXPECT_EQ(ledger.op("linear_backward").calls, 0);
}

// after_qkv's residual must have the output's shape and dtype, named in the error, on either path.
TEST(BlockFusion, AttentionResidualOfAnotherShapeOrDtypeIsRefused) {
  MultiheadAttention attn(D, 4);
  const Tensor qkv = random_tensor({B, N, 3 * D});
  for (const bool hooked : {false, true}) {
    if (hooked) attn.proj->register_forward_hook([](Module&, const Tensor&, const Tensor&) { return Tensor(); });
    EXPECT_TRUE(octet::testing::throws_with([&] { attn.after_qkv(qkv, random_tensor({B, N + 1, D})); },
                                            {"MultiheadAttention", "residual", "must have the output's shape"}));
    EXPECT_TRUE(octet::testing::throws_with([&] { attn.after_qkv(qkv, random_tensor({B, N, D}).to(DType::bf16)); },
                                            {"MultiheadAttention", "bf16", "dtype f32"}));
  }
}

TEST(BlockFusion, ResidualLinearForwardEqualsTheInputAndTheModules) {
  LayerNorm norm(D);
  Linear next(D, 3 * D);
  randomise(norm, 63);
  randomise(next, 64);
  const Tensor x = random_tensor({B, N, D}, DType::f32, 65, 2.0);
  const auto [r, y] = norm.residual_linear_forward(next, x);
  EXPECT_EQ(r.data_ptr(), x.data_ptr());
  EXPECT_TRUE(same_bits(y, next(norm(x))));
  EXPECT_TRUE(octet::testing::throws_with([&] { norm.residual_linear_forward(next, random_tensor({N, D + 1})); },
                                          {"layernorm"}));
}

TEST(BlockFusion, AddForwardEqualsAddThenTheModule) {
  LayerNorm norm(D);
  randomise(norm, 60);
  const Tensor x = random_tensor({B, N, D}, DType::f32, 61, 2.0), y = random_tensor({B, N, D}, DType::f32, 62);
  const auto [h, normed] = norm.add_forward(x, y);
  EXPECT_TRUE(same_bits(h, x + y));
  EXPECT_TRUE(same_bits(normed, norm(x + y)));
  EXPECT_TRUE(octet::testing::throws_with([&] { norm.add_forward(x, random_tensor({N, D})); },
                                          {"add_layernorm_forward", "one shape"}));
  // Without y, h is x itself, passed on by the LayerNorm's node (residual_layer_norm).
  const Tensor leaf = random_tensor({B, N, D}, DType::f32, 63, 2.0).requires_grad_();
  const auto [h0, normed0] = norm.add_forward(leaf, Tensor());
  EXPECT_EQ(h0.data_ptr(), leaf.data_ptr());
  EXPECT_EQ(h0.grad_fn()->name(), "residual_layer_norm");
  EXPECT_TRUE(same_bits(normed0, norm(leaf)));
}

}  // namespace
}  // namespace octet::nn
