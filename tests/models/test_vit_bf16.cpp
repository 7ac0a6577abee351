// The ViT in bf16 (Module::to(DType::bf16), as train_vit --precision bf16 does): on the CPU this is
// the exact emulation of the GPU path (operands rounded to bf16, f32 arithmetic inside the kernels,
// f32 loss), so one forward and backward must stay close to the f32 model's from the same weights.
// Also the training FLOP count that bench_vit's MFU rests on.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/ops.h"
#include "models/vit.h"
#include "nn/layers.h"
#include "tests/testing.h"

namespace octet::models {
namespace {

using octet::testing::random_tensor;
using octet::testing::relative_error_to_reference;

// Big enough that bf16 rounding shows (dim 32, 16 patches), small enough for a quick CPU run.
ViTConfig small_config(double drop_path = 0.0) {
  ViTConfig c;
  c.name = "test_small_bf16";
  c.img_size = 16;
  c.patch_size = 4;
  c.in_chans = 3;
  c.num_classes = 10;
  c.embed_dim = 32;
  c.depth = 2;
  c.num_heads = 2;
  c.mlp_ratio = 4;
  c.drop_path_rate = drop_path;
  return c;
}

TEST(ViTBf16, ForwardAndBackwardStayCloseToF32) {
  Generator gen32(5), gen16(5);
  VisionTransformer f32_model(small_config(), true, &gen32);
  VisionTransformer bf16_model(small_config(), true, &gen16);
  bf16_model.to(DType::bf16);
  for (const Tensor& p : bf16_model.parameters()) ASSERT_EQ(p.dtype(), DType::bf16);

  const Tensor images = random_tensor({4, 3, 16, 16}, DType::f32, 7);  // f32, as the loader gives them
  const Tensor labels = from_vector(std::vector<int64_t>{1, 7, 3, 9}, {4});
  nn::CrossEntropyLoss criterion(0.1);
  const Tensor logits16 = bf16_model(images);
  EXPECT_EQ(logits16.dtype(), DType::bf16);
  const Tensor loss32 = criterion(f32_model(images), labels);
  const Tensor loss16 = criterion(logits16, labels);
  EXPECT_EQ(loss16.dtype(), DType::f32);  // the loss is computed and returned in f32
  EXPECT_NEAR(loss16.item(), loss32.item(), 1e-2 * std::abs(loss32.item()));

  loss32.backward();
  loss16.backward();
  const auto named32 = f32_model.named_parameters(), named16 = bf16_model.named_parameters();
  ASSERT_EQ(named32.size(), named16.size());
  for (size_t i = 0; i < named32.size(); ++i) {
    const Tensor& g32 = named32[i].second.grad();
    const Tensor& g16 = named16[i].second.grad();
    ASSERT_TRUE(g16.defined()) << named16[i].first;
    EXPECT_EQ(g16.dtype(), DType::bf16) << named16[i].first;
    // cls_token starts at ~1e-6 and gets tiny, noisy gradients; every other tensor is well scaled.
    if (named16[i].first == "cls_token") continue;
    EXPECT_LT(relative_error_to_reference(g16, g32), 5e-2) << named16[i].first;
  }
}

TEST(ViTBf16, DropPathRunsInBf16) {
  Generator gen(3);
  VisionTransformer model(small_config(0.5), true, &gen);
  model.to(DType::bf16);
  model.train();
  const Tensor loss = nn::CrossEntropyLoss()(model(random_tensor({6, 3, 16, 16}, DType::f32, 8)),
                                             from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5}, {6}));
  loss.backward();
  EXPECT_TRUE(std::isfinite(loss.item()));
  EXPECT_EQ(model.blocks->operator[](1)->named_parameters()[0].second.grad().dtype(), DType::bf16);
}

TEST(ViTFlops, HugeIs764GflopPerTrainingImage) {
  // The figure for vit_huge_patch16_224: forward plus backward (3x forward) per image.
  const double per_image = 3 * VisionTransformer(vit_config("vit_huge_patch16_224"), false).flops_per_image_forward();
  EXPECT_NEAR(per_image / 1e9, 764, 0.5);
}

}  // namespace
}  // namespace octet::models
