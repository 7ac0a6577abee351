// The named ViT configurations: timm's ImageNet models and the small Fashion-MNIST model.
#include <sstream>

#include "models/vit.h"

namespace octet::models {

namespace {

std::vector<ViTConfig> all_configs() {
  // name, img, patch, chans, classes, dim, depth, heads, mlp_ratio
  return {
      {"vit_tiny_patch16_224", 224, 16, 3, 1000, 192, 12, 3, 4.0},
      {"vit_small_patch16_224", 224, 16, 3, 1000, 384, 12, 6, 4.0},
      {"vit_base_patch16_224", 224, 16, 3, 1000, 768, 12, 12, 4.0},
      {"vit_large_patch16_224", 224, 16, 3, 1000, 1024, 24, 16, 4.0},
      {"vit_huge_patch16_224", 224, 16, 3, 1000, 1280, 32, 16, 4.0},
      // A starting point for training on a CPU (49 patches of 4×4); tune it on this one line.
      {"vit_fashion_mnist", 28, 4, 1, 10, 96, 4, 3, 2.0},
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

}  // namespace octet::models
