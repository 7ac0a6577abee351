// The transformer's building blocks: timm's Mlp and pre-norm Block, and the patch embedding.
#include "autograd/ops.h"
#include "core/random.h"
#include "nn/fp8.h"
#include "nn/fp8_linear.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/recompute.h"

namespace octet::nn {
namespace {

// The FP8 config under which norm then the whole MLP runs as one FP8 node (nn::fp8_add_layernorm_mlp
// and its _residual form): nothing sits between the layers (drop1 passes through, no hooks on norm,
// fc1, act or fc2), x ends in norm's width, which fc1 takes, and both Linears run in FP8. Else null.
std::shared_ptr<const Fp8Config> fp8_mlp_config(const Mlp& mlp, const LayerNorm& norm, const Tensor& x) {
  const bool adjacent = passes_through(*mlp.drop1) && !norm.has_forward_hooks() && !mlp.fc1->has_forward_hooks() &&
                        !mlp.act->has_forward_hooks() && !mlp.fc2->has_forward_hooks();
  if (!adjacent || x.dim() < 1 || x.size(-1) != norm.dim || norm.dim != mlp.fc1->in_features) return nullptr;
  std::shared_ptr<const Fp8Config> config = mlp.fc1->fp8_config_for(x.dtype());
  return config != nullptr && mlp.fc2->fp8_config_for(x.dtype()) != nullptr ? config : nullptr;
}

}  // namespace

Mlp::Mlp(int64_t in_features, int64_t hidden_features, int64_t out_features, double drop, Generator* gen,
         kernels::GeluApproximation gelu)
    : Module("Mlp") {
  fc1 = register_module("fc1", std::make_shared<Linear>(in_features, hidden_features));
  act = register_module("act", std::make_shared<GELU>(gelu));
  drop1 = register_module("drop1", std::make_shared<Dropout>(drop, gen));
  fc2 = register_module("fc2", std::make_shared<Linear>(hidden_features, out_features));
  drop2 = register_module("drop2", std::make_shared<Dropout>(drop, gen));
}

// One node wherever nothing can tell the difference: the GELU's backward pass then also sums fc1's bias
// gradient (gelu_backward_and_forward), where fc1's Linear would have cuBLASLt's BGRADB epilogue read
// the GELU's input gradient again; with the tanh form cuBLASLt's GELU epilogue also runs fc1's forward.
// Under FP8 (or where a Linear would try FP8 and fall back, which it must say) the modules decide.
bool Mlp::runs_as_one_node(DType x_dtype) const {
  auto unquantised = [x_dtype](const Linear& fc) {
    return fc.fp8_config_for(x_dtype) == nullptr && (!fc.fp8_allowed || fp8_config() == nullptr);
  };
  return passes_through(*drop1) && !fc1->has_forward_hooks() && !act->has_forward_hooks() &&
         !fc2->has_forward_hooks() && unquantised(*fc1) && unquantised(*fc2);
}

Tensor Mlp::forward(const Tensor& x) {
  if (runs_as_one_node(x.dtype())) {
    OCTET_CHECK(x.dim() >= 1 && x.size(-1) == fc1->in_features, "Mlp: input ", x.describe(), " must end in fc1's ",
                fc1->in_features, " features");
    return (*drop2)(linear_gelu_linear(x, fc1->weight, fc1->bias, act->approximation, fc2->weight, fc2->bias));
  }
  return after_fc1((*fc1)(x));
}

// When nothing sits between the GELU and fc2 -- drop1 is the identity (p = 0, or evaluation) and
// none of act, drop1 and fc2 has a hook -- they run as one function: under FP8 the GELU writes fc2's
// FP8 input itself (nn::fp8_gelu_linear); without FP8 autograd's gelu_linear, which keeps only the
// GELU's input for backward and makes its output again there (the largest activation of a block:
// ViT-H at batch 64 saves 4.1 GB less in bf16, and backward reads the hidden tensor once more). A
// Linear that would try FP8 and fall back (a shape FP8 cannot take) runs as a module, to say so.
// Otherwise the modules one after the other.
Tensor Mlp::after_fc1(const Tensor& hidden) {
  if (passes_through(*drop1) && !act->has_forward_hooks() && !fc2->has_forward_hooks()) {
    OCTET_CHECK(hidden.dim() >= 1 && hidden.size(-1) == fc2->in_features, "Mlp: hidden ", hidden.describe(),
                " must end in fc2's ", fc2->in_features, " features");
    if (std::shared_ptr<const Fp8Config> config = fc2->fp8_config_for(hidden.dtype())) {
      return (*drop2)(fp8_gelu_linear(hidden, act->approximation, fc2->weight, fc2->bias, fc2->fp8_state, config));
    }
    if (!fc2->fp8_allowed || fp8_config() == nullptr) {
      return (*drop2)(gelu_linear(hidden, act->approximation, fc2->weight, fc2->bias));
    }
  }
  return (*drop2)((*fc2)((*drop1)((*act)(hidden))));
}

std::pair<Tensor, Tensor> Mlp::add_norm_forward(LayerNorm& norm, const Tensor& x, const Tensor& y) {
  if (std::shared_ptr<const Fp8Config> config = fp8_mlp_config(*this, norm, x)) {
    const auto [h, out] = fp8_add_layernorm_mlp(x, y, norm.weight, norm.bias, norm.eps,
                                                {fc1->weight, fc1->bias, fc1->fp8_state}, act->approximation,
                                                {fc2->weight, fc2->bias, fc2->fp8_state}, config);
    return {h, (*drop2)(out)};
  }
  if (runs_as_one_node(x.dtype())) {
    const auto [h, normed] = norm.add_forward(x, y);
    return {h, forward(normed)};
  }
  const auto [h, hidden] = norm.add_linear_forward(*fc1, x, y);
  return {h, after_fc1(hidden)};
}

Tensor Mlp::add_norm_residual_forward(LayerNorm& norm, const Tensor& x, const Tensor& y) {
  const bool drop2_identity = passes_through(*drop2);
  if (drop2_identity && fc2->out_features == norm.dim) {
    if (std::shared_ptr<const Fp8Config> config = fp8_mlp_config(*this, norm, x)) {
      return fp8_add_layernorm_mlp_residual(x, y, norm.weight, norm.bias, norm.eps,
                                            {fc1->weight, fc1->bias, fc1->fp8_state}, act->approximation,
                                            {fc2->weight, fc2->bias, fc2->fp8_state}, config);
    }
  }
  if (drop2_identity && runs_as_one_node(x.dtype()) && !has_forward_hooks()) {
    OCTET_CHECK(x.dim() >= 1 && x.size(-1) == fc1->in_features && fc2->out_features == x.size(-1), "Mlp: input ",
                x.describe(), " must end in fc1's ", fc1->in_features, " features, and fc2 must give as many");
    const auto [h, normed] = norm.add_forward(x, y);
    return linear_gelu_linear(normed, fc1->weight, fc1->bias, act->approximation, fc2->weight, fc2->bias, h);
  }
  const auto [h, out] = add_norm_forward(norm, x, y);
  return h + out;
}

TransformerBlock::TransformerBlock(int64_t dim, int64_t num_heads, double mlp_ratio, bool qkv_bias,
                                   double proj_drop, double attn_drop, double drop_path, Generator* gen,
                                   kernels::GeluApproximation gelu)
    : Module("TransformerBlock") {
  OCTET_CHECK(mlp_ratio > 0, "TransformerBlock: mlp_ratio must be positive, got ", mlp_ratio);
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(dim));
  attn = register_module(
      "attn", std::make_shared<MultiheadAttention>(dim, num_heads, qkv_bias, attn_drop, proj_drop, gen));
  drop_path1 = register_module("drop_path1", std::make_shared<DropPath>(drop_path, gen));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(dim));
  // timm: hidden_features = int(dim * mlp_ratio).
  const auto hidden = static_cast<int64_t>(static_cast<double>(dim) * mlp_ratio);
  mlp = register_module("mlp", std::make_shared<Mlp>(dim, hidden, dim, proj_drop, gen, gelu));
  drop_path2 = register_module("drop_path2", std::make_shared<DropPath>(drop_path, gen));
}

// timm's block: h = x + drop_path1(attn(norm1(x))); out = h + drop_path2(mlp(norm2(h))).
// Both residual adds ride in a GEMM's epilogue where nothing sits between the add and the GEMM:
// the first in attn.proj's (drop_path1 and proj_drop pass their input through, proj has no hook;
// MultiheadAttention::after_qkv with x as the residual), the second in fc2's (drop_path2 the
// identity, the MLP one node; Mlp::add_norm_residual_forward). cuBLASLt reads the residual as the
// GEMM's C and rounds the sum once. Each LayerNorm keeps its input as an output of its node
// (autograd's residual_layer_norm), so that in backward the input's two gradients, the residual's and
// the LayerNorm's, are summed in the LayerNorm's own pass, never by a separate add.
//
// Bytes, ViT-H/16 at batch 64 in bf16 (12,608 rows of 1280, 32.3 MB a tensor): with the first add in
// proj's GEMM, norm2 reads h and writes its output (64.7 MB) where the fused add + LayerNorm read x
// and proj's output and wrote h and the output (129.2 MB); proj's epilogue reads x (32.3 MB) more.
// 32.3 MB a block less in forward; backward moves the same bytes either way.
//
// Where drop path or proj's dropout is on (or attn, proj or drop_path1 has a hook), the first add is
// fused into norm2 instead (LayerNorm::add_forward, one pass writing h and normalising it). norm1 is
// not fused with the previous block's last residual add, although the same kernel could do it: that
// add belongs to the previous block, and the fusion would cross the block boundary. FSDP wraps each block as a unit (it
// gathers the block's parameters in the block's pre-hook, so norm1's weights do not exist yet when the
// previous block runs), and a per-block activation recompute would need each block's graph to start
// at its own input.
//
// Each LayerNorm also runs together with what it feeds: norm1 with attn.qkv
// (LayerNorm::residual_linear_forward), norm2 with the whole MLP (Mlp::add_norm_forward). Without FP8
// that is the modules one after the other (the MLP as one node); under FP8 with delayed scaling the
// LayerNorm writes the Linear's E4M3 input (and its transpose and amax) in its own pass, as
// Transformer Engine's LayerNormLinear and LayerNormMLP do, the GELU writes fc2's, and GELU's backward
// writes fc1's output gradient in E5M2 with fc1's bias gradient. A hook on attn or mlp must see their
// inputs, so then they are called as modules, unfused.
Tensor TransformerBlock::forward(const Tensor& x) {
  if (!recompute) return run(x);
  return nn::recompute(*this, [this](const Tensor& t) { return run(t); }, x);
}

Tensor TransformerBlock::run(const Tensor& x) {
  // h = residual + branch; branch stays undefined where the add already ran (residual is then h).
  Tensor residual = x, branch;
  if (attn->has_forward_hooks()) {
    branch = (*drop_path1)((*attn)((*norm1)(x)));
  } else {
    auto [r, qkv] = norm1->residual_linear_forward(*attn->qkv, x);
    if (passes_through(*drop_path1) && passes_through(*attn->proj_drop) && !attn->proj->has_forward_hooks()) {
      residual = attn->after_qkv(qkv, r);  // h, the add in proj's GEMM
    } else {
      residual = std::move(r);
      branch = (*drop_path1)(attn->after_qkv(qkv));
    }
  }
  if (mlp->has_forward_hooks()) {
    const auto [h, normed] = norm2->add_forward(residual, branch);
    return h + (*drop_path2)((*mlp)(normed));
  }
  // drop_path2 the identity: the last residual add rides in fc2's GEMM where the MLP is one node.
  if (passes_through(*drop_path2)) return mlp->add_norm_residual_forward(*norm2, residual, branch);
  const auto [h, mlp_out] = mlp->add_norm_forward(*norm2, residual, branch);
  return h + (*drop_path2)(mlp_out);
}

PatchProjection::PatchProjection(int64_t in_chans, int64_t embed_dim, int64_t patch_size)
    : Module("PatchProjection"), in_chans(in_chans), embed_dim(embed_dim), patch_size(patch_size) {
  OCTET_CHECK(in_chans > 0 && embed_dim > 0 && patch_size > 0, "PatchProjection: in_chans ", in_chans,
              ", embed_dim ", embed_dim, " and patch_size ", patch_size, " must be positive");
  weight = register_parameter("weight", empty({embed_dim, in_chans, patch_size, patch_size}));
  bias = register_parameter("bias", empty({embed_dim}));
  if (init_enabled()) reset_parameters(default_generator());
}

Tensor PatchProjection::forward(const Tensor& images) {
  OCTET_CHECK(images.dim() == 4 && images.size(1) == in_chans, "PatchProjection: images ", images.describe(),
              " must be [B, ", in_chans, ", H, W]");
  // Images arrive as f32 from the loader; a bf16 model computes in bf16 from here on (a no-op when
  // the dtypes already match).
  const Tensor patches = patchify(cast(images, weight.dtype()), patch_size);  // [B, N, C·p·p], (c, ky, kx)
  return linear(patches, reshape(weight, {embed_dim, in_chans * patch_size * patch_size}), bias);
}

void PatchProjection::reset_parameters(Generator& gen) { pytorch_default_init_(weight, bias, gen); }

PatchEmbed::PatchEmbed(int64_t img_size, int64_t patch_size, int64_t in_chans, int64_t embed_dim)
    : Module("PatchEmbed"),
      img_size(img_size),
      patch_size(patch_size),
      in_chans(in_chans),
      embed_dim(embed_dim),
      num_patches(patch_size > 0 ? (img_size / patch_size) * (img_size / patch_size) : 0) {
  OCTET_CHECK(patch_size > 0 && img_size > 0 && img_size % patch_size == 0, "PatchEmbed: img_size ", img_size,
              " must be a positive multiple of patch_size ", patch_size);
  proj = register_module("proj", std::make_shared<PatchProjection>(in_chans, embed_dim, patch_size));
}

Tensor PatchEmbed::forward(const Tensor& images) {
  OCTET_CHECK(images.dim() == 4 && images.size(1) == in_chans && images.size(2) == img_size &&
                  images.size(3) == img_size,
              "PatchEmbed: images ", images.describe(), " must be [B, ", in_chans, ", ", img_size, ", ",
              img_size, "]; resize the images or build the model for this size");
  return (*proj)(images);
}

}  // namespace octet::nn
