// Activation recompute under FSDP (TransformerBlock::recompute inside FSDP units): each block's
// backward gathers its unit, reruns the block's forward from its saved input, and backpropagates
// through that. Against the same FSDP run without recompute, training must be bit for bit the same
// (losses, every parameter, the FP8 state), with dropout and drop-path drawing masks, in f32, bf16 and
// FP8 (delayed scaling, with and without the FP8 all-gather), and the rerun must not cost a gather of
// its own: it runs on the gather backward makes anyway. mpirun launches this at N = 2 and 3
// (tests/distributed/CMakeLists.txt).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>

#include "autograd/ops.h"
#include "core/grad_mode.h"
#include "distributed/ddp.h"
#include "distributed/fsdp.h"
#include "models/vit.h"
#include "nn/fp8.h"
#include "optim/optim.h"
#include "tests/distributed/model_testing.h"
#include "tests/distributed/mpi_main.h"
#include "tests/testing.h"

namespace octet {
namespace {

using distributed::Collective;
using distributed::FsdpOptions;
using distributed::FullyShardedDataParallel;
using distributed::ShardingStrategy;
using testing::Batch;
using testing::world;
using testing::world_group;

// 16 wide (FP8 GEMMs need multiples of 16), 3 blocks, dropout and drop-path on.
models::ViTConfig recompute_vit() {
  models::ViTConfig config = testing::tiny_vit_config("recompute_fsdp", /*embed_dim=*/16, /*depth=*/3);
  config.drop_rate = 0.1;
  config.drop_path_rate = 0.2;
  return config;
}
const testing::SeededBatches kBatches{.image_seed = 5000, .label_stride = 2, .label_step = 3};

struct Setting {
  ShardingStrategy sharding = ShardingStrategy::FullShard;
  DType compute = DType::f32;
  std::optional<nn::Fp8Recipe> fp8 = std::nullopt;  // FP8 autocast around the forward
  bool fp8_all_gather = false;
  int micro_batches = 1;
};

struct Run {
  std::vector<float> losses;
  std::vector<std::pair<std::string, Tensor>> parameters;
  std::map<std::string, Tensor> fp8_state;
  int64_t all_gathers = 0;
};

// Three AdamW steps of `micro_batches` micro-batches each. The model's generator initialises it and
// then draws the dropout and drop-path masks, each rank from its own stream.
Run train(const Setting& s, bool recompute) {
  Generator gen(31);  // outlives the model, whose Dropout and DropPath modules keep it
  auto model = std::make_shared<models::VisionTransformer>(recompute_vit(), true, &gen);
  gen.set_state(100 + static_cast<uint64_t>(world().rank()), 0);
  for (const auto& block : model->transformer_blocks()) block->recompute = recompute;
  FullyShardedDataParallel fsdp(model, world_group(),
                                {.sharding = s.sharding,
                                 .flat_param_key = [](const std::string& name, const Tensor& p) {
                                   return optim::is_weight_decayed(name, p) ? 1 : 0;
                                 },
                                 .compute_dtype = s.compute,
                                 .fp8_all_gather = s.fp8_all_gather});
  optim::AdamW opt(fsdp.parameters(), 3e-3, 0.9, 0.999, 1e-8, 0.05);
  world().reset_counters();
  Run run;
  for (int step = 0; step < 3; ++step) {
    for (int m = 0; m < s.micro_batches; ++m) {
      const Batch b = kBatches.global_batch(2 * world().size(), step * s.micro_batches + m).shard(world().rank(), 2);
      Tensor loss;
      {
        std::optional<nn::Fp8Autocast> fp8;
        if (s.fp8) fp8.emplace(true, *s.fp8, distributed::fp8_amax_reducer(world_group()));
        loss = cross_entropy(fsdp(b.images.to(s.compute)), b.labels);
      }
      loss.backward();
      run.losses.push_back(static_cast<float>(loss.item()));
    }
    fsdp.clip_grad_norm_(1.0);
    opt.step(), opt.zero_grad();
  }
  run.all_gathers = world().counters().calls_of(Collective::AllGather);
  run.parameters = fsdp.full_parameters();
  for (const auto& [key, t] : nn::fp8_state_dict(fsdp.module())) run.fp8_state[key] = t.clone();
  return run;
}

void expect_bit_for_bit(const Setting& s) {
  const Run plain = train(s, false), recomputed = train(s, true);
  EXPECT_EQ(recomputed.losses, plain.losses);
  ASSERT_EQ(recomputed.parameters.size(), plain.parameters.size());
  for (size_t i = 0; i < plain.parameters.size(); ++i) {
    EXPECT_TRUE(testing::same_bits(recomputed.parameters[i].second, plain.parameters[i].second))
        << plain.parameters[i].first;
  }
  EXPECT_EQ(recomputed.fp8_state.size(), plain.fp8_state.size());
  for (const auto& [key, t] : plain.fp8_state) {
    ASSERT_TRUE(recomputed.fp8_state.count(key)) << key;
    EXPECT_TRUE(testing::same_bits(recomputed.fp8_state.at(key), t)) << key;
  }
  if (s.fp8) {
    EXPECT_EQ(plain.fp8_state.size(), 3u * 4u * 8u) << "every block Linear ran in FP8";
  }
  EXPECT_EQ(recomputed.all_gathers, plain.all_gathers) << "the rerun uses the unit backward gathers anyway";
  EXPECT_GT(plain.all_gathers, 0);
}

TEST(FsdpRecompute, FullShardF32IsBitForBit) { expect_bit_for_bit({}); }

TEST(FsdpRecompute, FullShardBf16WithMicroBatchesIsBitForBit) {
  expect_bit_for_bit({.compute = DType::bf16, .micro_batches = 2});
}

TEST(FsdpRecompute, ShardGradOpBf16IsBitForBit) {
  expect_bit_for_bit({.sharding = ShardingStrategy::ShardGradOp, .compute = DType::bf16});
}

TEST(FsdpRecompute, Fp8DelayedScalingIsBitForBit) {
  expect_bit_for_bit({.compute = DType::bf16, .fp8 = nn::DelayedScaling{.amax_history_len = 4}, .micro_batches = 2});
}

TEST(FsdpRecompute, Fp8AllGatherIsBitForBit) {
  expect_bit_for_bit({.compute = DType::bf16, .fp8 = nn::DelayedScaling{.amax_history_len = 4}, .fp8_all_gather = true});
}

}  // namespace
}  // namespace octet
