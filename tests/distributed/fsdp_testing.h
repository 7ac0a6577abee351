#pragma once
// What the suites that compare FSDP with one process and with DDP share (test_fsdp.cpp,
// test_fsdp_hybrid.cpp): the tiny ViT and batches, and one training recipe run either by every rank
// on its shard of each batch (through FSDP or DDP) or by one process on the whole batch.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "autograd/ops.h"
#include "distributed/process_group.h"
#include "optim/optim.h"
#include "tests/distributed/model_testing.h"
#include "tests/distributed/mpi_main.h"

namespace octet::testing {

// 12-wide, 3 blocks: parameter counts that 2, 3, 4 and 6 do not all divide, so flats are padded.
inline const models::ViTConfig kTinyFsdpVit = tiny_vit_config("tiny_fsdp", /*embed_dim=*/12, /*depth=*/3);
// Step s's global batch: images from seed 2000 + s, labels (3i + s) mod 5.
inline const SeededBatches kFsdpBatches{.image_seed = 2000, .label_stride = 3, .label_step = 1};
inline constexpr int64_t kImagesPerRank = 2;
inline constexpr int kSteps = 5;

// Per step: the loss of the whole global batch (over the ranks: the mean of theirs) and the norm
// the clip measured.
struct Trajectory {
  std::vector<double> losses, norms;
};

// kSteps AdamW steps (lr 1e-3: Adam turns last-bit differences of near-zero gradients into ~lr·ε
// moves, see test_ddp.cpp), each of `micro_batches` micro-batches, clipped at 0.5. Global batches of
// kImagesPerRank × the world size. `ranks` null: one process trains `forward` on the whole batch;
// otherwise each rank on its rows, and the losses are averaged over `ranks`.
inline Trajectory train_adamw(const std::function<Tensor(const Tensor&)>& forward, const std::vector<Tensor>& parameters,
                              const std::function<double(double)>& clip, int micro_batches,
                              distributed::ProcessGroup* ranks) {
  const int n = world().size(), rank = world().rank();
  optim::AdamW optimizer(parameters, 1e-3, 0.9, 0.999, 1e-8, 0.05);
  Trajectory t;
  for (int step = 0; step < kSteps; ++step) {
    double loss = 0;
    for (int m = 0; m < micro_batches; ++m) {
      Batch batch = kFsdpBatches.global_batch(kImagesPerRank * n, 10 * step + m);
      if (ranks != nullptr) batch = batch.shard(rank, kImagesPerRank);
      const Tensor l = cross_entropy(forward(batch.images), batch.labels) * (1.0 / micro_batches);
      l.backward();
      const Tensor mean = l.detach().clone();
      if (ranks != nullptr) ranks->all_reduce(mean, distributed::ReduceOp::Avg)->wait();
      loss += mean.item();
    }
    t.norms.push_back(clip(0.5));
    optimizer.step();
    optimizer.zero_grad();
    t.losses.push_back(loss);
  }
  return t;
}

inline Trajectory train_one_process(nn::Module& model, int micro_batches) {
  return train_adamw([&](const Tensor& x) { return model(x); }, model.parameters(),
                     [&](double max_norm) { return static_cast<double>(optim::clip_grad_norm_(model.parameters(), max_norm)); },
                     micro_batches, nullptr);
}

// Losses and norms step by step within `rtol` (relative) of `expected`'s.
inline void expect_same_trajectory(const Trajectory& got, const Trajectory& expected, double rtol, const char* what) {
  ASSERT_EQ(got.losses.size(), expected.losses.size());
  for (size_t s = 0; s < got.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], expected.losses[s], rtol * std::abs(expected.losses[s])) << what << ", step " << s;
    EXPECT_NEAR(got.norms[s], expected.norms[s], rtol * expected.norms[s]) << what << ", clip norm at step " << s;
  }
}

}  // namespace octet::testing
