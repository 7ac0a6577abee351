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
  // qkv(x) is [B, N, 3·dim], read as [B, N, 3, H, hd] (timm's layout, so checkpoints load as they
  // are). The attention reads q, k and v out of it in place and writes its output as [B, N, H·hd],
  // heads side by side as `proj` expects: no permutes, no selects, and in backward one qkv-shaped
  // gradient instead of three zero-padded ones summed.
  return after_qkv((*qkv)(x));
}

Tensor MultiheadAttention::after_qkv(const Tensor& qkv_out, const Tensor& residual) {
  OCTET_CHECK(qkv_out.dim() == 3 && qkv_out.size(2) == 3 * dim, "MultiheadAttention(dim ", dim, "): qkv output ",
              qkv_out.describe(), " must be [B, N, ", 3 * dim, "]");
  const Tensor heads = packed_qkv_attention(qkv_out, num_heads);  // [B, N, dim]
  if (!residual.defined()) return (*proj_drop)((*proj)(heads));
  OCTET_CHECK(residual.shape() == heads.shape() && residual.dtype() == heads.dtype(), "MultiheadAttention(dim ", dim,
              "): the residual ", residual.describe(), " must have the output's shape ", heads.shape(), " and dtype ",
              dtype_name(heads.dtype()));
  if (passes_through(*proj_drop)) return proj->residual_forward(heads, residual);
  return residual + (*proj_drop)((*proj)(heads));
}

}  // namespace octet::nn
