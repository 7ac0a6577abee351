// timm's Attention, with the layout of its fused qkv projection spelled out.
#include "autograd/ops.h"
#include "nn/layers.h"

namespace octet::nn {

MultiheadAttention::MultiheadAttention(int64_t dim, int64_t num_heads, bool qkv_bias, double attn_drop_rate,
                                       double proj_drop_rate, Generator* gen)
    : Module("MultiheadAttention"),
      dim(dim),
      num_heads(num_heads),
      head_dim(num_heads > 0 ? dim / num_heads : 0) {
  OCTET_CHECK(dim > 0 && num_heads > 0 && dim % num_heads == 0, "MultiheadAttention: dim ", dim,
              " must be a positive multiple of num_heads ", num_heads,
              "; pick a head count that divides dim");
  OCTET_CHECK(
      attn_drop_rate == 0.0, "MultiheadAttention: attn_drop = ", attn_drop_rate,
      " is not supported: the attention kernels (reference and fused) apply no dropout to the attention "
      "weights. Use attn_drop = 0 (timm's ViT default) and regularise with proj_drop or drop_path");
  qkv = register_module("qkv", std::make_shared<Linear>(dim, 3 * dim, qkv_bias));
  proj = register_module("proj", std::make_shared<Linear>(dim, dim));
  proj_drop = register_module("proj_drop", std::make_shared<Dropout>(proj_drop_rate, gen));
}

Tensor MultiheadAttention::forward(const Tensor& x) {
  OCTET_CHECK(x.dim() == 3 && x.size(2) == dim, "MultiheadAttention(dim ", dim, "): input ", x.describe(),
              " must be [B, N, ", dim, "]");
  const int64_t B = x.size(0), N = x.size(1);
  // qkv(x) [B, N, 3·dim] read as [B, N, 3, H, hd], then moved to [3, B, H, N, hd]: q, k and v are
  // then contiguous blocks along dim 0 (timm's reshape + permute, so checkpoints load as they are).
  const Tensor qkv_heads = permute(reshape((*qkv)(x), {B, N, 3, num_heads, head_dim}), {2, 0, 3, 1, 4});
  const Tensor q = select(qkv_heads, 0, 0), k = select(qkv_heads, 0, 1), v = select(qkv_heads, 0, 2);
  const Tensor heads = scaled_dot_product_attention(q, k, v);  // [B, H, N, hd]
  const Tensor merged = reshape(permute(heads, {0, 2, 1, 3}), {B, N, dim});
  return (*proj_drop)((*proj)(merged));
}

}  // namespace octet::nn
