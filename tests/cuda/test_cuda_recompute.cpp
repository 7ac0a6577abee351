// Activation recompute and hybrid sharding on the GPU.
//
// Recompute: a bf16 ViT step (dropout and drop-path on) with --recompute blocks against the same step
// without it, plain and under FP8 delayed scaling (the rerun inside nn::Fp8Replay, whose scale copies
// run on the device). On the CPU the two are bit for bit equal (tests/nn/test_recompute.cpp). On the
// GPU every kernel is deterministic except, possibly, cuDNN's attention backward, so the comparison
// calibrates itself: a second plain step measures how far two identical steps land apart. If they land
// on the same bits, recompute must too; if not, recompute may differ from plain by at most four times
// the largest difference the identical steps showed. Wrong dropout masks or stale FP8 scales differ by
// orders of magnitude more. The forward's outputs, which no backward touches, must always be bit for
// bit equal.
//
// Hybrid sharding at one rank over NCCL: the shard and replicate groups are ncclCommSplit's, both in
// flight in every step, and the step must train as FULL_SHARD does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <vector>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "autograd/ops.h"
#include "core/random.h"
#include "distributed/fsdp.h"
#include "distributed/nccl_process_group.h"
#include "models/vit.h"
#include "nn/fp8.h"
#include "optim/optim.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/cuda/small_vit.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::relative_error;
using testing::same_bits;

models::ViTConfig dropout_vit() {
  models::ViTConfig config = testing::small_vit_config("recompute_gpu");
  config.drop_rate = 0.1;
  config.drop_path_rate = 0.2;
  return config;
}

// One training step's forward output, gradients and FP8 state, by name.
std::map<std::string, Tensor> one_step(bool recompute, bool fp8) {
  Generator gen(9);  // initialises the model, then draws its masks; outlives it
  models::VisionTransformer model(dropout_vit(), true, &gen);
  model.to(DType::bf16);
  model.to(kGpu);
  for (const auto& block : model.transformer_blocks()) block->recompute = recompute;
  gen.set_state(123, 0);
  const Tensor images = testing::random_tensor({4, 3, 16, 16}, DType::f32, 5).to(kGpu);
  const Tensor labels = from_vector<int64_t>({1, 4, 7, 9}, {4}).to(kGpu);
  Tensor logits;
  {
    std::optional<nn::Fp8Autocast> scope;
    if (fp8) scope.emplace(true, nn::DelayedScaling{.amax_history_len = 4});
    logits = model(images);
  }
  cross_entropy(logits, labels).backward();
  std::map<std::string, Tensor> out{{"logits", logits.detach()}};
  for (const auto& [name, p] : model.named_parameters()) out[name + ".grad"] = p.grad().clone();
  for (const auto& [name, t] : nn::fp8_state_dict(model)) out[name] = t.clone();
  return out;
}

void expect_recompute_matches(bool fp8) {
  const auto plain = one_step(false, fp8), again = one_step(false, fp8), recomputed = one_step(true, fp8);
  ASSERT_EQ(recomputed.size(), plain.size());
  double noise = 0;  // how far two identical steps land apart
  for (const auto& [name, t] : plain) noise = std::max(noise, relative_error(again.at(name), t));
  EXPECT_TRUE(same_bits(again.at("logits"), plain.at("logits"))) << "the forward is deterministic";
  EXPECT_TRUE(same_bits(recomputed.at("logits"), plain.at("logits"))) << "the first run is the forward itself";
  for (const auto& [name, t] : plain) {
    ASSERT_TRUE(recomputed.count(name)) << name;
    if (noise == 0) {
      EXPECT_TRUE(same_bits(recomputed.at(name), t)) << name << ": identical steps agree bit for bit, so must recompute";
    } else {
      EXPECT_LE(relative_error(recomputed.at(name), t), 4 * noise)
          << name << " (two identical steps differ by up to " << noise << ")";
    }
  }
  const auto fp8_entries = std::count_if(plain.begin(), plain.end(), [](const auto& e) {
    return e.first.find(".fp8.") != std::string::npos;
  });
  EXPECT_EQ(fp8_entries, fp8 ? 2 * 4 * 8 : 0) << "2 blocks x 4 Linears x 8 FP8 entries";
  std::printf("recompute on the GPU (%s): identical steps differ by %.3g (0: bit for bit)\n", fp8 ? "fp8" : "bf16",
              noise);
}

TEST(CudaRecompute, Bf16StepMatchesTheStepWithoutRecompute) {
  SKIP_WITHOUT_GPU();
  expect_recompute_matches(false);
}

TEST(CudaRecompute, Fp8StepMatchesTheStepWithoutRecompute) {
  SKIP_WITHOUT_GPU();
  expect_recompute_matches(true);
}

// Three AdamW steps of FSDP over NCCL at world size 1; returns the losses.
std::vector<double> fsdp_losses(distributed::ShardingStrategy sharding, int64_t* replicate_all_reduces) {
  auto world = std::make_shared<distributed::NcclProcessGroup>(kGpu);
  Generator gen(4);
  auto model = std::make_shared<models::VisionTransformer>(testing::small_vit_config("hybrid_gpu"), true, &gen);
  model->to(kGpu);
  distributed::FullyShardedDataParallel fsdp(
      model, world, {.sharding = sharding, .shard_group_size = 1, .compute_dtype = DType::bf16});
  optim::AdamW opt(fsdp.parameters(), 1e-3);
  std::vector<double> losses;
  for (int step = 0; step < 3; ++step) {
    const Tensor images = testing::random_tensor({4, 3, 16, 16}, DType::bf16, 20 + step).to(kGpu);
    const Tensor labels = from_vector<int64_t>({0, 3, 5, 8}, {4}).to(kGpu);
    Tensor loss = cross_entropy(fsdp(images), labels);
    loss.backward();
    fsdp.clip_grad_norm_(1.0);
    opt.step(), opt.zero_grad();
    losses.push_back(loss.item());
  }
  if (replicate_all_reduces != nullptr) {
    *replicate_all_reduces = fsdp.replicate_group()->counters().calls_of(distributed::Collective::AllReduce);
  }
  return losses;
}

TEST(CudaRecompute, HybridShardAtOneRankOverNcclTrainsAsFullShard) {
  SKIP_WITHOUT_GPU();
  int64_t replicate_all_reduces = 0;
  const std::vector<double> hybrid = fsdp_losses(distributed::ShardingStrategy::HybridShard, &replicate_all_reduces);
  const std::vector<double> full = fsdp_losses(distributed::ShardingStrategy::FullShard, nullptr);
  ASSERT_EQ(hybrid.size(), full.size());
  // One rank: every reduce is the identity, so the two differ only by attention's backward order.
  for (size_t i = 0; i < full.size(); ++i) EXPECT_NEAR(hybrid[i], full[i], 1e-2 * std::abs(full[i])) << "step " << i;
  EXPECT_GT(replicate_all_reduces, 0) << "the replicate group's all-reduces ran";
}

}  // namespace
}  // namespace octet
