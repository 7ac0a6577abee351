#pragma once
// The small ViT the GPU training-step tests run on both devices: head dim 64 (one of the cuDNN
// attention shapes), 17 tokens, a classifier of 10. Its block Linears (128 -> 384, 128 -> 512, ...)
// all have FP8-sized dims, and 17 tokens per image leave the FP8 casts padding to do.
#include <string>
#include <utility>

#include "models/vit.h"

namespace octet::testing {

inline models::ViTConfig small_vit_config(std::string name) {
  models::ViTConfig c;
  c.name = std::move(name);
  c.img_size = 16;
  c.patch_size = 4;
  c.in_chans = 3;
  c.num_classes = 10;
  c.embed_dim = 128;
  c.depth = 2;
  c.num_heads = 2;
  c.mlp_ratio = 4;
  return c;
}

}  // namespace octet::testing
