#include "models/vit.h"

#include "autograd/ops.h"
#include "nn/init.h"

namespace octet::models {

VisionTransformer::VisionTransformer(const ViTConfig& config, bool initialize, Generator* gen)
    : Module("VisionTransformer"), config_(config) {
  const ViTConfig& c = config_;
  OCTET_CHECK(c.depth > 0 && c.num_classes > 0, "VisionTransformer '", c.name, "': depth ", c.depth,
              " and num_classes ", c.num_classes, " must be positive");
  // The layers are built uninitialised: init_weights below replaces PyTorch's defaults anyway.
  nn::SkipInitGuard skip_init;
  const int64_t D = c.embed_dim;
  patch_embed = register_module("patch_embed",
                                std::make_shared<nn::PatchEmbed>(c.img_size, c.patch_size, c.in_chans, D));
  cls_token = register_parameter("cls_token", empty({1, 1, D}));
  pos_embed = register_parameter("pos_embed", empty({1, num_patches() + 1, D}));
  pos_drop = register_module("pos_drop", std::make_shared<nn::Dropout>(c.drop_rate, gen));
  blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.depth; ++i) {
    // Stochastic depth grows linearly with depth: torch.linspace(0, drop_path_rate, depth)[i].
    const double drop_path =
        c.depth > 1 ? c.drop_path_rate * static_cast<double>(i) / static_cast<double>(c.depth - 1) : 0.0;
    auto block = std::make_shared<nn::TransformerBlock>(D, c.num_heads, c.mlp_ratio, c.qkv_bias, c.drop_rate,
                                                        c.attn_drop_rate, drop_path, gen, c.gelu);
    blocks->push_back(block);
    block_list_.push_back(block);
  }
  norm = register_module("norm", std::make_shared<nn::LayerNorm>(D));
  head_drop = register_module("head_drop", std::make_shared<nn::Dropout>(c.drop_rate, gen));
  head = register_module("head", std::make_shared<nn::Linear>(D, c.num_classes));
  // Under FP8 only the blocks' Linears run in FP8: the classifier, which turns features into
  // logits, stays in the model's dtype, as Transformer Engine recipes keep the last layer.
  head->fp8_allowed = false;
  if (initialize) init_weights(gen != nullptr ? *gen : default_generator());
}

void VisionTransformer::init_weights(Generator& gen) {
  nn::trunc_normal_(pos_embed, 0.0, 0.02, gen);
  nn::normal_(cls_token, 0.0, 1e-6, gen);
  apply([&gen](Module& m) { nn::init_weights_vit_timm(m, gen); });
}

Tensor VisionTransformer::forward(const Tensor& images) {
  const Tensor patches = (*patch_embed)(images);  // [B, N, D]
  const int64_t B = patches.size(0);
  const Tensor cls = broadcast_to(cls_token, {B, 1, config_.embed_dim});
  Tensor x = (*pos_drop)(concat({cls, patches}, 1) + pos_embed);  // [B, N + 1, D]
  for (const auto& block : block_list_) x = (*block)(x);
  const Tensor features = select((*norm)(x), 1, 0);  // the class token: [B, D]
  return (*head)((*head_drop)(features));
}

double VisionTransformer::flops_per_image_forward() const {
  const auto N = static_cast<double>(num_patches());
  const double T = N + 1;  // tokens, with the class token
  const auto D = static_cast<double>(config_.embed_dim);
  const auto hidden = static_cast<double>(static_cast<int64_t>(D * config_.mlp_ratio));
  const auto patch_features = static_cast<double>(config_.in_chans * config_.patch_size * config_.patch_size);
  const double patch_embedding = N * patch_features * D;
  const double per_block = T * D * 3 * D          // qkv
                           + T * T * D            // q·kᵀ, all heads together
                           + T * T * D            // attention·v
                           + T * D * D            // proj
                           + 2 * T * D * hidden;  // fc1 and fc2
  const double classifier = D * static_cast<double>(config_.num_classes);
  return 2 * (patch_embedding + static_cast<double>(config_.depth) * per_block + classifier);
}

}  // namespace octet::models
