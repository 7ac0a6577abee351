// Octet's ViT against timm's own VisionTransformer, computed independently in PyTorch.
//
// tests/models/make_timm_reference.py builds timm's model (img 16, patch 4, 2 channels, dim 16,
// depth 2, heads 2, 5 classes), sets element i of its k-th parameter (named_parameters order) to
// 0.3·sin(0.37·i + 1.3·k), feeds images sin(0.11·j + 0.5) in float64, and writes the logits and
// the gradients of sum(logits · r), r = cos(0.7·j + 0.2), to timm_reference.json beside it. Here
// Octet's model gets the same pattern in ITS parameter order. Agreement to ~1e-12 means the names
// and their order, the layouts (qkv split into heads, patch features in (c, ky, kx) order, the
// class token at position 0) and the math (LayerNorm eps, exact GELU, attention scale) are timm's.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "models/vit.h"
#include "tests/testing.h"

namespace octet::models {
namespace {

// ---- the numbers make_timm_reference.py wrote to timm_reference.json; regenerate rather than edit --

// timm_reference.json, from this source folder (OCTET_TEST_DATA_DIR, set in tests/CMakeLists.txt),
// or else from tests/models/ under the working directory (a copied build run from a checkout's root).
const nlohmann::json& timm_reference() {
  static const nlohmann::json data = [] {
    const std::filesystem::path built_in = std::filesystem::path(OCTET_TEST_DATA_DIR) / "timm_reference.json";
    const std::filesystem::path relative = std::filesystem::path("tests") / "models" / "timm_reference.json";
    const std::filesystem::path path = std::filesystem::exists(built_in) ? built_in : relative;
    std::ifstream in(path);
    OCTET_CHECK(in.good(), "test_vit_timm_reference: cannot read ", built_in.string(), " nor ", relative.string(),
                "; run test_models from the repository root");
    return nlohmann::json::parse(in);
  }();
  return data;
}

// One array of the file: "logits", "image_grad", "cls_token_grad", "qkv_bias_grad",
// "patch_weight_grad" (the first 2 output channels only) or "head_weight_grad".
std::vector<double> timm_values(const std::string& key) { return timm_reference().at(key).get<std::vector<double>>(); }

// ---- the comparison --------------------------------------------------------------------------------

ViTConfig reference_config() {
  ViTConfig c;
  c.name = "timm_reference";
  c.img_size = 16;
  c.patch_size = 4;
  c.in_chans = 2;
  c.num_classes = 5;
  c.embed_dim = 16;
  c.depth = 2;
  c.num_heads = 2;
  return c;
}

Tensor closed_form(int64_t n, const Shape& shape, double scale, double frequency, double phase,
                   bool cosine = false) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) {
    const double angle = frequency * static_cast<double>(i) + phase;
    v[i] = scale * (cosine ? std::cos(angle) : std::sin(angle));
  }
  return from_vector(v, shape, DType::f64);
}

// First `count` values of a tensor's gradient.
std::vector<double> grad_head(const Tensor& t, size_t count) {
  std::vector<double> g = t.grad().to_vector<double>();
  g.resize(count);
  return g;
}

TEST(VitTimmReference, LogitsAndGradientsMatchTimm) {
  VisionTransformer vit(reference_config(), /*initialize=*/false);
  vit.to(DType::f64);
  vit.eval();
  const auto named = vit.named_parameters();
  ASSERT_EQ(named.size(), 32u) << "timm's model has 32 parameter tensors";
  for (size_t k = 0; k < named.size(); ++k) {
    const Tensor& p = named[k].second;
    p.copy_(closed_form(p.numel(), p.shape(), 0.3, 0.37, 1.3 * static_cast<double>(k)));
  }

  Tensor images = closed_form(2 * 2 * 16 * 16, {2, 2, 16, 16}, 1.0, 0.11, 0.5);
  images.requires_grad_();
  const Tensor logits = vit(images);
  const Tensor r = closed_form(10, {2, 5}, 1.0, 0.7, 0.2, /*cosine=*/true);
  sum(logits * r).backward();

  auto param = [&](const std::string& name) {
    for (const auto& [n, p] : named) {
      if (n == name) return p;
    }
    ADD_FAILURE() << "no parameter " << name;
    return Tensor();
  };
  // float64 throughout; the two sides differ only in summation order.
  using octet::testing::all_close;
  EXPECT_TRUE(all_close(logits, timm_values("logits"), 1e-12, 1e-10));
  EXPECT_TRUE(all_close(images.grad(), timm_values("image_grad"), 1e-14, 1e-9));
  EXPECT_TRUE(all_close(param("cls_token").grad(), timm_values("cls_token_grad"), 1e-14, 1e-9));
  EXPECT_TRUE(all_close(param("blocks.0.attn.qkv.bias").grad(), timm_values("qkv_bias_grad"), 1e-14, 1e-9));
  const std::vector<double> patch_weight_grad = timm_values("patch_weight_grad");
  const Tensor patch_grad = from_vector(grad_head(param("patch_embed.proj.weight"), patch_weight_grad.size()),
                                        {static_cast<int64_t>(patch_weight_grad.size())}, DType::f64);
  EXPECT_TRUE(all_close(patch_grad, patch_weight_grad, 1e-14, 1e-9));
  EXPECT_TRUE(all_close(param("head.weight").grad(), timm_values("head_weight_grad"), 1e-14, 1e-9));
}

}  // namespace
}  // namespace octet::models
