#pragma once
// The Vision Transformer (Dosovitskiy et al., 2020) with timm's structure, parameter names and
// registration order, so that named_parameters() lists exactly what timm's VisionTransformer does:
//
//   cls_token [1, 1, D], pos_embed [1, N + 1, D], patch_embed.proj.{weight [D, C, p, p], bias},
//   blocks.i.{norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2}.{weight, bias}, norm.{weight, bias},
//   head.{weight [classes, D], bias}
//
// Forward (timm's global_pool = 'token'): patch tokens, class token prepended, position embedding
// added, the blocks, a final LayerNorm, then the class token's features through the head.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/random.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace octet::models {

// Built with designated initialisers, in the order below. The shape fields have no defaults: give
// every one (-Wextra warns otherwise); the rest default to timm's:
//   ViTConfig{.name = "tiny", .img_size = 8, .patch_size = 4, .in_chans = 1, .num_classes = 5,
//             .embed_dim = 12, .depth = 2, .num_heads = 2, .mlp_ratio = 2.0}
struct ViTConfig {
  std::string name;
  int64_t img_size;     // square images, img_size × img_size pixels
  int64_t patch_size;   // square patches; img_size must be a multiple of it
  int64_t in_chans;     // image channels
  int64_t num_classes;  // the head's outputs
  int64_t embed_dim;    // D, the width of every token
  int64_t depth;        // TransformerBlocks
  int64_t num_heads;    // attention heads; embed_dim must be a multiple of it
  double mlp_ratio = 4;  // MLP hidden width = mlp_ratio · embed_dim
  bool qkv_bias = true;
  double drop_rate = 0, attn_drop_rate = 0, drop_path_rate = 0;
  // The MLPs' GELU: the erf form (timm's ViTs), or the tanh approximation, which on the GPU lets
  // cuBLASLt's GEMM epilogues compute it (nn::Mlp). Weights trained with one form are for that form.
  kernels::GeluApproximation gelu = kernels::GeluApproximation::None;
};

// timm's vit_{tiny,small,base,large,huge}_patch16_224, and vit_fashion_mnist (28×28×1, 10 classes).
// An unknown name throws, listing the known ones.
ViTConfig vit_config(const std::string& name);
std::vector<std::string> vit_config_names();

// The GELU form a --gelu flag names: "erf" or "tanh"; anything else throws, naming both.
kernels::GeluApproximation vit_gelu(const std::string& name);
const char* vit_gelu_name(kernels::GeluApproximation gelu);

class VisionTransformer : public nn::Module {
 public:
  // initialize = false allocates the parameters and leaves them uninitialised (for loading a
  // checkpoint, or counting parameters of a huge model quickly). Initialisation draws from `gen`,
  // and Dropout/DropPath keep `gen` for their masks, so it must outlive the model; null means
  // default_generator().
  explicit VisionTransformer(const ViTConfig& config, bool initialize = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& images) override;  // [B, C, H, W] -> logits [B, classes]

  // timm's init_weights(mode=''): pos_embed trunc_normal(0.02), cls_token normal(1e-6), then every
  // Linear trunc_normal(0.02) with zero bias, LayerNorms ones/zeros, the patch conv PyTorch's default.
  void init_weights(Generator& gen);

  const ViTConfig& config() const { return config_; }
  int64_t num_patches() const { return patch_embed->num_patches; }
  // Twice the multiply-adds of every GEMM in one image's forward: patch embedding, qkv, q·kᵀ,
  // attention·v, proj, fc1, fc2 and the head. Backward costs about twice this.
  double flops_per_image_forward() const;
  // The transformer blocks, in order (also registered as blocks.0, blocks.1, ...).
  const std::vector<std::shared_ptr<nn::TransformerBlock>>& transformer_blocks() const { return block_list_; }

  Tensor cls_token;  // [1, 1, D]
  Tensor pos_embed;  // [1, N + 1, D]
  std::shared_ptr<nn::PatchEmbed> patch_embed;
  std::shared_ptr<nn::Dropout> pos_drop;
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Dropout> head_drop;
  std::shared_ptr<nn::Linear> head;

 private:
  ViTConfig config_;
  std::vector<std::shared_ptr<nn::TransformerBlock>> block_list_;  // the blocks, typed
};

}  // namespace octet::models
