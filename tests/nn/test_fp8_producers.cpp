// FP8 producers: the LayerNorm that writes the next Linear's FP8 input (nn::fp8_layernorm_linear,
// nn::fp8_add_layernorm_linear, and the TransformerBlock that uses them through LayerNorm::
// linear_forward and add_linear_forward) against the unfused pairs they replace, bit for bit on the
// CPU: outputs, every gradient and the FP8 state, over training steps, under both formats of delayed
// scaling; current scaling and hooks keep the unfused pair; and the module path passes gradcheck.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "autograd/gradcheck.h"
#include "autograd/node.h"
#include "core/op_ledger.h"
#include "kernels/elementwise.h"
#include "nn/fp8.h"
#include "nn/fp8_linear.h"
#include "nn/layers.h"
#include "optim/sgd.h"
#include "tests/nn/fp8_steps.h"
#include "tests/testing.h"

namespace octet::nn {
namespace {

using namespace fp8_testing;
using octet::testing::random_tensor;

// Sets whether the LayerNorms write their Linears' FP8 inputs (set_fp8_fused_producers) for one scope,
// then restores the default (fused).
class FusedProducers {
 public:
  explicit FusedProducers(bool fused) { set_fp8_fused_producers(fused); }
  ~FusedProducers() { set_fp8_fused_producers(true); }
  FusedProducers(const FusedProducers&) = delete;
  FusedProducers& operator=(const FusedProducers&) = delete;
};

int64_t producer_calls(const OpLedger& ledger) {
  return ledger.op("layernorm_fp8_forward").calls + ledger.op("add_layernorm_fp8_forward").calls +
         ledger.op("gelu_fp8_forward").calls;
}

// How NormLinear calls its LayerNorm: linear_forward; residual_linear_forward, the input passed on
// (nn::fp8_residual_layernorm_linear); or add_linear_forward, after a residual add (fp8_add_layernorm_linear).
enum class NormMode { Plain, KeepInput, Add };
const char* mode_name(NormMode mode) {
  return mode == NormMode::Plain ? "plain" : mode == NormMode::KeepInput ? "keeping its input" : "with the residual add";
}

// A LayerNorm and the Linear it feeds, as a module: norm then fc, through LayerNorm::linear_forward; or
// keeping x (residual_linear_forward), or with a residual (add_linear_forward) whose h is also an
// output, so that x or h has a gradient of its own as in a block.
class NormLinear : public Module {
 public:
  NormLinear(int64_t in, int64_t out, NormMode mode) : Module("NormLinear"), mode_(mode) {
    norm = register_module("norm", std::make_shared<LayerNorm>(in));
    fc = register_module("fc", std::make_shared<Linear>(in, out));
  }
  Tensor forward(const Tensor& x) override {
    if (mode_ == NormMode::Plain) return norm->linear_forward(*fc, x);
    if (mode_ == NormMode::KeepInput) {
      const auto [r, y] = norm->residual_linear_forward(*fc, x);
      return concat({y, r}, -1);
    }
    const Tensor branch = mul(x, 0.5);
    const auto [h, y] = norm->add_linear_forward(*fc, x, branch);
    return concat({y, h}, -1);
  }
  std::shared_ptr<LayerNorm> norm;
  std::shared_ptr<Linear> fc;

 private:
  NormMode mode_;
};

// Two steps with an SGD step between (the second casts with the scales and weights the first left).
Fp8Steps norm_linear_steps(NormMode norm_mode, DType dtype, const Fp8Recipe& recipe, bool fused) {
  const FusedProducers mode(fused);
  OpLedger ledger;
  NormLinear m(64, 48, norm_mode);
  uint64_t seed = 700;
  for (const Tensor& p : m.parameters()) p.detach().copy_(random_tensor(p.shape(), DType::f32, seed++, 0.3));
  m.norm->weight.detach().copy_(kernels::add(m.norm->weight.detach(), full({64}, 1.0)));
  m.to(dtype);
  optim::SGD sgd(m.parameters(), 0.1);
  Fp8Steps out;
  for (int s = 0; s < 2; ++s) {
    // 33 rows: not a multiple of the transposed copy's 16-row padding.
    Tensor x = random_tensor({3, 11, 64}, dtype, 720 + s, 2.0).requires_grad_();
    sgd.zero_grad();
    const std::string at = "step" + std::to_string(s) + ".";
    const int64_t width = norm_mode == NormMode::Plain ? 48 : 48 + 64;
    out.tensors[at + "y"] = step(m, x, random_tensor({3, 11, width}, dtype, 730 + s), recipe);
    out.tensors[at + "x.grad"] = x.grad();
    keep_grads(out, m, at);
    keep_fp8_state(out, m, at);
    sgd.step();
  }
  out.fused_casts = producer_calls(ledger);
  return out;
}

TEST(Fp8Producers, LayerNormLinearEqualsTheUnfusedPairBitForBit) {
  const std::vector<std::pair<std::string, Fp8Recipe>> recipes = {
      {"delayed HYBRID", DelayedScaling{.amax_history_len = 4}},
      {"delayed E4M3", DelayedScaling{.amax_history_len = 4, .fp8_format = Fp8Format::E4M3}}};
  for (const auto& [name, recipe] : recipes) {
    for (NormMode mode : {NormMode::Plain, NormMode::KeepInput, NormMode::Add}) {
      for (DType dtype : {DType::bf16, DType::f32}) {
        SCOPED_TRACE(name + " " + mode_name(mode) + " " + dtype_name(dtype));
        const Fp8Steps fused = norm_linear_steps(mode, dtype, recipe, true);
        const Fp8Steps unfused = norm_linear_steps(mode, dtype, recipe, false);
        expect_same_steps(fused, unfused);
        EXPECT_EQ(fused.fused_casts, 2);
      }
    }
  }
  EXPECT_TRUE(fp8_fused_producers()) << "fused is the default";
}

// GELU then a Linear through nn::fp8_gelu_linear, which runs the unfused pair when the producers are
// switched off. (TransformerBlock's Mlp takes this path too, in the block test below.)
class GeluLinear : public Module {
 public:
  GeluLinear(int64_t in, int64_t out, kernels::GeluApproximation approximation)
      : Module("GeluLinear"), approximation_(approximation) {
    fc = register_module("fc", std::make_shared<Linear>(in, out));
  }
  Tensor forward(const Tensor& x) override {
    return fp8_gelu_linear(x, approximation_, fc->weight, fc->bias, fc->fp8_state, fp8_config());
  }
  std::shared_ptr<Linear> fc;

 private:
  kernels::GeluApproximation approximation_;
};

// The GELU writing the next Linear's FP8 input, both GELU forms, two steps, against the unfused pair.
TEST(Fp8Producers, GeluLinearEqualsTheUnfusedPairBitForBit) {
  for (kernels::GeluApproximation approximation : {kernels::GeluApproximation::None, kernels::GeluApproximation::Tanh}) {
    for (Fp8Format format : {Fp8Format::HYBRID, Fp8Format::E4M3}) {
      auto run = [&](bool fused) {
        const FusedProducers mode(fused);
        OpLedger ledger;
        GeluLinear mlp(64, 32, approximation);
        uint64_t seed = 900;
        for (const Tensor& p : mlp.parameters()) p.detach().copy_(random_tensor(p.shape(), DType::f32, seed++, 0.3));
        mlp.to(DType::bf16);
        optim::SGD sgd(mlp.parameters(), 0.1);
        Fp8Steps out;
        for (int s = 0; s < 2; ++s) {
          Tensor x = random_tensor({3, 11, 64}, DType::bf16, 920 + s, 2.0).requires_grad_();
          sgd.zero_grad();
          const std::string at = "step" + std::to_string(s) + ".";
          out.tensors[at + "y"] = step(mlp, x, random_tensor({3, 11, 32}, DType::bf16, 930 + s),
                                       DelayedScaling{.amax_history_len = 3, .fp8_format = format});
          out.tensors[at + "x.grad"] = x.grad();
          keep_grads(out, mlp, at);
          keep_fp8_state(out, mlp, at);
          sgd.step();
        }
        out.fused_casts = producer_calls(ledger);
        return out;
      };
      const Fp8Steps fused = run(true), unfused = run(false);
      expect_same_steps(fused, unfused);
      EXPECT_EQ(fused.fused_casts, 2);
    }
  }
}

// Current scaling needs the LayerNorm output's amax before its cast, so it keeps the unfused pair:
// no producer runs, and the results are those of the explicit pair.
TEST(Fp8Producers, CurrentScalingKeepsTheUnfusedPair) {
  for (NormMode mode : {NormMode::Plain, NormMode::KeepInput, NormMode::Add}) {
    SCOPED_TRACE(mode_name(mode));
    const Fp8Steps a = norm_linear_steps(mode, DType::bf16, CurrentScaling{}, true);
    const Fp8Steps b = norm_linear_steps(mode, DType::bf16, CurrentScaling{}, false);
    EXPECT_EQ(a.fused_casts, 0);
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (const auto& [name, t] : b.tensors) EXPECT_TRUE(same_bits(a.tensors.at(name), t)) << name;
  }
}

// A hook on the Linear (LoRA hangs its adapters on one) must see the LayerNorm's output as its input,
// so a hooked Linear is run as a module, unfused.
TEST(Fp8Producers, AHookedLinearRunsUnfused) {
  NormLinear m(32, 16, NormMode::Plain);
  m.to(DType::bf16);
  int64_t seen = 0;
  m.fc->register_forward_hook([&](Module&, const Tensor& in, const Tensor& out) {
    ++seen;
    EXPECT_EQ(in.shape(), (Shape{2, 5, 32}));
    return out;
  });
  OpLedger ledger;
  step(m, random_tensor({2, 5, 32}, DType::bf16, 1), random_tensor({2, 5, 16}, DType::bf16, 2), DelayedScaling{});
  EXPECT_EQ(seen, 1);
  EXPECT_EQ(producer_calls(ledger), 0);
}

// Two steps of a bf16 TransformerBlock: norm1 writes qkv's FP8 input, norm2 fc1's, the GELU fc2's,
// and GELU's backward fc1's E5M2 output gradient (the MLP's node, fp8_add_layernorm_mlp_residual); the
// same bits as the unfused block, including every FP8 history and scale, in both formats.
//
// The first residual add rides in proj's FP8 GEMM, so norm2 adds nothing. Observing hooks move the
// adds, and the bits stay the same: on drop_path2 the last add runs after the MLP, whose node then
// returns h as well (fp8_add_layernorm_mlp without a residual); on drop_path1 the first add is
// norm2's again (add_layernorm_fp8_forward in the MLP's node), as where drop path is on.
enum class Hook { None, DropPath2, DropPath1 };
TEST(Fp8Producers, ABlockTrainsTheSameBitsWithTheLayerNormsWritingFp8) {
  for (const Hook hook : {Hook::None, Hook::DropPath2, Hook::DropPath1}) {
  for (Fp8Format format : {Fp8Format::HYBRID, Fp8Format::E4M3}) {
    SCOPED_TRACE(std::string(format == Fp8Format::HYBRID ? "HYBRID" : "E4M3") +
                 (hook == Hook::DropPath2 ? ", a hook on drop_path2" : hook == Hook::DropPath1 ? ", a hook on drop_path1" : ""));
    const bool hooked = hook == Hook::DropPath2;
    auto run = [&](bool fused) {
      const FusedProducers mode(fused);
      OpLedger ledger;
      TransformerBlock block(32, 2);
      const auto observe = [](Module&, const Tensor&, const Tensor&) { return Tensor(); };
      if (hook == Hook::DropPath2) block.drop_path2->register_forward_hook(observe);
      if (hook == Hook::DropPath1) block.drop_path1->register_forward_hook(observe);
      uint64_t seed = 800;
      for (const Tensor& p : block.parameters()) p.detach().copy_(random_tensor(p.shape(), DType::f32, seed++, 0.2));
      block.to(DType::bf16);
      optim::SGD sgd(block.parameters(), 0.1);
      Fp8Steps out;
      for (int s = 0; s < 2; ++s) {
        Tensor x = random_tensor({2, 17, 32}, DType::bf16, 820 + s, 1.0).requires_grad_();
        sgd.zero_grad();
        const std::string at = "step" + std::to_string(s) + ".";
        out.tensors[at + "y"] = step(block, x, random_tensor({2, 17, 32}, DType::bf16, 830 + s),
                                     DelayedScaling{.amax_history_len = 3, .fp8_format = format});
        // The block's last node: fc2's GEMM, adding h (the whole MLP's node when fused); with the hook
        // on drop_path2, the add after it.
        const std::string last = hooked ? "add" : fused ? "fp8_add_layernorm_mlp_residual" : "fp8_linear";
        EXPECT_EQ(out.tensors[at + "y"].grad_fn()->name(), last);
        out.tensors[at + "x.grad"] = x.grad();
        keep_grads(out, block, at);
        keep_fp8_state(out, block, at);
        sgd.step();
      }
      out.fused_casts = producer_calls(ledger);
      EXPECT_EQ(ledger.op("layernorm_forward").calls + ledger.op("add_layernorm_forward").calls +
                    ledger.op("gelu_forward").calls + ledger.op("gelu_backward").calls,
                fused ? 0 : 8)
          << "the fused block stores no LayerNorm or GELU output, nor GELU's input gradient";
      EXPECT_EQ(ledger.op("dgelu_fp8_cast_dbias").calls, fused ? 2 : 0);
      // Both residual adds ride in GEMMs either way (proj's and fc2's FP8 GEMMs reading x and h), and
      // the two gradients of x and of h are summed in norm1's and norm2's backward passes: no add kernel
      // runs, nor a LayerNorm that adds. With the hook on drop_path1, norm2 adds (fused: its FP8 pass).
      EXPECT_EQ(ledger.op("add").calls, hooked ? 2 : 0);
      EXPECT_EQ(ledger.op("add_layernorm_forward").calls, hook == Hook::DropPath1 && !fused ? 2 : 0);
      EXPECT_EQ(ledger.op("add_layernorm_fp8_forward").calls, hook == Hook::DropPath1 && fused ? 2 : 0);
      return out;
    };
    const Fp8Steps fused = run(true), unfused = run(false);
    expect_same_steps(fused, unfused);
    EXPECT_EQ(fused.fused_casts, 2 * 3) << "norm1, norm2 and the GELU, twice";
  }
  }
}

// The MLP node checks the shapes that join its Linears before anything is cast: a call that throws
// leaves fc1's FP8 state (its history's current row, where the casts record their amaxes, and its
// scales) as it was, fused or not.
TEST(Fp8Producers, AnMlpWhoseLinearsDoNotJoinThrowsBeforeAnyCast) {
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "unfused");
    const FusedProducers mode(fused);
    const Tensor x = random_tensor({2, 9, 32}, DType::bf16, 850), r = random_tensor({2, 9, 32}, DType::bf16, 851);
    const Tensor lnw = random_tensor({32}, DType::bf16, 852), lnb = random_tensor({32}, DType::bf16, 853);
    const Tensor w1 = random_tensor({64, 32}, DType::bf16, 854, 0.2), b1 = random_tensor({64}, DType::bf16, 855);
    const Tensor w2 = random_tensor({32, 64}, DType::bf16, 856, 0.2), b2 = random_tensor({32}, DType::bf16, 857);
    const Tensor w2_wide = random_tensor({48, 64}, DType::bf16, 858, 0.2), b2_wide = random_tensor({48}, DType::bf16, 859);
    const Tensor w2_other = random_tensor({32, 48}, DType::bf16, 860, 0.2);
    std::shared_ptr<Fp8LinearState> s1, s2;
    const Fp8Autocast scope(true, DelayedScaling{.amax_history_len = 3});
    fp8_add_layernorm_mlp_residual(x, r, lnw, lnb, 1e-5, {w1, b1, s1}, kernels::GeluApproximation::None, {w2, b2, s2},
                                   fp8_config());
    ASSERT_NE(s1, nullptr);
    const Tensor history = s1->forward.amax_history.clone(), scale = s1->forward.scale.clone();
    // Another amax for fc1's input (LayerNorm's output is blind to x's scale, not to its weight's):
    // a cast that ran would change the history's row 0.
    const Tensor lnw4 = mul(lnw, 4.0);
    std::shared_ptr<Fp8LinearState> s2_wide, s2_other;
    EXPECT_TRUE(octet::testing::throws_with(
        [&] {
          fp8_add_layernorm_mlp_residual(x, r, lnw4, lnb, 1e-5, {w1, b1, s1}, kernels::GeluApproximation::None,
                                         {w2_wide, b2_wide, s2_wide}, fp8_config());
        },
        {"fp8_add_layernorm_mlp_residual", "must have h's 32 features", "[48, 64]"}));
    EXPECT_TRUE(octet::testing::throws_with(
        [&] {
          fp8_add_layernorm_mlp(x, r, lnw4, lnb, 1e-5, {w1, b1, s1}, kernels::GeluApproximation::None,
                                {w2_other, b2, s2_other}, fp8_config());
        },
        {"fp8_add_layernorm_mlp", "fc2 must take fc1's output", "[32, 48]"}));
    EXPECT_TRUE(octet::testing::same_bits(s1->forward.amax_history, history));
    EXPECT_TRUE(octet::testing::same_bits(s1->forward.scale, scale));
  }
}

// The fused nodes compute only the gradients asked for: a block whose input needs no gradient and
// whose fc1 and norm2 are frozen trains the same bits fused and unfused (the frozen parameters get
// none either way).
TEST(Fp8Producers, FrozenLayersAndAnInputWithoutGradientTrainTheSameBits) {
  auto run = [&](bool fused) {
    const FusedProducers mode(fused);
    TransformerBlock block(32, 2);
    uint64_t seed = 1000;
    for (const Tensor& p : block.parameters()) p.detach().copy_(random_tensor(p.shape(), DType::f32, seed++, 0.2));
    block.to(DType::bf16);
    for (Tensor* frozen : {&block.mlp->fc1->weight, &block.mlp->fc1->bias, &block.norm2->weight, &block.norm2->bias}) {
      frozen->requires_grad_(false);
    }
    std::vector<Tensor> trainable;
    for (const Tensor& p : block.parameters()) {
      if (p.requires_grad()) trainable.push_back(p);
    }
    optim::SGD sgd(trainable, 0.1);
    Fp8Steps out;
    for (int s = 0; s < 2; ++s) {
      const Tensor x = random_tensor({2, 17, 32}, DType::bf16, 1020 + s, 1.0);
      sgd.zero_grad();
      const std::string at = "step" + std::to_string(s) + ".";
      out.tensors[at + "y"] = step(block, x, random_tensor({2, 17, 32}, DType::bf16, 1030 + s), DelayedScaling{});
      for (const auto& [name, p] : block.named_parameters()) {
        if (p.requires_grad()) out.tensors[at + name + ".grad"] = p.grad().clone();
        EXPECT_EQ(p.grad().defined(), p.requires_grad()) << name;
      }
      keep_fp8_state(out, block, at);
      sgd.step();
    }
    return out;
  };
  const Fp8Steps fused = run(true), unfused = run(false);
  ASSERT_EQ(fused.tensors.size(), unfused.tensors.size());
  for (const auto& [name, t] : unfused.tensors) EXPECT_TRUE(same_bits(fused.tensors.at(name), t)) << name;
}

// Without a scope LayerNorm::linear_forward, residual_linear_forward and add_linear_forward are the
// plain pair, which passes gradcheck in f64 through each. (Within a scope the fused functions equal the
// unfused pair bit for bit, above, and tests/nn/test_fp8.cpp checks the FP8 Linear's straight-through
// gradients exactly.)
TEST(Fp8Producers, WithoutAScopeTheModulesAreThePlainPairAndPassGradcheck) {
  for (NormMode mode : {NormMode::Plain, NormMode::KeepInput, NormMode::Add}) {
    SCOPED_TRACE(mode_name(mode));
    NormLinear m(8, 4, mode);
    m.to(DType::f64);
    const Tensor x = random_tensor({2, 3, 8}, DType::f64, 5).requires_grad_();
    const auto result = autograd::gradcheck([&](const std::vector<Tensor>& in) { return m(in[0]); }, {x});
    EXPECT_TRUE(result.ok) << result.message;
  }
  // Mlp::add_norm_forward: {h, mlp(norm(h))}, both outputs differentiated.
  LayerNorm norm(8);
  Mlp mlp(8, 16, 8);
  norm.to(DType::f64);
  mlp.to(DType::f64);
  const Tensor x = random_tensor({2, 3, 8}, DType::f64, 6).requires_grad_();
  const Tensor y = random_tensor({2, 3, 8}, DType::f64, 7).requires_grad_();
  const auto result = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) {
        const auto [h, out] = mlp.add_norm_forward(norm, in[0], in[1]);
        return std::vector<Tensor>{h, out};
      },
      {x, y});
  EXPECT_TRUE(result.ok) << result.message;
}

}  // namespace
}  // namespace octet::nn
