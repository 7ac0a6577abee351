// The Vision Transformer: timm's configurations, parameter counts, names and order; shapes,
// gradients, modes, seeding, state dicts and the FLOP count.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "models/vit.h"
#include "tests/testing.h"

namespace octet::models {
namespace {

using octet::testing::random_tensor;
using octet::testing::throws_with;

// img 8, patch 4 (4 patches), 2 channels, dim 8, depth 2, heads 2, 5 classes.
ViTConfig tiny_config() {
  ViTConfig c;
  c.name = "test_tiny";
  c.img_size = 8;
  c.patch_size = 4;
  c.in_chans = 2;
  c.num_classes = 5;
  c.embed_dim = 8;
  c.depth = 2;
  c.num_heads = 2;
  c.mlp_ratio = 2;
  return c;
}

TEST(ViTConfigs, MatchTimm) {
  struct Expected {
    const char* name;
    int64_t dim, depth, heads;
  };
  for (const Expected& e :
       {Expected{"vit_tiny_patch16_224", 192, 12, 3}, Expected{"vit_small_patch16_224", 384, 12, 6},
        Expected{"vit_base_patch16_224", 768, 12, 12}, Expected{"vit_large_patch16_224", 1024, 24, 16},
        Expected{"vit_huge_patch16_224", 1280, 32, 16}}) {
    const ViTConfig c = vit_config(e.name);
    EXPECT_EQ(c.name, e.name);
    EXPECT_EQ(c.embed_dim, e.dim) << e.name;
    EXPECT_EQ(c.depth, e.depth) << e.name;
    EXPECT_EQ(c.num_heads, e.heads) << e.name;
    EXPECT_EQ(c.img_size, 224);
    EXPECT_EQ(c.patch_size, 16);
    EXPECT_EQ(c.in_chans, 3);
    EXPECT_EQ(c.num_classes, 1000);
    EXPECT_EQ(c.mlp_ratio, 4.0);
    EXPECT_TRUE(c.qkv_bias);
    EXPECT_EQ(c.drop_rate + c.attn_drop_rate + c.drop_path_rate, 0.0);
  }
  const ViTConfig f = vit_config("vit_fashion_mnist");
  EXPECT_EQ(f.img_size, 28);
  EXPECT_EQ(f.in_chans, 1);
  EXPECT_EQ(f.num_classes, 10);
  EXPECT_EQ(f.img_size % f.patch_size, 0);
  EXPECT_EQ(f.embed_dim % f.num_heads, 0);
  EXPECT_EQ(vit_config_names().size(), 6u);
  EXPECT_TRUE(throws_with([] { vit_config("vit_gigantic"); }, {"'vit_gigantic'", "vit_tiny_patch16_224",
                                                               "vit_huge_patch16_224", "vit_fashion_mnist"}));
}

TEST(VisionTransformer, ParameterCountsMatchTimm) {
  // Known totals of timm's models (sum of p.numel() over named_parameters()).
  EXPECT_EQ(VisionTransformer(vit_config("vit_base_patch16_224"), /*initialize=*/false).num_parameters(),
            86'567'656);
  EXPECT_EQ(VisionTransformer(vit_config("vit_huge_patch16_224"), false).num_parameters(), 632'199'400);
}

TEST(VisionTransformer, NamesShapesAndOrderAreTimms) {
  VisionTransformer vit(tiny_config());
  std::vector<std::pair<std::string, Shape>> expected = {{"cls_token", {1, 1, 8}},
                                                         {"pos_embed", {1, 5, 8}},
                                                         {"patch_embed.proj.weight", {8, 2, 4, 4}},
                                                         {"patch_embed.proj.bias", {8}}};
  for (int b = 0; b < 2; ++b) {
    const std::string p = "blocks." + std::to_string(b) + ".";
    for (const auto& entry : std::vector<std::pair<std::string, Shape>>{{"norm1.weight", {8}},
                                                                        {"norm1.bias", {8}},
                                                                        {"attn.qkv.weight", {24, 8}},
                                                                        {"attn.qkv.bias", {24}},
                                                                        {"attn.proj.weight", {8, 8}},
                                                                        {"attn.proj.bias", {8}},
                                                                        {"norm2.weight", {8}},
                                                                        {"norm2.bias", {8}},
                                                                        {"mlp.fc1.weight", {16, 8}},
                                                                        {"mlp.fc1.bias", {16}},
                                                                        {"mlp.fc2.weight", {8, 16}},
                                                                        {"mlp.fc2.bias", {8}}}) {
      expected.emplace_back(p + entry.first, entry.second);
    }
  }
  expected.insert(expected.end(),
                  {{"norm.weight", {8}}, {"norm.bias", {8}}, {"head.weight", {5, 8}}, {"head.bias", {5}}});
  std::vector<std::pair<std::string, Shape>> actual;
  for (const auto& [name, p] : vit.named_parameters()) actual.emplace_back(name, p.shape());
  EXPECT_EQ(actual, expected);
  EXPECT_TRUE(vit.named_buffers().empty());
}

TEST(VisionTransformer, ForwardShapeAndTheClassTokenPath) {
  VisionTransformer vit(tiny_config());
  const Tensor images = random_tensor({3, 2, 8, 8});
  const Tensor logits = vit(images);
  EXPECT_EQ(logits.shape(), (Shape{3, 5}));
  EXPECT_EQ(logits.dtype(), DType::f32);
  // Each image's logits depend on that image only.
  const Tensor first = vit(images.narrow(0, 1));
  EXPECT_TRUE(octet::testing::all_close(first, logits.detach().narrow(0, 1).to_vector<double>(), 1e-5, 1e-5));
  EXPECT_TRUE(throws_with([&] { vit(random_tensor({3, 2, 16, 16})); }, {"PatchEmbed", "[B, 2, 8, 8]"}));
}

TEST(VisionTransformer, GradcheckInputAndParameters) {
  VisionTransformer vit(tiny_config());
  vit.to(DType::f64);
  // Spread the weights out so every path carries a visible gradient (the cls token starts at 1e-6).
  Generator gen(3);
  for (const Tensor& p : vit.parameters()) p.copy_(randn(p.shape(), gen, DType::f64).to(DType::f64));
  Tensor images = random_tensor({2, 2, 8, 8}, DType::f64, 4);
  images.requires_grad_();
  std::vector<Tensor> inputs = {images};
  for (const auto& [name, p] : vit.named_parameters()) {
    if (name == "cls_token" || name == "pos_embed" || name == "patch_embed.proj.weight" ||
        name == "blocks.1.attn.qkv.weight" || name == "blocks.0.mlp.fc2.bias" || name == "norm.weight" ||
        name == "head.bias") {
      inputs.push_back(p);
    }
  }
  ASSERT_EQ(inputs.size(), 8u);
  const auto result = autograd::gradcheck([&](const std::vector<Tensor>& in) { return vit(in[0]); }, inputs);
  EXPECT_TRUE(result) << result.message;
}

// config.gelu reaches every block's GELU, the tanh model's gradients pass the finite-difference check
// through its MLP nodes (fc1 -> GELU -> fc2 in one), and the two forms give different logits from the
// same weights (they differ by up to 4.7e-4 per GELU). --gelu's names map to the forms.
TEST(VisionTransformer, TanhGeluReachesEveryBlock) {
  ViTConfig config = tiny_config();
  config.gelu = kernels::GeluApproximation::Tanh;
  VisionTransformer tanh_vit(config), erf_vit(tiny_config());
  for (const auto& block : tanh_vit.transformer_blocks()) {
    EXPECT_EQ(block->mlp->act->approximation, kernels::GeluApproximation::Tanh);
  }
  for (const auto& block : erf_vit.transformer_blocks()) {
    EXPECT_EQ(block->mlp->act->approximation, kernels::GeluApproximation::None);
  }
  tanh_vit.to(DType::f64);
  erf_vit.to(DType::f64);
  Generator gen(5);
  for (const Tensor& p : tanh_vit.parameters()) p.copy_(randn(p.shape(), gen, DType::f64).to(DType::f64));
  erf_vit.load_state_dict(tanh_vit.state_dict());
  Tensor images = random_tensor({2, 2, 8, 8}, DType::f64, 6);
  const std::vector<double> a = tanh_vit(images).detach().to_vector<double>(),
                            b = erf_vit(images).detach().to_vector<double>();
  double apart = 0;
  for (size_t i = 0; i < a.size(); ++i) apart = std::max(apart, std::abs(a[i] - b[i]));
  EXPECT_GT(apart, 1e-6);
  images.requires_grad_();
  std::vector<Tensor> inputs = {images};
  for (const auto& [name, p] : tanh_vit.named_parameters()) {
    if (name.starts_with("blocks.0.mlp.")) inputs.push_back(p);
  }
  ASSERT_EQ(inputs.size(), 5u);
  const auto result = autograd::gradcheck([&](const std::vector<Tensor>& in) { return tanh_vit(in[0]); }, inputs);
  EXPECT_TRUE(result) << result.message;

  EXPECT_EQ(vit_gelu("erf"), kernels::GeluApproximation::None);
  EXPECT_EQ(vit_gelu("tanh"), kernels::GeluApproximation::Tanh);
  EXPECT_STREQ(vit_gelu_name(vit_gelu("tanh")), "tanh");
  EXPECT_TRUE(throws_with([] { vit_gelu("relu"); }, {"'relu'", "erf", "tanh"}));
}

TEST(VisionTransformer, InitialisationFollowsTimmAndTheSeed) {
  ViTConfig c = vit_config("vit_fashion_mnist");
  Generator g1(7), g2(7), g3(8);
  VisionTransformer a(c, true, &g1), b(c, true, &g2), other(c, true, &g3);
  const auto pa = a.named_parameters(), pb = b.named_parameters(), po = other.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].second.to_vector<float>(), pb[i].second.to_vector<float>()) << pa[i].first;
  }
  EXPECT_NE(pa[2].second.to_vector<float>(), po[2].second.to_vector<float>());

  auto stats = [](const Tensor& t) {
    const std::vector<double> v = t.to_vector<double>();
    double mean = 0, sq = 0, peak = 0;
    for (double x : v) mean += x / static_cast<double>(v.size());
    for (double x : v) sq += (x - mean) * (x - mean) / static_cast<double>(v.size());
    for (double x : v) peak = std::max(peak, std::abs(x));
    return std::array<double, 3>{mean, std::sqrt(sq), peak};
  };
  for (const auto& [name, p] : pa) {
    const auto [mean, std, peak] = stats(p);
    const bool bias = name.ends_with(".bias"), norm = name.find("norm") != std::string::npos;
    if (name == "cls_token") {
      EXPECT_LT(peak, 1e-5) << name;  // normal(std 1e-6)
      EXPECT_GT(peak, 0.0) << name;
    } else if (name == "pos_embed" || (!norm && !bias && name != "patch_embed.proj.weight")) {
      EXPECT_NEAR(std, 0.02, 0.004) << name;  // trunc_normal(std 0.02); small tensors, loose bound
    } else if (name.starts_with("patch_embed.proj")) {
      EXPECT_LE(peak, 1 / std::sqrt(16.0)) << name;  // Conv2d default, fan_in = 1·4·4
      EXPECT_GT(std, 0.1) << name;
    } else if (norm && !bias) {
      EXPECT_EQ(p.to_vector<float>(), std::vector<float>(p.numel(), 1.f)) << name;
    } else {
      EXPECT_EQ(peak, 0.0) << name;  // Linear and LayerNorm biases
    }
  }
}

TEST(VisionTransformer, DropoutOnlyInTrainingAndDropPathGrowsWithDepth) {
  ViTConfig c = tiny_config();
  c.drop_rate = 0.2;
  c.drop_path_rate = 0.3;
  Generator gen(5);
  VisionTransformer dropping(c, true, &gen);
  ViTConfig plain_config = tiny_config();
  VisionTransformer plain(plain_config);
  plain.load_state_dict(dropping.state_dict());

  EXPECT_EQ(dropping.pos_drop->p, 0.2);
  EXPECT_EQ(dropping.head_drop->p, 0.2);
  auto block = [&](size_t i) {
    return std::dynamic_pointer_cast<nn::TransformerBlock>((*dropping.blocks)[i]);
  };
  EXPECT_EQ(block(0)->drop_path1->p, 0.0);
  EXPECT_EQ(block(1)->drop_path2->p, 0.3) << "linspace(0, 0.3, depth 2)";
  EXPECT_EQ(block(1)->attn->proj_drop->p, 0.2);

  const Tensor images = random_tensor({4, 2, 8, 8});
  EXPECT_NE(dropping(images).to_vector<float>(), dropping(images).to_vector<float>());
  dropping.eval();
  EXPECT_EQ(dropping(images).to_vector<float>(), plain(images).to_vector<float>());
}

TEST(VisionTransformer, StateDictRoundTripAndHooksOnBlocks) {
  Generator g1(1), g2(2);
  VisionTransformer a(tiny_config(), true, &g1), b(tiny_config(), true, &g2);
  const Tensor images = random_tensor({2, 2, 8, 8});
  EXPECT_NE(a(images).to_vector<float>(), b(images).to_vector<float>());
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(a(images).to_vector<float>(), b(images).to_vector<float>());

  // A post-hook on the last block sees its output; replacing it with zeros leaves only the final
  // LayerNorm's bias (zero) times the head: the logits become the head's bias.
  std::vector<std::string> seen;
  for (size_t i = 0; i < 2; ++i) {
    (*b.blocks)[i]->register_forward_pre_hook([&seen, i](nn::Module& m, const Tensor& x) {
      seen.push_back("block" + std::to_string(i) + ":" + m.name());
      EXPECT_EQ(x.shape(), (Shape{2, 5, 8}));
      return Tensor();
    });
  }
  const size_t zeroing = (*b.blocks)[1]->register_forward_hook(
      [](nn::Module&, const Tensor&, const Tensor& out) { return zeros(out.shape()); });
  b.head->bias.copy_(random_tensor({5}, DType::f32, 9));
  const Tensor logits = b(images);
  EXPECT_EQ(seen, (std::vector<std::string>{"block0:TransformerBlock", "block1:TransformerBlock"}));
  const std::vector<double> bias = b.head->bias.to_vector<double>();
  EXPECT_TRUE(octet::testing::all_close(logits.detach().narrow(0, 1), bias, 1e-6, 0));
  (*b.blocks)[1]->remove_hook(zeroing);
  EXPECT_FALSE(octet::testing::all_close(b(images).detach().narrow(0, 1), bias, 1e-3, 0));
}

TEST(VisionTransformer, FlopsCountEveryGemm) {
  // tiny: N = 4 patches, T = 5 tokens, P = 2·4·4 = 32 features, D = 8, hidden 16, 5 classes.
  // Multiply-adds: patches 4·32·8 = 1024; per block qkv 5·8·24 = 960, q·kᵀ 5·5·8 = 200,
  // attn·v 200, proj 5·8·8 = 320, fc1 and fc2 5·8·16 = 640 each (2960 per block); head 8·5 = 40.
  EXPECT_EQ(VisionTransformer(tiny_config(), false).flops_per_image_forward(), 2.0 * (1024 + 2 * 2960 + 40));
  // ViT-B/16 is quoted at 17.56 GMACs per 224² image (fvcore, timm's model cards).
  const double base = VisionTransformer(vit_config("vit_base_patch16_224"), false).flops_per_image_forward();
  EXPECT_NEAR(base / 2 / 1e9, 17.56, 0.02);
}

TEST(VisionTransformer, ConvertsToF64AndBack) {
  VisionTransformer vit(tiny_config());
  const Tensor images = random_tensor({2, 2, 8, 8});
  const std::vector<double> f32_logits = vit(images).to_vector<double>();
  vit.to(DType::f64);
  const Tensor logits64 = vit(images.to(DType::f64));
  EXPECT_EQ(logits64.dtype(), DType::f64);
  EXPECT_TRUE(octet::testing::all_close(logits64, f32_logits, 1e-5, 1e-5));
  EXPECT_TRUE(throws_with(
      [] {
        VisionTransformer(ViTConfig{.name = "bad", .img_size = 8, .patch_size = 3, .in_chans = 1, .num_classes = 2,
                                    .embed_dim = 8, .depth = 1, .num_heads = 2});
      },
      {"img_size 8", "multiple of patch_size 3"}));
}

}  // namespace
}  // namespace octet::models
