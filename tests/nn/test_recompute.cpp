// Activation recompute (autograd/checkpoint.h, TransformerBlock::recompute): gradients with and
// without recompute are bit for bit equal, with dropout and drop-path drawing masks, in f32 and bf16;
// the random streams end where they would; under FP8 (delayed and current scaling) the scales and amax
// histories too; with LoRA adapters whose dropout has a stream of its own; and callbacks queued in the
// rerun's backward run once, at the end of the whole pass.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/grad_mode.h"
#include "core/random.h"
#include "nn/fp8.h"
#include "nn/layers.h"
#include "nn/lora.h"
#include "nn/recompute.h"
#include "tests/testing.h"

namespace octet::nn {
namespace {

using octet::testing::random_tensor;
using octet::testing::same_bits;

struct Result {
  std::map<std::string, Tensor> tensors;
  uint64_t gen_offset = 0, default_offset = 0;
};

// Two blocks with every kind of randomness on, one forward and backward of Σ y·r. With `random` off
// (no dropout, no drop path), the blocks take their fused paths: both residual adds in GEMMs (proj's
// and fc2's) and the MLP as one node.
Result run_blocks(bool recompute, DType dtype, bool random = true) {
  manual_seed(5);
  Generator gen(11);
  std::vector<std::shared_ptr<TransformerBlock>> blocks;
  uint64_t seed = 100;
  for (int b = 0; b < 2; ++b) {
    // proj_drop 0.1, drop_path 0.2 on the block's generator; the default generator is touched too
    // (the second block draws from it), to show both streams are rewound.
    auto block = std::make_shared<TransformerBlock>(32, 2, 2.0, true, random ? 0.1 : 0.0, 0.0, random ? 0.2 : 0.0,
                                                    b == 0 ? &gen : nullptr);
    for (const Tensor& p : block->parameters()) p.detach().copy_(random_tensor(p.shape(), DType::f32, seed++, 0.2));
    block->to(dtype);
    block->recompute = recompute;
    blocks.push_back(block);
  }
  Tensor x = random_tensor({3, 9, 32}, dtype, 200, 1.0).requires_grad_();
  Tensor y = x;
  for (auto& block : blocks) y = (*block)(y);
  sum(mul(y, random_tensor({3, 9, 32}, dtype, 201))).backward();
  Result out;
  out.tensors["y"] = y.detach();
  out.tensors["x.grad"] = x.grad();
  for (size_t b = 0; b < blocks.size(); ++b) {
    for (const auto& [name, p] : blocks[b]->named_parameters()) {
      out.tensors["blocks." + std::to_string(b) + "." + name + ".grad"] = p.grad();
    }
  }
  out.gen_offset = gen.offset();
  out.default_offset = default_generator().offset();
  return out;
}

TEST(Recompute, GradientsAreBitForBitThoseWithoutIt) {
  for (const bool random : {true, false}) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)) + (random ? ", dropout and drop path" : ", the fused paths"));
    const Result plain = run_blocks(false, dtype, random), recomputed = run_blocks(true, dtype, random);
    ASSERT_EQ(plain.tensors.size(), recomputed.tensors.size());
    for (const auto& [name, t] : plain.tensors) {
      ASSERT_TRUE(t.defined()) << name;
      EXPECT_TRUE(same_bits(recomputed.tensors.at(name), t)) << name;
    }
    EXPECT_EQ(recomputed.gen_offset, plain.gen_offset) << "the block's stream ends where it would";
    EXPECT_EQ(recomputed.default_offset, plain.default_offset) << "the default stream too";
    if (random) {
      EXPECT_GT(plain.gen_offset, 0u) << "dropout and drop-path drew from the block's generator";
    }
  }
  }
}

// A callback queued inside the rerun's backward runs once, when the whole pass ends, and after the
// gradients outside the checkpoint have arrived.
TEST(Recompute, CallbacksQueuedInTheRerunRunAtTheEndOfTheWholePass) {
  Tensor w = random_tensor({4}, DType::f32, 1).requires_grad_();
  Tensor x = random_tensor({4}, DType::f32, 2).requires_grad_();
  int ran = 0;
  bool w_grad_ready = false;
  auto fn = [&](const std::vector<Tensor>& in) {
    Tensor y = mul(in[0], 2.0);
    if (!y.requires_grad()) return std::vector<Tensor>{y};  // the first run, without gradients
    y.register_hook([&](const Tensor& g) {
      autograd::queue_callback([&] {
        ++ran;
        w_grad_ready = w.grad().defined();
      });
      return g;
    });
    return std::vector<Tensor>{y};
  };
  const Tensor y = autograd::checkpoint(fn, {x})[0];
  sum(mul(mul(y, w), w)).backward();
  EXPECT_EQ(ran, 1);
  EXPECT_TRUE(w_grad_ready) << "the callback ran before the outer pass finished";
  EXPECT_TRUE(same_bits(x.grad(), mul(mul(w.detach(), w.detach()), 2.0)));
}

// Two FP8 training steps of two blocks with dropout and drop-path on (or, with `random` off, neither:
// the fused FP8 paths, the first residual add in proj's FP8 GEMM and the MLP as one node): everything
// the steps leave (the outputs, the gradients, and every Linear's scales and amax histories after each
// step) by name.
std::map<std::string, Tensor> fp8_steps(bool recompute, const Fp8Recipe& recipe, bool random = true) {
  manual_seed(7);
  Generator gen(13);
  std::vector<std::shared_ptr<TransformerBlock>> blocks;
  uint64_t seed = 300;
  for (int b = 0; b < 2; ++b) {
    auto block =
        std::make_shared<TransformerBlock>(32, 2, 2.0, true, random ? 0.1 : 0.0, 0.0, random ? 0.2 : 0.0, &gen);
    for (const Tensor& p : block->parameters()) p.detach().copy_(random_tensor(p.shape(), DType::f32, seed++, 0.2));
    block->to(DType::bf16);
    block->recompute = recompute;
    blocks.push_back(block);
  }
  std::map<std::string, Tensor> out;
  for (int step = 0; step < 2; ++step) {
    const std::string at = "step" + std::to_string(step) + ".";
    Tensor x = random_tensor({3, 9, 32}, DType::bf16, 400 + step, 1.0).requires_grad_();
    Tensor y = x;
    {
      Fp8Autocast fp8(true, recipe);
      for (auto& block : blocks) y = (*block)(y);
    }
    sum(mul(y, random_tensor({3, 9, 32}, DType::bf16, 500 + step))).backward();
    out[at + "y"] = y.detach();
    out[at + "x.grad"] = x.grad();
    for (size_t b = 0; b < blocks.size(); ++b) {
      const std::string prefix = at + "blocks." + std::to_string(b) + ".";
      for (const auto& [name, p] : blocks[b]->named_parameters()) {
        out[prefix + name + ".grad"] = p.grad().clone();
        // A small SGD step, so the second step casts new weights.
        p.detach().copy_(sub(p.detach(), mul(p.grad(), 0.05)));
        Tensor(p).set_grad(Tensor());
      }
      for (const auto& [name, t] : fp8_state_dict(*blocks[b])) out[prefix + name] = t.clone();
    }
  }
  return out;
}

void expect_same(const std::map<std::string, Tensor>& recomputed, const std::map<std::string, Tensor>& plain) {
  ASSERT_EQ(recomputed.size(), plain.size());
  for (const auto& [name, t] : plain) {
    ASSERT_TRUE(t.defined() && recomputed.count(name)) << name;
    EXPECT_TRUE(same_bits(recomputed.at(name), t)) << name;
  }
}

// The rerun casts with the forward's scales (the scope's end has updated them since), records no amax
// and queues no update: gradients, outputs and the FP8 state are those without recompute.
TEST(Recompute, FP8DelayedScalingIsBitForBit) {
  const Fp8Recipe recipe = DelayedScaling{.amax_history_len = 3};
  for (const bool random : {true, false}) {
    SCOPED_TRACE(random ? "dropout and drop path" : "the fused paths");
    const auto plain = fp8_steps(false, recipe, random);
    expect_same(fp8_steps(true, recipe, random), plain);
    // The scales moved between the steps, so a rerun using the updated ones would have differed.
    EXPECT_FALSE(same_bits(plain.at("step1.blocks.0.mlp.fc1.fp8.forward.scale"),
                           plain.at("step0.blocks.0.mlp.fc1.fp8.forward.scale")));
  }
}

TEST(Recompute, FP8CurrentScalingIsBitForBit) {
  const Fp8Recipe recipe = CurrentScaling{};
  for (const bool random : {true, false}) {
    SCOPED_TRACE(random ? "dropout and drop path" : "the fused paths");
    expect_same(fp8_steps(true, recipe, random), fp8_steps(false, recipe, random));
  }
}

// A replay that meets an FP8 layer the first run did not run says so.
TEST(Recompute, AReplayRunningOtherFP8LayersIsAnError) {
  auto a = std::make_shared<Linear>(32, 32), b = std::make_shared<Linear>(32, 32);
  a->to(DType::bf16);
  b->to(DType::bf16);
  const Tensor x = random_tensor({4, 32}, DType::bf16, 1);
  std::shared_ptr<const Fp8ForwardRecord> record;
  {
    Fp8Autocast fp8(true, DelayedScaling{});
    Fp8ForwardRecorder recorder;
    (*a)(x);
    record = recorder.finish();
  }
  Fp8Replay replay(record);
  (*a)(x);
  EXPECT_TRUE(testing::throws_with([&] { (*b)(x); }, {"rerun", "did not", "same layers"}));
}

// LoRA adapters inside the blocks, with their dropout drawing from a generator of their own: the
// rerun rewinds that stream too.
TEST(Recompute, LoRAWithItsOwnDropoutStreamIsBitForBit) {
  auto run = [](bool recompute) {
    manual_seed(3);
    Generator lora_gen(17);
    auto block = std::make_shared<TransformerBlock>(32, 2, 2.0, true, 0.0, 0.0, 0.0);
    for (const Tensor& p : block->parameters()) p.detach().copy_(random_tensor(p.shape(), DType::f32, 40, 0.2));
    apply_lora(*block, {.rank = 4, .alpha = 8, .dropout = 0.3, .generator = &lora_gen},
               lora_targets({"qkv", "fc1", "fc2"}));
    for (const auto& [name, p] : block->named_parameters()) {  // a non-zero B, so the adapters matter
      if (name.find("lora_B") != std::string::npos) p.detach().copy_(random_tensor(p.shape(), DType::f32, 41, 0.2));
    }
    block->recompute = recompute;
    Tensor x = random_tensor({2, 5, 32}, DType::f32, 42).requires_grad_();
    sum(mul((*block)(x), random_tensor({2, 5, 32}, DType::f32, 43))).backward();
    std::map<std::string, Tensor> out{{"x.grad", x.grad()}};
    for (const auto& [name, p] : block->named_parameters()) {
      if (p.requires_grad()) out[name + ".grad"] = p.grad();
    }
    out["lora_gen.offset"] = full({1}, static_cast<double>(lora_gen.offset()), DType::f64);
    return out;
  };
  const auto plain = run(false);
  EXPECT_EQ(plain.size(), 8u) << "x, the six adapter weights and the stream's offset";
  expect_same(run(true), plain);
}

// nn::recompute on a module of the user's: an Mlp whose dropout draws from its own generator, in f32
// and under FP8, gives the plain run's gradients and leaves the stream where the plain run does.
TEST(Recompute, AnyModuleThroughNnRecomputeIsBitForBit) {
  for (const bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8" : "f32");
    auto run = [fp8](bool with_recompute) {
      Generator gen(21);
      auto mlp = std::make_shared<Mlp>(32, 64, 32, 0.2, &gen);
      for (const Tensor& p : mlp->parameters()) p.detach().copy_(random_tensor(p.shape(), DType::f32, 50, 0.2));
      const DType dtype = fp8 ? DType::bf16 : DType::f32;
      mlp->to(dtype);
      Tensor x = random_tensor({3, 7, 32}, dtype, 51).requires_grad_();
      Tensor y;
      {
        Fp8Autocast scope(fp8, DelayedScaling{.amax_history_len = 2});
        y = with_recompute ? recompute(*mlp, [&](const Tensor& t) { return mlp->forward(t); }, x) : (*mlp)(x);
      }
      sum(mul(y, random_tensor({3, 7, 32}, dtype, 52))).backward();
      std::map<std::string, Tensor> out{{"y", y.detach()}, {"x.grad", x.grad()}};
      for (const auto& [name, p] : mlp->named_parameters()) out[name + ".grad"] = p.grad();
      for (const auto& [name, t] : fp8_state_dict(*mlp)) out[name] = t.clone();
      out["gen.offset"] = full({1}, static_cast<double>(gen.offset()), DType::f64);
      return out;
    };
    const auto plain = run(false);
    EXPECT_EQ(plain.size(), fp8 ? 7u + 16u : 7u) << "y, x.grad, 4 parameter gradients, the offset (and 2 Linears' FP8 state)";
    expect_same(run(true), plain);
  }
}

// Without gradients (evaluation) the block simply runs.
TEST(Recompute, WithoutGradientsTheBlockRunsAsUsual) {
  TransformerBlock block(32, 2);
  const Tensor x = random_tensor({2, 5, 32}, DType::f32, 1);
  const Tensor plain = block(x);
  block.recompute = true;
  octet::NoGradGuard no_grad;
  EXPECT_TRUE(same_bits(block(x), plain));
}

}  // namespace
}  // namespace octet::nn
