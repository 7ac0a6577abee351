// FSDP's HYBRID_SHARD, run by mpirun at 4 ranks (2 "nodes" of 2) and 6 ranks (3 of 2, and 2 of 3):
// each shard group of G consecutive ranks shards the model, and the gradient shards are averaged
// across the replicas. At the same global batch it must train as FULL_SHARD over the whole world,
// as DDP and as one process do (the bounds of test_fsdp.cpp), hold 16 bytes per parameter / G with
// AdamW, and move its collectives in the groups the design puts them in.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "distributed/ddp.h"
#include "distributed/fsdp.h"
#include "tests/distributed/collective_testing.h"
#include "tests/distributed/fsdp_testing.h"
#include "tests/distributed/mpi_main.h"
#include "tests/testing.h"

namespace octet {
namespace {

using distributed::Collective;
using distributed::FsdpOptions;
using distributed::FullyShardedDataParallel;
using distributed::ShardingStrategy;
using testing::make_vit;
using testing::Trajectory;
using testing::world;
using testing::world_group;

const models::ViTConfig& kTinyVit = testing::kTinyFsdpVit;

FsdpOptions hybrid(int shard_group_size, ShardingStrategy sharding = ShardingStrategy::HybridShard) {
  return FsdpOptions{.sharding = sharding, .shard_group_size = shard_group_size};
}

// Every G that divides the world, the degenerate ones included: G = 1 (every rank a replica, as DDP)
// and G = N (one replica, as FULL_SHARD).
std::vector<int> shard_group_sizes() {
  std::vector<int> sizes;
  for (int g = 1; g <= world().size(); ++g) {
    if (world().size() % g == 0) sizes.push_back(g);
  }
  return sizes;
}

Trajectory train_fsdp(FullyShardedDataParallel& fsdp) {
  return testing::train_adamw([&](const Tensor& x) { return fsdp(x); }, fsdp.parameters(),
                              [&](double max_norm) { return static_cast<double>(fsdp.clip_grad_norm_(max_norm)); },
                              /*micro_batches=*/1, &world());
}

int64_t padded_total(const FullyShardedDataParallel& fsdp) {
  int64_t padded = 0;
  for (const auto& f : fsdp.flat_parameters()) padded += f.padded_numel;
  return padded;
}

TEST(HybridShard, TrainsAsFullShardDdpAndOneProcessAtTheSameGlobalBatch) {
  const int rank = world().rank();
  auto reference = make_vit(kTinyVit, 9);
  const Trajectory one_process = testing::train_one_process(*reference, 1);
  FullyShardedDataParallel full(make_vit(kTinyVit, 9), world_group());
  const Trajectory full_shard = train_fsdp(full);
  auto ddp_model = make_vit(kTinyVit, 9);
  distributed::DistributedDataParallel ddp(ddp_model, world_group());
  const Trajectory data_parallel = testing::train_adamw(
      [&](const Tensor& x) { return ddp(x); }, ddp_model->parameters(),
      [&](double max_norm) { return static_cast<double>(optim::clip_grad_norm_(ddp_model->parameters(), max_norm)); },
      1, &world());
  for (int g : shard_group_sizes()) {
    SCOPED_TRACE("G = " + std::to_string(g));
    // Ranks other than 0 start elsewhere: wrapping broadcasts rank 0's weights to every replica.
    FullyShardedDataParallel fsdp(make_vit(kTinyVit, rank == 0 ? 9 : 50 + rank), world_group(), hybrid(g));
    const Trajectory got = train_fsdp(fsdp);
    testing::expect_same_trajectory(got, one_process, 1e-5, "hybrid against one process");
    testing::expect_same_trajectory(got, full_shard, 1e-5, "hybrid against FULL_SHARD");
    testing::expect_same_trajectory(got, data_parallel, 1e-5, "hybrid against DDP");
    EXPECT_LE(testing::max_relative_difference(fsdp.full_parameters(), *reference), 1e-5);
    EXPECT_LE(fsdp.max_units_gathered(), 2) << "FULL_SHARD's gathering within the shard group";
    EXPECT_EQ(fsdp.units_gathered(), 0);
    // HYBRID_SHARD_GRAD_OP: SHARD_GRAD_OP within the group, the same replicas, the same training.
    FullyShardedDataParallel grad_op(make_vit(kTinyVit, 9), world_group(), hybrid(g, ShardingStrategy::HybridShardGradOp));
    testing::expect_same_trajectory(train_fsdp(grad_op), full_shard, 1e-5, "hybrid-grad-op against FULL_SHARD");
    EXPECT_EQ(grad_op.units_gathered(), 0);
  }
}

// HYBRID_SHARD_GRAD_OP keeps a unit gathered from its forward to its backward: one gather of each
// block per step in the shard group, where HYBRID_SHARD gathers it again for backward; the replicas'
// all-reduce is the same.
TEST(HybridShard, GradOpGathersEachBlockOncePerStep) {
  for (int g : shard_group_sizes()) {
    SCOPED_TRACE("G = " + std::to_string(g));
    FullyShardedDataParallel fsdp(make_vit(kTinyVit, 4), world_group(), hybrid(g, ShardingStrategy::HybridShardGradOp));
    int64_t root = 0, blocks = 0, shards = 0;
    for (const auto& f : fsdp.flat_parameters()) (f.unit.empty() ? root : blocks) += f.padded_numel, shards += f.shard_numel;
    const testing::Batch batch = testing::kFsdpBatches.global_batch(2 * world().size(), 0).shard(world().rank(), 2);
    fsdp.shard_group()->reset_counters();
    fsdp.replicate_group()->reset_counters();
    cross_entropy(fsdp(batch.images), batch.labels).backward();
    EXPECT_EQ(fsdp.shard_group()->counters().payload_of(Collective::AllGather), 4 * (root + blocks));
    EXPECT_EQ(fsdp.shard_group()->counters().payload_of(Collective::ReduceScatter), 4 * (root + blocks));
    EXPECT_EQ(fsdp.replicate_group()->counters().payload_of(Collective::AllReduce), 4 * shards);
    EXPECT_EQ(fsdp.replicate_group()->size(), world().size() / g);
  }
}

// Shard group c is ranks [c·G, (c+1)·G), replicate group c the ranks r with r % G = c; each flat is
// padded to a multiple of G and split into G shards.
TEST(HybridShard, ShardsWithinConsecutiveRanksAndReplicatesAcrossThem) {
  const int n = world().size(), rank = world().rank();
  for (int g : shard_group_sizes()) {
    SCOPED_TRACE("G = " + std::to_string(g));
    FullyShardedDataParallel fsdp(make_vit(kTinyVit, 3), world_group(), hybrid(g));
    EXPECT_EQ(fsdp.process_group().get(), &world());
    EXPECT_EQ(fsdp.shard_group()->size(), g);
    EXPECT_EQ(fsdp.shard_group()->rank(), rank % g);
    ASSERT_NE(fsdp.replicate_group(), nullptr);
    EXPECT_EQ(fsdp.replicate_group()->size(), n / g);
    EXPECT_EQ(fsdp.replicate_group()->rank(), rank / g);
    for (const auto& f : fsdp.flat_parameters()) {
      EXPECT_EQ(f.shard_numel * g, f.padded_numel);
      EXPECT_LT(f.padded_numel - f.numel, g);
    }
  }
  FullyShardedDataParallel full(make_vit(kTinyVit, 3), world_group());
  EXPECT_EQ(full.shard_group().get(), &world());
  EXPECT_EQ(full.replicate_group(), nullptr);
}

// AdamW: 4 bytes of parameter, 4 of gradient and 8 of moments per shard element, and a shard is
// 1/G of the padded flats: 16·(Ψ + padding)/G on every rank, padding < G per flat.
TEST(HybridShard, LedgerHoldsSixteenBytesPerParameterOverG) {
  for (int g : shard_group_sizes()) {
    SCOPED_TRACE("G = " + std::to_string(g));
    auto model = make_vit(kTinyVit, 6);
    const int64_t psi = model->num_parameters();
    FullyShardedDataParallel fsdp(model, world_group(), hybrid(g));
    optim::AdamW optimizer(fsdp.parameters(), 1e-3);
    const testing::Batch batch = testing::kFsdpBatches.global_batch(2 * world().size(), 0).shard(world().rank(), 2);
    cross_entropy(fsdp(batch.images), batch.labels).backward();
    optimizer.step();
    int64_t padding = 0;
    for (const auto& f : fsdp.flat_parameters()) padding += (f.numel + g - 1) / g * g - f.numel;
    EXPECT_LE(padding, static_cast<int64_t>(fsdp.flat_parameters().size()) * (g - 1));
    EXPECT_EQ(padded_total(fsdp), psi + padding);
    const auto ledger = fsdp.memory_ledger(&optimizer);
    EXPECT_EQ(ledger.parameters * g, 4 * (psi + padding));
    EXPECT_EQ(ledger.gradients * g, 4 * (psi + padding));
    EXPECT_EQ(ledger.optimizer * g, 8 * (psi + padding));
    EXPECT_EQ(ledger.sharded_total() * g, 16 * (psi + padding));
    EXPECT_EQ(ledger.gathered, 0);
  }
}

// One forward and backward: the shard group gathers every block twice and the root once, and
// reduce-scatters every flat gradient, as FULL_SHARD does over G ranks; the replicate group
// all-reduces the f32 gradient shards (1/G of the gradient) once; the world group moves nothing.
TEST(HybridShard, EachGroupMovesWhatTheDesignGivesIt) {
  for (int g : shard_group_sizes()) {
    SCOPED_TRACE("G = " + std::to_string(g));
    FullyShardedDataParallel fsdp(make_vit(kTinyVit, 4), world_group(), hybrid(g));
    int64_t root = 0, blocks = 0, shards = 0;
    for (const auto& f : fsdp.flat_parameters()) (f.unit.empty() ? root : blocks) += f.padded_numel, shards += f.shard_numel;
    const testing::Batch batch = testing::kFsdpBatches.global_batch(2 * world().size(), 0).shard(world().rank(), 2);
    world().reset_counters();
    fsdp.shard_group()->reset_counters();
    fsdp.replicate_group()->reset_counters();
    cross_entropy(fsdp(batch.images), batch.labels).backward();
    const auto shard = fsdp.shard_group()->counters(), replicate = fsdp.replicate_group()->counters();
    EXPECT_EQ(shard.payload_of(Collective::AllGather), 4 * (root + 2 * blocks));
    EXPECT_EQ(shard.payload_of(Collective::ReduceScatter), 4 * (root + blocks));
    EXPECT_EQ(shard.calls_of(Collective::AllReduce), 0);
    EXPECT_EQ(replicate.payload_of(Collective::AllReduce), 4 * shards);
    EXPECT_EQ(replicate.calls_of(Collective::AllReduce), static_cast<int64_t>(fsdp.flat_parameters().size()));
    EXPECT_EQ(replicate.calls_of(Collective::AllGather) + replicate.calls_of(Collective::ReduceScatter), 0);
    EXPECT_DOUBLE_EQ(replicate.bus_bytes(Collective::AllReduce), 2.0 * (replicate.world_size - 1) /
                                                                     replicate.world_size * 4 * shards);
    for (int c = 0; c < distributed::kNumCollectives; ++c) EXPECT_EQ(world().counters().calls[c], 0);
  }
}

// The replicas of a shard stay equal bit for bit (the all-reduce gives every one the same average,
// and AdamW steps them alike): what lets one replica alone write a checkpoint's shards.
TEST(HybridShard, ReplicasHoldTheSameShardsBitForBit) {
  const int n = world().size();
  for (int g : shard_group_sizes()) {
    if (g == n) continue;  // one replica
    SCOPED_TRACE("G = " + std::to_string(g));
    FullyShardedDataParallel fsdp(make_vit(kTinyVit, 5), world_group(), hybrid(g));
    train_fsdp(fsdp);
    distributed::ProcessGroup& replicas = *fsdp.replicate_group();
    for (const Tensor& shard : fsdp.all_shards()) {
      const int64_t s = shard.numel();
      const Tensor everyones = empty({s * replicas.size()}, DType::f32);
      replicas.all_gather(everyones, shard.detach())->wait();
      for (int k = 0; k < replicas.size(); ++k) {
        EXPECT_TRUE(testing::equals_exactly(everyones.narrow(k * s, s), shard.detach())) << "replica " << k;
      }
    }
  }
}

// Sizes every rank shares, so every rank throws before any collective and none is left waiting.
TEST(HybridShard, AShardGroupSizeThatDoesNotDivideTheWorldIsAClearError) {
  const int n = world().size();
  const int bad = n == 4 ? 3 : 4;
  const std::string ns = std::to_string(n), bads = std::to_string(bad);
  EXPECT_TRUE(testing::throws_with([&] { FullyShardedDataParallel(make_vit(kTinyVit, 1), world_group(), hybrid(bad)); },
                                   {"world size " + ns, "shard group size " + bads, "divides " + ns,
                                    "multiple of " + bads}));
  EXPECT_TRUE(testing::throws_with([&] { FullyShardedDataParallel(make_vit(kTinyVit, 1), world_group(), hybrid(-1)); },
                                   {"shard_group_size -1"}));
  EXPECT_EQ(distributed::parse_sharding("hybrid"), ShardingStrategy::HybridShard);
  EXPECT_EQ(distributed::parse_sharding("hybrid-grad-op"), ShardingStrategy::HybridShardGradOp);
  const Tensor t = from_vector<int64_t>({world().rank() + 1}, {1});
  world().all_reduce(t, distributed::ReduceOp::Sum)->wait();
  EXPECT_EQ(t.item<int64_t>(), int64_t{n} * (n + 1) / 2) << "the ranks fell out of step";
}

}  // namespace
}  // namespace octet
