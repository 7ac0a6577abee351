// Activation recompute (autograd/checkpoint.h, TransformerBlock::recompute): gradients with and
// without recompute are bit for bit equal, with dropout and drop-path drawing masks, in f32 and bf16;
// the random streams end where they would; callbacks queued in the rerun's backward run once, at the
// end of the whole pass; and what is not supported yet says so.
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
#include "tests/testing.h"

namespace octet::nn {
namespace {

using octet::testing::random_tensor;
using octet::testing::same_bits;

struct Result {
  std::map<std::string, Tensor> tensors;
  uint64_t gen_offset = 0, default_offset = 0;
};

// Two blocks with every kind of randomness on, one forward and backward of Σ y·r.
Result run_blocks(bool recompute, DType dtype) {
  manual_seed(5);
  Generator gen(11);
  std::vector<std::shared_ptr<TransformerBlock>> blocks;
  uint64_t seed = 100;
  for (int b = 0; b < 2; ++b) {
    // proj_drop 0.1, drop_path 0.2 on the block's generator; the default generator is touched too
    // (the second block draws from it), to show both streams are rewound.
    auto block = std::make_shared<TransformerBlock>(32, 2, 2.0, true, 0.1, 0.0, 0.2, b == 0 ? &gen : nullptr);
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
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Result plain = run_blocks(false, dtype), recomputed = run_blocks(true, dtype);
    ASSERT_EQ(plain.tensors.size(), recomputed.tensors.size());
    for (const auto& [name, t] : plain.tensors) {
      ASSERT_TRUE(t.defined()) << name;
      EXPECT_TRUE(same_bits(recomputed.tensors.at(name), t)) << name;
    }
    EXPECT_EQ(recomputed.gen_offset, plain.gen_offset) << "the block's stream ends where it would";
    EXPECT_EQ(recomputed.default_offset, plain.default_offset) << "the default stream too";
    EXPECT_GT(plain.gen_offset, 0u) << "dropout and drop-path drew from the block's generator";
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

TEST(Recompute, FP8IsRefusedWithTheReason) {
  TransformerBlock block(32, 2);
  block.to(DType::bf16);
  block.recompute = true;
  const Tensor x = random_tensor({2, 5, 32}, DType::bf16, 1).requires_grad_();
  Fp8Autocast fp8(true, DelayedScaling{});
  EXPECT_TRUE(testing::throws_with([&] { block(x); }, {"recompute", "FP8", "--recompute none"}));
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
