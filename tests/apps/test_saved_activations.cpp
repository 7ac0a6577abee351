// The saved-activation figure of train_vit's step (StepResult::saved_activation_bytes, logged and
// written to the metrics' memory_ledger): what the forward leaves alive for backward. Under
// --recompute blocks each block keeps exactly its input, so two more blocks add exactly two block
// inputs (plus, under FP8, the copies of the forward scales the rerun needs); without recompute they
// add everything a block's backward reads, many times more. Counted by core/storage.h's
// memory_in_use, which these tests also check against tensors of known size.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "apps/train_step.h"
#include "core/random.h"
#include "core/storage.h"
#include "models/vit.h"
#include "nn/fp8.h"
#include "optim/optim.h"
#include "tests/testing.h"

namespace octet {
namespace {

TEST(MemoryInUse, CountsTheHostStoragesOctetAllocated) {
  for (const int64_t n : {int64_t{100}, int64_t{1} << 20}) {  // a small block, and one from the host cache's classes
    const size_t before = memory_in_use(Device::cpu());
    {
      const Tensor t = empty({n}, DType::f32);
      EXPECT_EQ(memory_in_use(Device::cpu()) - before, static_cast<size_t>(4 * n));
      t.storage()->release();
      EXPECT_EQ(memory_in_use(Device::cpu()), before) << "a released storage holds nothing";
      t.storage()->reallocate();
      EXPECT_EQ(memory_in_use(Device::cpu()) - before, static_cast<size_t>(4 * n));
    }
    EXPECT_EQ(memory_in_use(Device::cpu()), before);
  }
}

// 8×8 images in four 4×4 patches: 5 tokens of 16 per image, 4 images a batch.
constexpr int64_t kBatch = 4, kTokens = 5, kDim = 16;

// The second step's figure (the first also makes what FP8 keeps across steps: its scaling state).
// drop_rate: the MLP's dropout; at 0 its GELU and fc2 run as autograd's gelu_linear, unless
// `split_mlp` puts a (no-op) hook on each MLP's GELU, which runs the modules one after the other.
int64_t saved_bytes(int64_t depth, bool recompute, DType dtype, bool fp8, double drop_rate = 0.1,
                    bool split_mlp = false) {
  const models::ViTConfig config{.name = "tiny_saved", .img_size = 8, .patch_size = 4, .in_chans = 1, .num_classes = 5,
                                 .embed_dim = kDim, .depth = depth, .num_heads = 2, .mlp_ratio = 2.0,
                                 .drop_rate = drop_rate, .drop_path_rate = 0.2};
  Generator gen(5);
  models::VisionTransformer model(config, true, &gen);
  model.to(dtype);
  for (const auto& block : model.transformer_blocks()) {
    block->recompute = recompute;
    if (split_mlp) {
      block->mlp->act->register_forward_hook([](nn::Module&, const Tensor&, const Tensor&) { return Tensor(); });
    }
  }
  optim::SGD optimizer(model.parameters(), 1e-2);
  const TrainStep step{.model = model,
                       .criterion = nn::CrossEntropyLoss(),
                       .optimizer = optimizer,
                       .backward = [](const Tensor& loss, bool) { Tensor(loss).backward(); },
                       .fp8 = fp8,
                       .fp8_recipe = nn::DelayedScaling{.amax_history_len = 4},
                       .held_bytes = [&] { return nn::fp8_weight_cast_bytes(model) + nn::fp8_scaling_bytes(model); }};
  model.train();
  StepResult result;
  for (int s = 0; s < 2; ++s) {
    result = step([&] {
      return data::Batch{testing::random_tensor({kBatch, 1, 8, 8}, DType::f32, 10 + static_cast<uint64_t>(s)),
                         from_vector<int64_t>({0, 1, 2, 4}, {kBatch}), 0, 0};
    });
  }
  return result.saved_activation_bytes;
}

void expect_one_input_per_block(DType dtype, bool fp8, int64_t extra_per_block) {
  const int64_t block_input = kBatch * kTokens * kDim * static_cast<int64_t>(dtype_size(dtype));
  const int64_t recompute_2 = saved_bytes(2, true, dtype, fp8), recompute_4 = saved_bytes(4, true, dtype, fp8);
  const int64_t plain_2 = saved_bytes(2, false, dtype, fp8), plain_4 = saved_bytes(4, false, dtype, fp8);
  EXPECT_EQ(recompute_4 - recompute_2, 2 * (block_input + extra_per_block)) << "two more blocks, two more inputs";
  EXPECT_GT(plain_4 - plain_2, 8 * (recompute_4 - recompute_2)) << "a block's backward reads far more than its input";
  EXPECT_GT(recompute_2, 0);
  EXPECT_LT(recompute_4, plain_4);
}

TEST(SavedActivations, RecomputeKeepsOneBlockInputPerBlockF32) { expect_one_input_per_block(DType::f32, false, 0); }

TEST(SavedActivations, RecomputeKeepsOneBlockInputPerBlockBf16) { expect_one_input_per_block(DType::bf16, false, 0); }

// Under FP8 a block's rerun also keeps the forward scales and scale_invs of its four Linears: 4 × 2 × 2
// floats.
TEST(SavedActivations, RecomputeKeepsOneBlockInputPerBlockFp8) {
  expect_one_input_per_block(DType::bf16, true, 4 * 2 * 2 * 4);
}

// An MLP whose GELU feeds fc2 directly keeps the GELU's input for backward but not its output
// (autograd's gelu_linear makes it again): each block saves one [tokens, hidden] tensor less than the
// modules one after the other, exactly. hidden = 2 × 16.
TEST(SavedActivations, AnMlpKeepsTheGeluInputButNotItsOutput) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    const int64_t hidden_tensor = kBatch * kTokens * 2 * kDim * static_cast<int64_t>(dtype_size(dtype));
    for (int64_t depth : {1, 3}) {
      const int64_t fused = saved_bytes(depth, false, dtype, false, 0.0);
      const int64_t split = saved_bytes(depth, false, dtype, false, 0.0, /*split_mlp=*/true);
      EXPECT_EQ(split - fused, depth * hidden_tensor) << dtype_name(dtype) << ", depth " << depth;
    }
  }
}

}  // namespace
}  // namespace octet
