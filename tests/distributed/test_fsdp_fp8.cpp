// FSDP's FP8 all-gather (FsdpOptions::fp8_all_gather, distributed/fsdp.h): the weights of the FP8
// Linears are gathered as E4M3 bytes and handed to the GEMMs as they are. Against the same FSDP run
// gathering those weights in bf16 and letting each Linear cast them, training must be bit for bit the
// same (the bytes are the same) while the all-gather moves half the bytes for those weights. mpirun
// launches this at N = 2, 3 (padding) and 4 (tests/distributed/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "autograd/ops.h"
#include "core/grad_mode.h"
#include "distributed/ddp.h"
#include "distributed/fsdp.h"
#include "models/vit.h"
#include "nn/fp8.h"
#include "nn/layers.h"
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
using testing::make_vit;
using testing::world;
using testing::world_group;

// 16 wide (the FP8 GEMM needs multiples of 16), 3 blocks. A block's four weights hold
// 768 + 256 + 512 + 512 = 2048 elements: padded at N = 3, and cut mid-weight by the shards at every N.
const models::ViTConfig kFp8Vit = testing::tiny_vit_config("fp8_fsdp", /*embed_dim=*/16, /*depth=*/3);
// Step s's global batch: images from seed 3000 + s, labels (3i + s) mod 5.
const testing::SeededBatches kBatches{.image_seed = 3000, .label_stride = 3, .label_step = 1};

// This rank's 2 of a global batch of 2·N (the same on every rank), images in bf16.
Batch local_batch(int step) {
  const Batch mine = kBatches.global_batch(2 * world().size(), step).shard(world().rank(), 2);
  return {mine.images.to(DType::bf16), mine.labels};
}

// bf16 compute, decayed weights in flats of their own (what train_vit does): a block's decayed flat
// is exactly its four Linear weights, so the layout is the same with and without the FP8 gather.
// HYBRID_SHARD in shard groups of 2 where 2 divides N, else of 1.
FsdpOptions options(ShardingStrategy sharding, bool fp8_all_gather) {
  return {.sharding = sharding,
          .shard_group_size = world().size() % 2 == 0 ? 2 : 1,
          .flat_param_key = [](const std::string& name, const Tensor& p) { return optim::is_weight_decayed(name, p) ? 1 : 0; },
          .compute_dtype = DType::bf16,
          .fp8_all_gather = fp8_all_gather};
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.numel() != b.numel()) return false;
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

struct Run {
  std::vector<float> losses;
  std::vector<std::pair<std::string, Tensor>> parameters;
  Tensor eval_logits;
};

// Four AdamW steps of `micro_batches` micro-batches each under FP8 autocast, then an evaluation
// forward outside it.
Run train(FullyShardedDataParallel& fsdp, const nn::Fp8Recipe& recipe, int micro_batches) {
  optim::AdamW opt(fsdp.parameters(), 3e-3, 0.9, 0.999, 1e-8, 0.05);
  Run run;
  for (int step = 0; step < 4; ++step) {
    for (int m = 0; m < micro_batches; ++m) {
      const Batch b = local_batch(step * micro_batches + m);
      Tensor loss;
      {
        nn::Fp8Autocast fp8(true, recipe, distributed::fp8_amax_reducer(world_group()));
        loss = cross_entropy(fsdp(b.images), b.labels);
      }
      loss.backward();
      run.losses.push_back(static_cast<float>(loss.item()));
    }
    opt.step(), opt.zero_grad();
  }
  NoGradGuard no_grad;
  run.eval_logits = fsdp(local_batch(9).images);
  run.parameters = fsdp.full_parameters();
  return run;
}

void expect_bit_for_bit_like_bf16_gathers(ShardingStrategy sharding, const nn::Fp8Recipe& recipe,
                                          int micro_batches = 1) {
  FullyShardedDataParallel bf16(make_vit(kFp8Vit, 21), world_group(), options(sharding, false));
  FullyShardedDataParallel fp8(make_vit(kFp8Vit, 21), world_group(), options(sharding, true));
  const auto a = bf16.flat_parameters(), b = fp8.flat_parameters();
  EXPECT_EQ(a.size(), b.size());
  int fp8_flats = 0;
  for (size_t f = 0; f < std::min(a.size(), b.size()); ++f) {
    EXPECT_EQ(a[f].parameters, b[f].parameters) << "flat " << f << ": the layout must not change";
    EXPECT_EQ(a[f].padded_numel, b[f].padded_numel);
    EXPECT_FALSE(a[f].fp8);
    EXPECT_EQ(b[f].fp8, !b[f].unit.empty() && b[f].key == 1) << "flat " << f << " (" << b[f].unit << ")";
    fp8_flats += b[f].fp8;
  }
  EXPECT_EQ(fp8_flats, 3) << "one per block: the head stays out of FP8";
  const Run ra = train(bf16, recipe, micro_batches), rb = train(fp8, recipe, micro_batches);
  EXPECT_EQ(ra.losses, rb.losses);
  EXPECT_TRUE(bitwise_equal(ra.eval_logits, rb.eval_logits)) << "evaluation outside the FP8 scope";
  ASSERT_EQ(ra.parameters.size(), rb.parameters.size());
  for (size_t i = 0; i < ra.parameters.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(ra.parameters[i].second, rb.parameters[i].second)) << ra.parameters[i].first;
  }
  // The FP8 state the scales came from is the same too (amax histories, scales).
  const auto sa = nn::fp8_state_dict(bf16.module()), sb = nn::fp8_state_dict(fp8.module());
  EXPECT_EQ(sa.size(), sb.size());
  for (const auto& [key, t] : sa) {
    EXPECT_TRUE(sb.count(key) && bitwise_equal(t, sb.at(key))) << key;
  }
  EXPECT_EQ(sa.size(), 3u * 4u * 8u) << "3 blocks × 4 Linears × 8 entries";
}

TEST(FsdpFp8, FullShardDelayedScalingIsBitForBitTheBf16GatherRun) {
  expect_bit_for_bit_like_bf16_gathers(ShardingStrategy::FullShard,
                                       nn::DelayedScaling{.margin = 0, .amax_history_len = 4});
}
TEST(FsdpFp8, FullShardCurrentScalingIsBitForBitTheBf16GatherRun) {
  expect_bit_for_bit_like_bf16_gathers(ShardingStrategy::FullShard, nn::CurrentScaling{});
}
// Micro-batches reuse the weights' casts of the step's first forward, scales included (delayed scaling
// updates them between micro-batches), in both runs: FP8 all-gather keeps its E4M3 shards for the
// weight generation, and a Linear gathered in bf16 keeps its cast while its weight's storage is the
// same (it is released and gathered again, not replaced).
TEST(FsdpFp8, AccumulationIsBitForBitTheBf16GatherRun) {
  expect_bit_for_bit_like_bf16_gathers(ShardingStrategy::FullShard, nn::DelayedScaling{}, 3);
}
TEST(FsdpFp8, ShardGradOpIsBitForBitTheBf16GatherRun) {
  expect_bit_for_bit_like_bf16_gathers(ShardingStrategy::ShardGradOp, nn::DelayedScaling{});
}
TEST(FsdpFp8, NoShardIsBitForBitTheBf16GatherRun) {
  expect_bit_for_bit_like_bf16_gathers(ShardingStrategy::NoShard, nn::CurrentScaling{});
}
// Each rank casts its piece of its shard group's flats (the piece its shard rank names) with the
// amaxes max-reduced over that group.
TEST(FsdpFp8, HybridShardIsBitForBitTheBf16GatherRun) {
  expect_bit_for_bit_like_bf16_gathers(ShardingStrategy::HybridShard, nn::DelayedScaling{});
}

// One FULL_SHARD step: the root is gathered once, each block twice (forward, backward). The FP8 flats
// move 1 byte per element instead of bf16's 2, the rest 2 as before; the only new collective is the
// all_reduce(MAX) of the twelve weights' amaxes (4 bytes each), once per weight generation. And
// the memory the FP8 gather saves besides the bytes on the wire (MemoryLedger::fp8_weight_casts).
TEST(FsdpFp8, TheGatherMovesOneByteForEachFp8WeightElement) {
  const Batch b = local_batch(0);
  int64_t gather[2] = {0, 0}, reduce[2] = {0, 0}, casts[2] = {0, 0}, shard_casts[2] = {0, 0};
  int64_t expected_fp8 = 0, expected_bf16 = 0, fp8_weights = 0, fp8_shard_elements = 0;
  for (int use_fp8 = 0; use_fp8 < 2; ++use_fp8) {
    FullyShardedDataParallel fsdp(make_vit(kFp8Vit, 22), world_group(),
                                  options(ShardingStrategy::FullShard, use_fp8 == 1));
    world().reset_counters();
    Tensor loss;
    {
      nn::Fp8Autocast fp8(true, nn::DelayedScaling{}, distributed::fp8_amax_reducer(world_group()));
      loss = cross_entropy(fsdp(b.images), b.labels);
    }
    loss.backward();
    const auto c = world().counters();
    gather[use_fp8] = c.payload_of(Collective::AllGather);
    reduce[use_fp8] = c.payload_of(Collective::AllReduce);
    casts[use_fp8] = fsdp.memory_ledger().fp8_weight_casts;
    shard_casts[use_fp8] = fsdp.memory_ledger().fp8_shard_casts;
    if (use_fp8 == 1) {
      for (const auto& f : fsdp.flat_parameters()) {
        fp8_weights += f.fp8 ? f.numel : 0;
        fp8_shard_elements += f.fp8 ? f.shard_numel : 0;
        const int64_t passes = f.unit.empty() ? 1 : 2;
        expected_fp8 += passes * (f.fp8 ? 1 : 2) * f.padded_numel;
        expected_bf16 += passes * 2 * f.padded_numel;
      }
    }
  }
  EXPECT_EQ(gather[0], expected_bf16);
  EXPECT_EQ(gather[1], expected_fp8);
  EXPECT_LT(gather[1], gather[0] * 3 / 4) << "the weights are most of the bytes";
  EXPECT_EQ(reduce[1] - reduce[0], 4 * 12);
  // Gathered in bf16, every FP8 Linear keeps its own E4M3 cast and transpose of its weight, for the
  // whole model at once; gathered in FP8, those are views of the (released) gathered buffers.
  EXPECT_EQ(fp8_weights, 3 * 2048);
  EXPECT_EQ(casts[0], 2 * fp8_weights);
  EXPECT_EQ(casts[1], 0);
  // Instead each rank keeps the E4M3 cast of its shards of those weights: 1 byte per shard element.
  EXPECT_EQ(shard_casts[0], 0);
  EXPECT_EQ(shard_casts[1], fp8_shard_elements);
  EXPECT_GT(fp8_shard_elements, 0);
}

// While an FP8 forward runs, an FP8 Linear's weight parameter holds no bytes: the bf16 weight is never
// gathered. Evaluation outside the scope gathers it as usual. Afterwards nothing stays gathered.
TEST(FsdpFp8, TheBf16WeightIsNeverGatheredInAnFp8Pass) {
  auto model = make_vit(kFp8Vit, 23);
  FullyShardedDataParallel fsdp(model, world_group(), options(ShardingStrategy::FullShard, true));
  std::shared_ptr<nn::Linear> found;
  for (const auto& [name, m] : model->named_modules()) {
    if (name == "blocks.1.mlp.fc1") found = std::dynamic_pointer_cast<nn::Linear>(m);
  }
  ASSERT_NE(found, nullptr);
  nn::Linear& fc1 = *found;
  std::vector<int> seen;  // 1: the weight had bytes in fc1's forward
  fc1.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor&) {
    seen.push_back(fc1.weight.storage()->allocated() ? 1 : 0);
    return Tensor();
  });
  const Batch b = local_batch(0);
  {
    nn::Fp8Autocast fp8(true, nn::CurrentScaling{}, distributed::fp8_amax_reducer(world_group()));
    cross_entropy(fsdp(b.images), b.labels).backward();
  }
  {
    NoGradGuard no_grad;
    fsdp(b.images);
  }
  EXPECT_EQ(seen, (std::vector<int>{0, 1}));
  EXPECT_EQ(fsdp.memory_ledger().gathered, 0);
  EXPECT_EQ(fsdp.units_gathered(), 0);
  EXPECT_LE(fsdp.max_units_gathered(), 2);
}

}  // namespace
}  // namespace octet
