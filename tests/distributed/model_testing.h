#pragma once
// What the distributed tests that train a model share (test_ddp.cpp, test_fsdp.cpp,
// test_fsdp_fp8.cpp, test_fsdp_checkpoint.cpp): tiny Vision Transformers, seeded batches that every
// rank rebuilds alike, and how far a model's parameters are from a reference's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/random.h"
#include "core/tensor.h"
#include "models/vit.h"
#include "nn/module.h"
#include "tests/testing.h"

namespace octet::testing {

// A ViT that trains in milliseconds: 8×8 single-channel images in four 4×4 patches, 5 classes,
// 2 heads, MLP ratio 2. Each test picks the width and depth that its world sizes need.
inline models::ViTConfig tiny_vit_config(std::string name, int64_t embed_dim, int64_t depth) {
  return {.name = std::move(name), .img_size = 8, .patch_size = 4, .in_chans = 1, .num_classes = 5,
          .embed_dim = embed_dim, .depth = depth, .num_heads = 2, .mlp_ratio = 2.0};
}

// A model of `config` initialised from `seed`: the same seed gives the same weights, on every rank.
// Without dropout only: the model's Dropout and DropPath modules would keep the generator, which dies here.
inline std::shared_ptr<models::VisionTransformer> make_vit(const models::ViTConfig& config, uint64_t seed) {
  OCTET_CHECK(config.drop_rate == 0 && config.drop_path_rate == 0, "make_vit: ", config.name, " has dropout; "
              "build it with a generator that outlives the model");
  Generator gen(seed);
  return std::make_shared<models::VisionTransformer>(config, true, &gen);
}

// Images [B, 1, 8, 8] and labels [B] in [0, 5), for the models above.
struct Batch {
  Tensor images, labels;

  // Rank `rank`'s rows of a global batch: [rank·per_rank, (rank + 1)·per_rank).
  Batch shard(int rank, int64_t per_rank) const {
    return {images.narrow(rank * per_rank, per_rank), labels.narrow(rank * per_rank, per_rank)};
  }
};

// A test's stream of global batches, the same on every rank. Step `step`'s batch of `size` holds
// random_tensor images drawn from seed image_seed + step, and labels (i·label_stride + step·label_step)
// mod 5 for row i. Each test has its own seeds and label pattern.
struct SeededBatches {
  uint64_t image_seed;
  int64_t label_stride, label_step;

  Batch global_batch(int64_t size, int step) const {
    Batch b;
    b.images = random_tensor({size, 1, 8, 8}, DType::f32, image_seed + step);
    std::vector<int64_t> labels(size);
    for (int64_t i = 0; i < size; ++i) labels[i] = (i * label_stride + step * label_step) % 5;
    b.labels = from_vector<int64_t>(labels, {size});
    return b;
  }
};

// max |got − expected| / max(1, |expected|) over every element of every parameter; `got` must list
// the reference's parameters, by name, in its order.
inline double max_relative_difference(const std::vector<std::pair<std::string, Tensor>>& got,
                                      const nn::Module& reference) {
  const auto expected = reference.named_parameters();
  EXPECT_EQ(got.size(), expected.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(got.size(), expected.size()); ++i) {
    EXPECT_EQ(got[i].first, expected[i].first);
    const auto a = got[i].second.to_vector<double>(), b = expected[i].second.to_vector<double>();
    for (size_t k = 0; k < a.size(); ++k) worst = std::max(worst, std::abs(a[k] - b[k]) / std::max(1.0, std::abs(b[k])));
  }
  return worst;
}

inline double max_relative_difference(const nn::Module& model, const nn::Module& reference) {
  return max_relative_difference(model.named_parameters(), reference);
}

// The largest ||grad - grad_ref||₂ / ||grad_ref||₂ over the parameters, by name: what a parameter
// comparison after an Adam step cannot see (Adam's update hardly changes when every gradient is
// scaled by one constant), such as an average taken over the wrong number of ranks.
inline double max_gradient_relative_difference(const nn::Module& model, const nn::Module& reference) {
  const auto got = model.named_parameters(), expected = reference.named_parameters();
  EXPECT_EQ(got.size(), expected.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(got.size(), expected.size()); ++i) {
    EXPECT_EQ(got[i].first, expected[i].first);
    const Tensor ga = got[i].second.grad(), gb = expected[i].second.grad();
    EXPECT_TRUE(ga.defined() && gb.defined()) << got[i].first << ": no gradient";
    if (!ga.defined() || !gb.defined()) return INFINITY;
    const auto a = ga.to_vector<double>(), b = gb.to_vector<double>();
    double num = 0, den = 0;
    for (size_t k = 0; k < a.size(); ++k) num += (a[k] - b[k]) * (a[k] - b[k]), den += b[k] * b[k];
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
  return worst;
}

}  // namespace octet::testing
