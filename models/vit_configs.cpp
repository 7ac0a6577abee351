// The named ViT configurations: timm's ImageNet models and the small Fashion-MNIST model.
#include <sstream>

#include "models/vit.h"

namespace octet::models {

namespace {

std::vector<ViTConfig> all_configs() {
  return {
      {.name = "vit_tiny_patch16_224", .img_size = 224, .patch_size = 16, .in_chans = 3, .num_classes = 1000,
       .embed_dim = 192, .depth = 12, .num_heads = 3, .mlp_ratio = 4.0},
      {.name = "vit_small_patch16_224", .img_size = 224, .patch_size = 16, .in_chans = 3, .num_classes = 1000,
       .embed_dim = 384, .depth = 12, .num_heads = 6, .mlp_ratio = 4.0},
      {.name = "vit_base_patch16_224", .img_size = 224, .patch_size = 16, .in_chans = 3, .num_classes = 1000,
       .embed_dim = 768, .depth = 12, .num_heads = 12, .mlp_ratio = 4.0},
      {.name = "vit_large_patch16_224", .img_size = 224, .patch_size = 16, .in_chans = 3, .num_classes = 1000,
       .embed_dim = 1024, .depth = 24, .num_heads = 16, .mlp_ratio = 4.0},
      {.name = "vit_huge_patch16_224", .img_size = 224, .patch_size = 16, .in_chans = 3, .num_classes = 1000,
       .embed_dim = 1280, .depth = 32, .num_heads = 16, .mlp_ratio = 4.0},
      // A starting point for training on a CPU (49 patches of 4×4); tune it here.
      {.name = "vit_fashion_mnist", .img_size = 28, .patch_size = 4, .in_chans = 1, .num_classes = 10,
       .embed_dim = 96, .depth = 4, .num_heads = 3, .mlp_ratio = 2.0},
  };
}

}  // namespace

ViTConfig vit_config(const std::string& name) {
  for (const ViTConfig& c : all_configs()) {
    if (c.name == name) return c;
  }
  std::ostringstream known;
  for (const std::string& n : vit_config_names()) known << " " << n;
  OCTET_FAIL("vit_config: unknown model '", name, "'; known models:", known.str());
}

std::vector<std::string> vit_config_names() {
  std::vector<std::string> names;
  for (const ViTConfig& c : all_configs()) names.push_back(c.name);
  return names;
}

kernels::GeluApproximation vit_gelu(const std::string& name) {
  if (name == "erf") return kernels::GeluApproximation::None;
  if (name == "tanh") return kernels::GeluApproximation::Tanh;
  OCTET_FAIL("unknown GELU form '", name, "': pass erf (timm's ViTs) or tanh (the approximation)");
}

const char* vit_gelu_name(kernels::GeluApproximation gelu) {
  return gelu == kernels::GeluApproximation::Tanh ? "tanh" : "erf";
}

}  // namespace octet::models
