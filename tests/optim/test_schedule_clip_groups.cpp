// The warmup-cosine schedule at its landmarks, gradient clipping against hand-computed norms, and
// the weight-decay split on timm's ViT parameter names.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "optim/clip_grad.h"
#include "optim/lr_schedule.h"
#include "optim/param_groups.h"
#include "tests/testing.h"

namespace {

using namespace octet;
using octet::testing::all_close;
using octet::testing::random_tensor;
using octet::testing::throws_with;
using Vec = std::vector<double>;

// ---- WarmupCosineSchedule ---------------------------------------------------------------------------------

TEST(WarmupCosineSchedule, Landmarks) {
  const double base = 0.1, min = 0.001;
  const optim::WarmupCosineSchedule s(base, 10, 110, min);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.01);  // step 0 already trains
  EXPECT_DOUBLE_EQ(s.lr(4), 0.05);
  EXPECT_DOUBLE_EQ(s.lr(9), base);  // the end of warmup
  EXPECT_DOUBLE_EQ(s.lr(10), base);  // the cosine starts at base_lr
  EXPECT_DOUBLE_EQ(s.lr(60), (base + min) / 2);  // half way through the decay
  // A quarter of the way: cos(π/4) = √2/2.
  EXPECT_DOUBLE_EQ(s.lr(35), min + (base - min) * (1 + std::numbers::sqrt2 / 2) / 2);
  EXPECT_DOUBLE_EQ(s.lr(110), min);
  EXPECT_DOUBLE_EQ(s.lr(100000), min);
  EXPECT_GT(s.lr(109), min);
}

TEST(WarmupCosineSchedule, RisesThenFalls) {
  const optim::WarmupCosineSchedule s(3e-4, 7, 50);
  for (int64_t t = 1; t < 7; ++t) EXPECT_GT(s.lr(t), s.lr(t - 1)) << t;
  for (int64_t t = 8; t <= 50; ++t) EXPECT_LT(s.lr(t), s.lr(t - 1)) << t;
  EXPECT_EQ(s.lr(50), 0.0);
}

TEST(WarmupCosineSchedule, WithoutWarmupOrWithoutDecay) {
  const optim::WarmupCosineSchedule no_warmup(1.0, 0, 4);
  EXPECT_DOUBLE_EQ(no_warmup.lr(0), 1.0);
  EXPECT_DOUBLE_EQ(no_warmup.lr(2), 0.5);
  EXPECT_DOUBLE_EQ(no_warmup.lr(4), 0.0);
  const optim::WarmupCosineSchedule no_decay(1.0, 4, 4, 0.25);
  EXPECT_DOUBLE_EQ(no_decay.lr(3), 1.0);
  EXPECT_DOUBLE_EQ(no_decay.lr(4), 0.25);
}

TEST(WarmupCosineSchedule, BadArgumentsAreNamed) {
  EXPECT_TRUE(throws_with([] { optim::WarmupCosineSchedule(0.1, 20, 10); },
                          {"warmup_steps 20", "total_steps 10"}));
  EXPECT_TRUE(throws_with([] { optim::WarmupCosineSchedule(0.1, 1, 10, 0.2); }, {"min_lr", "[0, base_lr]"}));
  EXPECT_TRUE(throws_with([] { optim::WarmupCosineSchedule(-0.1, 1, 10); }, {"base_lr", ">= 0"}));
  const optim::WarmupCosineSchedule s(0.1, 1, 10);
  EXPECT_TRUE(throws_with([&] { s.lr(-1); }, {"step", "from 0", "-1"}));
}

// ---- clip_grad_norm_ -------------------------------------------------------------------------------------

Tensor param_with_grad(const Tensor& grad) {
  Tensor p = random_tensor(grad.shape(), DType::f32, 7);
  p.requires_grad_();
  p.set_grad(grad);
  return p;
}

TEST(ClipGradNorm, ScalesToMaxNormAgainstAHandComputedNorm) {
  // |(3, 4, 12)| = 13.
  const Tensor a = param_with_grad(from_vector<double>({3, 4}, {2}, DType::f32));
  const Tensor b = param_with_grad(from_vector<double>({-12}, {1, 1}, DType::f32));
  Tensor none = random_tensor({3}, DType::f32, 6);
  none.requires_grad_();
  const double norm = optim::clip_grad_norm_({a, none, b}, 6.5);
  EXPECT_DOUBLE_EQ(norm, 13.0);
  const double c = 6.5 / (13.0 + 1e-6);
  EXPECT_TRUE(all_close(a.grad(), Vec{3 * c, 4 * c}, 0, 1e-7));
  EXPECT_TRUE(all_close(b.grad(), Vec{-12 * c}, 0, 1e-7));
  EXPECT_FALSE(none.grad().defined());
}

TEST(ClipGradNorm, LeavesSmallGradientsAlone) {
  const Tensor a = param_with_grad(random_tensor({5, 5}, DType::f32, 8));
  const Vec before = a.grad().to_vector<double>();
  double want = 0;
  for (double x : before) want += x * x;
  EXPECT_NEAR(optim::clip_grad_norm_({a}, 1e3), std::sqrt(want), 1e-12 * std::sqrt(want));
  EXPECT_EQ(a.grad().to_vector<double>(), before);
}

TEST(ClipGradNorm, MixedDtypesAndLargeTensors) {
  const Tensor a = param_with_grad(random_tensor({300, 700}, DType::f32, 9));
  const Tensor b = param_with_grad(random_tensor({1000}, DType::bf16, 10));
  long double sum = 0;
  for (const Tensor* p : {&a, &b}) {
    for (double x : p->grad().to_vector<double>()) sum += static_cast<long double>(x) * x;
  }
  const double want = std::sqrt(static_cast<double>(sum));
  const double norm = optim::clip_grad_norm_({a, b}, 1.0);
  EXPECT_NEAR(norm, want, 1e-12 * want);
  // After clipping the norm is max_norm, to the rounding of the scaled values.
  double after = 0;
  for (const Tensor* p : {&a, &b}) {
    for (double x : p->grad().to_vector<double>()) after += x * x;
  }
  EXPECT_NEAR(std::sqrt(after), 1.0, 1e-3);  // bf16 rounding of b's scaled values
  EXPECT_EQ(b.grad().dtype(), DType::bf16);
}

TEST(ClipGradNorm, NonFiniteNormIsReturnedWithGradientsUntouched) {
  Tensor g = random_tensor({4}, DType::f32, 11);
  g.data<float>()[2] = INFINITY;
  const Tensor a = param_with_grad(g);
  const Tensor b = param_with_grad(random_tensor({3}, DType::f32, 12));
  const Vec before = b.grad().to_vector<double>();
  EXPECT_TRUE(std::isinf(optim::clip_grad_norm_({a, b}, 1.0)));
  EXPECT_EQ(b.grad().to_vector<double>(), before);
  EXPECT_TRUE(throws_with([&] { optim::clip_grad_norm_({a, b}, 1.0, true); },
                          {"clip_grad_norm_", "inf", "skip"}));
  a.grad().data<float>()[0] = NAN;
  EXPECT_TRUE(std::isnan(optim::clip_grad_norm_({a, b}, 1.0)));
  EXPECT_TRUE(throws_with([&] { optim::clip_grad_norm_({b}, 0.0); }, {"clip_grad_norm_", "max_norm", "> 0"}));
}

// ---- weight_decay_groups ----------------------------------------------------------------------------------

TEST(WeightDecayGroups, TimmVitNames) {
  const int64_t D = 8;
  const std::vector<std::pair<std::string, Shape>> layout = {
      {"cls_token", {1, 1, D}},
      {"pos_embed", {1, 5, D}},
      {"patch_embed.proj.weight", {D, 3, 2, 2}},
      {"patch_embed.proj.bias", {D}},
      {"blocks.0.norm1.weight", {D}},
      {"blocks.0.norm1.bias", {D}},
      {"blocks.0.attn.qkv.weight", {3 * D, D}},
      {"blocks.0.attn.qkv.bias", {3 * D}},
      {"blocks.0.attn.proj.weight", {D, D}},
      {"blocks.0.mlp.fc1.weight", {4 * D, D}},
      {"decoder.decoder_pos_embed", {1, 5, D}},
      {"norm.weight", {D}},
      {"head.weight", {10, D}},
      {"head.bias", {10}},
      {"frozen.weight", {D, D}},  // requires_grad off: left out
  };
  std::vector<std::pair<std::string, Tensor>> named;
  for (size_t i = 0; i < layout.size(); ++i) {
    Tensor t = random_tensor(layout[i].second, DType::f32, 100 + i);
    if (layout[i].first != "frozen.weight") t.requires_grad_();
    named.emplace_back(layout[i].first, t);
  }
  const auto groups = optim::weight_decay_groups(named, 1e-3, 0.05);
  ASSERT_EQ(groups.size(), 2u);
  const auto names_of = [&](const optim::ParamGroup& g) {
    std::vector<std::string> out;
    for (const Tensor& p : g.params) {
      for (const auto& [name, t] : named) {
        if (t.is_same(p)) out.push_back(name);
      }
    }
    return out;
  };
  EXPECT_EQ(names_of(groups[0]),
            (std::vector<std::string>{"cls_token", "pos_embed", "patch_embed.proj.bias",
                                      "blocks.0.norm1.weight", "blocks.0.norm1.bias",
                                      "blocks.0.attn.qkv.bias", "decoder.decoder_pos_embed", "norm.weight",
                                      "head.bias"}));
  EXPECT_EQ(groups[0].weight_decay, 0.0);
  EXPECT_EQ(names_of(groups[1]),
            (std::vector<std::string>{"patch_embed.proj.weight", "blocks.0.attn.qkv.weight",
                                      "blocks.0.attn.proj.weight", "blocks.0.mlp.fc1.weight",
                                      "head.weight"}));
  EXPECT_EQ(groups[1].weight_decay, 0.05);
  EXPECT_EQ(groups[0].lr, 1e-3);
  EXPECT_EQ(groups[1].lr, 1e-3);
}

TEST(WeightDecayGroups, EmptyGroupsAreDropped) {
  Tensor bias = random_tensor({4}).requires_grad_();
  Tensor weight = random_tensor({4, 4}).requires_grad_();
  const auto only_bias = optim::weight_decay_groups({{"fc.bias", bias}}, 0.1, 0.05);
  ASSERT_EQ(only_bias.size(), 1u);
  EXPECT_EQ(only_bias[0].weight_decay, 0.0);
  const auto only_weight = optim::weight_decay_groups({{"fc.weight", weight}}, 0.1, 0.05);
  ASSERT_EQ(only_weight.size(), 1u);
  EXPECT_EQ(only_weight[0].weight_decay, 0.05);
  EXPECT_TRUE(optim::weight_decay_groups({}, 0.1, 0.05).empty());
}

}  // namespace
