// DistributedDataParallel against one process: each rank trains on its shard of every batch, and a
// reference model in the same process trains on the whole batch. After each step the parameters
// must agree. mpirun launches this at N = 2 and 4 (tests/distributed/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "autograd/ops.h"
#include "distributed/ddp.h"
#include "models/vit.h"
#include "nn/fp8.h"
#include "nn/layers.h"
#include "optim/optim.h"
#include "tests/distributed/model_testing.h"
#include "tests/distributed/mpi_main.h"
#include "tests/testing.h"

namespace octet {
namespace {

using distributed::DdpOptions;
using distributed::DistributedDataParallel;
using testing::Batch;
using testing::make_vit;
using testing::max_relative_difference;
using testing::world;

// Parameter counts that no world size divides evenly, two blocks so buckets have an order to keep.
const models::ViTConfig kTinyVit = testing::tiny_vit_config("tiny_test", /*embed_dim=*/12, /*depth=*/2);
// Step s's global batch: images from seed 1000 + s, labels (7i + 3s) mod 5.
const testing::SeededBatches kBatches{.image_seed = 1000, .label_stride = 7, .label_step = 3};

Tensor mse_loss(const Tensor& prediction, const Tensor& target) {
  const Tensor d = prediction - target;
  return mean(d * d);
}

TEST(Ddp, FiveAdamWStepsMatchOneProcessOnTheWholeBatch) {
  const int n = world().size(), rank = world().rank();
  const int64_t per_rank = 3, global = per_rank * n;
  auto reference = make_vit(kTinyVit, 7);
  // Every rank but 0 starts from different weights: the wrap must broadcast rank 0's.
  auto model = make_vit(kTinyVit, rank == 0 ? 7 : 100 + rank);
  DistributedDataParallel ddp(model, testing::world_group());
  EXPECT_EQ(max_relative_difference(*model, *reference), 0.0) << "the wrap did not broadcast rank 0's parameters";

  // lr 1e-3: see NoSyncAccumulationMatchesOneProcess for why Adam needs it at this tolerance.
  optim::AdamW ref_opt(reference->parameters(), 1e-3, 0.9, 0.999, 1e-8, 0.05);
  optim::AdamW opt(model->parameters(), 1e-3, 0.9, 0.999, 1e-8, 0.05);
  double first_loss_gap = 0;
  for (int step = 0; step < 5; ++step) {
    const Batch all = kBatches.global_batch(global, step), mine = all.shard(rank, per_rank);
    const Tensor ref_loss = cross_entropy((*reference)(all.images), all.labels);
    ref_loss.backward();

    const Tensor loss = cross_entropy(ddp(mine.images), mine.labels);
    loss.backward();
    // The averaged gradients are the whole batch's, to f32 summation order (the ranks' partial sums
    // over 3 images against one sum over 3N, then the average: a few ulps of the larger terms).
    EXPECT_LE(testing::max_gradient_relative_difference(*model, *reference), 1e-5) << "step " << step + 1;
    ref_opt.step();
    ref_opt.zero_grad();
    opt.step();
    opt.zero_grad();
    // The mean of the ranks' losses is the whole batch's loss.
    const Tensor mean_loss = loss.detach().clone();
    world().all_reduce(mean_loss, distributed::ReduceOp::Avg)->wait();
    if (step == 0) first_loss_gap = std::abs(mean_loss.item() - ref_loss.item());
    EXPECT_LE(max_relative_difference(*model, *reference), 1e-5) << "after step " << step + 1;
  }
  EXPECT_LE(first_loss_gap, 1e-6 * 2);
}

// A module whose parameters are registered in the opposite order to their use, and whose two
// branches are summed in a rank-dependent order: gradient hooks fire in a different order from the
// registration order, and in different orders on different ranks.
class Tangled : public nn::Module {
 public:
  explicit Tangled(int rank) : Module("Tangled"), rank_(rank) {
    out = register_module("out", std::make_shared<nn::Linear>(6, 3));
    left = register_module("left", std::make_shared<nn::Linear>(5, 6));
    right = register_module("right", std::make_shared<nn::Linear>(5, 6));
    Generator gen(3);
    out->reset_parameters(gen), left->reset_parameters(gen), right->reset_parameters(gen);
  }
  Tensor forward(const Tensor& x) override {
    const Tensor l = (*left)(x), r = (*right)(x);
    return (*out)(gelu(rank_ % 2 == 0 ? l + r : r + l));
  }
  std::shared_ptr<nn::Linear> out, left, right;

 private:
  int rank_;
};

TEST(Ddp, HooksFiringOutOfRegistrationOrderGiveTheSameResult) {
  const int n = world().size(), rank = world().rank();
  const int64_t per_rank = 4, global = per_rank * n;
  auto reference = std::make_shared<Tangled>(0);
  auto model = std::make_shared<Tangled>(rank);
  // A bucket per parameter, so the order of the buckets matters.
  DistributedDataParallel ddp(model, testing::world_group(),
                              DdpOptions{.bucket_cap_mb = 1e-9, .first_bucket_cap_mb = 1e-9});
  ASSERT_EQ(ddp.buckets().size(), model->parameters().size());
  optim::AdamW ref_opt(reference->parameters(), 1e-2);
  optim::AdamW opt(model->parameters(), 1e-2);
  for (int step = 0; step < 5; ++step) {
    const Tensor x = testing::random_tensor({global, 5}, DType::f32, 50 + step);
    const Tensor target = testing::random_tensor({global, 3}, DType::f32, 80 + step);
    mse_loss((*reference)(x), target).backward();
    mse_loss(ddp(x.narrow(rank * per_rank, per_rank)), target.narrow(rank * per_rank, per_rank)).backward();
    EXPECT_LE(testing::max_gradient_relative_difference(*model, *reference), 1e-5) << "step " << step + 1;
    ref_opt.step();
    ref_opt.zero_grad();
    opt.step();
    opt.zero_grad();
  }
  EXPECT_LE(max_relative_difference(*model, *reference), 1e-5);
}

TEST(Ddp, NoSyncAccumulationMatchesOneProcess) {
  const int n = world().size(), rank = world().rank();
  const int64_t per_rank = 2, micro_batches = 3, global = per_rank * n;
  auto reference = make_vit(kTinyVit, 11);
  auto model = make_vit(kTinyVit, 11);
  DistributedDataParallel ddp(model, testing::world_group());
  // Summing three micro-batches per rank and then averaging ranks adds in another order than one
  // process does: gradients differ in the last bits. Adam's update lr·m/√v normalises each
  // coordinate, so a gradient near zero with a relative error ε moves its parameter by ~lr·ε: at
  // lr 1e-2 that reaches 1e-5 after 5 steps; lr 1e-3 keeps the comparison about DDP, not Adam.
  optim::AdamW ref_opt(reference->parameters(), 1e-3);
  optim::AdamW opt(model->parameters(), 1e-3);
  world().reset_counters();
  for (int step = 0; step < 5; ++step) {
    for (int m = 0; m < micro_batches; ++m) {
      const Batch all = kBatches.global_batch(global, 10 * step + m), mine = all.shard(rank, per_rank);
      (cross_entropy((*reference)(all.images), all.labels) * (1.0 / micro_batches)).backward();
      const Tensor loss = cross_entropy(ddp(mine.images), mine.labels) * (1.0 / micro_batches);
      if (m + 1 < micro_batches) {
        auto no_sync = ddp.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    ref_opt.step();
    ref_opt.zero_grad();
    opt.step();
    opt.zero_grad();
  }
  EXPECT_LE(max_relative_difference(*model, *reference), 1e-5);
  // One reduction of every bucket per step, none for the no_sync micro-batches.
  const auto counters = world().counters();
  EXPECT_EQ(counters.calls_of(distributed::Collective::AllReduce), 5 * static_cast<int64_t>(ddp.buckets().size()));
  EXPECT_EQ(counters.payload_of(distributed::Collective::AllReduce), 5 * 4 * model->num_parameters());
}

TEST(Ddp, BucketsFollowReverseRegistrationOrderAndTheirCaps) {
  auto model = make_vit(kTinyVit, 5);
  const double first_cap_mb = 0.002, cap_mb = 0.004;  // 2 kB, then 4 kB
  DistributedDataParallel ddp(model, testing::world_group(),
                              DdpOptions{.bucket_cap_mb = cap_mb, .first_bucket_cap_mb = first_cap_mb});
  const auto named = model->named_parameters();
  std::vector<std::string> expected;
  for (auto it = named.rbegin(); it != named.rend(); ++it) expected.push_back(it->first);
  std::vector<std::string> seen;
  const auto buckets = ddp.buckets();
  ASSERT_GT(buckets.size(), 2u);
  for (size_t b = 0; b < buckets.size(); ++b) {
    const double cap = (b == 0 ? first_cap_mb : cap_mb) * 1e6;
    // A bucket exceeds its cap only when it holds a single parameter larger than the cap.
    if (buckets[b].parameters.size() > 1) {
      EXPECT_LE(static_cast<double>(buckets[b].bytes), cap) << "bucket " << b;
    }
    seen.insert(seen.end(), buckets[b].parameters.begin(), buckets[b].parameters.end());
  }
  EXPECT_EQ(seen, expected);
}

TEST(Ddp, Bf16ReductionIsCloseToF32AndNotEqual) {
  const int n = world().size(), rank = world().rank();
  const int64_t per_rank = 3, global = per_rank * n;
  auto reference = make_vit(kTinyVit, 21);
  auto model = make_vit(kTinyVit, 21);
  DistributedDataParallel ddp(model, testing::world_group(),
                              DdpOptions{.reduce_dtype = DType::bf16});
  const Batch all = kBatches.global_batch(global, 0), mine = all.shard(rank, per_rank);
  cross_entropy((*reference)(all.images), all.labels).backward();
  cross_entropy(ddp(mine.images), mine.labels).backward();
  double diff = 0, norm = 0;
  bool any_different = false;
  const auto ref = reference->parameters(), got = model->parameters();
  for (size_t i = 0; i < ref.size(); ++i) {
    const auto a = got[i].grad().to_vector<double>(), b = ref[i].grad().to_vector<double>();
    for (size_t k = 0; k < a.size(); ++k) {
      diff += (a[k] - b[k]) * (a[k] - b[k]);
      norm += b[k] * b[k];
      any_different |= a[k] != b[k];
    }
  }
  EXPECT_LE(std::sqrt(diff / norm), 1e-2);  // bf16 rounding, a few steps of it
  EXPECT_TRUE(any_different) << "the gradients were not rounded to bf16";
}

TEST(Ddp, AParameterUnusedOnOneRankGetsTheOtherRanksAverage) {
  const int n = world().size(), rank = world().rank();
  auto model = std::make_shared<Tangled>(0);
  DistributedDataParallel ddp(model, testing::world_group());
  const Tensor x = testing::random_tensor({4, 5}, DType::f32, 7);
  // Rank 0 skips `right`; the others use it. Its gradient is the others' sum over N.
  Tensor y = rank == 0 ? (*model->out)(gelu((*model->left)(x))) : (*model)(x);
  mse_loss(y, zeros(y.shape())).backward();

  auto alone = std::make_shared<Tangled>(0);  // what one rank that used `right` computes
  mse_loss((*alone)(x), zeros({4, 3})).backward();
  const auto expected = alone->right->weight.grad().to_vector<double>();
  const auto got = model->right->weight.grad();
  ASSERT_TRUE(got.defined()) << "rank " << rank << " got no gradient for the unused parameter";
  const auto g = got.to_vector<double>();
  for (size_t k = 0; k < g.size(); ++k) {
    EXPECT_NEAR(g[k], expected[k] * (n - 1) / n, 1e-6 + 1e-5 * std::abs(expected[k])) << k;
  }
}

}  // namespace
}  // namespace octet

namespace octet {
namespace {

// Under data parallelism every rank must derive the same FP8 scales: fp8_amax_reducer max-reduces
// each layer's amaxes over the ranks before the scales update. Each rank's input here has a
// different magnitude, so without the reduction the scales would differ.
TEST(Ddp, Fp8AmaxReducerGivesEveryRankTheLargestAmaxsScale) {
  const int n = world().size(), rank = world().rank();
  auto layer = std::make_shared<nn::Linear>(32, 16);
  Generator gen(4);
  layer->reset_parameters(gen);
  layer->to(DType::bf16);
  const auto group = testing::world_group();
  const nn::Fp8Recipe recipe = nn::DelayedScaling{.amax_history_len = 4};
  const Tensor x = testing::random_tensor({16, 32}, DType::f32, 60, /*scale=*/1.0 + rank).to(DType::bf16);
  {
    nn::Fp8Autocast fp8(true, recipe, distributed::fp8_amax_reducer(group));
    (*layer)(x);
  }
  ASSERT_NE(layer->fp8_state, nullptr);
  // The input's scale on this rank, and every rank's.
  const Tensor scale = layer->fp8_state->forward.scale.narrow(0, 1).clone();
  const Tensor all = empty({n}, DType::f32);
  world().all_gather(all, scale)->wait();
  const auto scales = all.to_vector<double>();
  for (int r = 0; r < n; ++r) EXPECT_EQ(scales[r], scales[0]) << "rank " << r << "'s input scale differs";
  // It is the scale of the largest amax over the ranks: the last rank's input is the largest.
  const Tensor last = testing::random_tensor({16, 32}, DType::f32, 60, 1.0 + (n - 1)).to(DType::bf16);
  double largest = 0;
  for (double v : last.to_vector<double>()) largest = std::max(largest, std::abs(v));
  EXPECT_EQ(scales[0], 448.0f / static_cast<float>(largest));  // fp8_max / amax in f32, margin 0
}

}  // namespace
}  // namespace octet
