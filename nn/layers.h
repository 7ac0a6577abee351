#pragma once
// The layers of a Vision Transformer, with PyTorch's and timm's names, parameter layouts and
// defaults, so that a timm checkpoint's keys and shapes map one to one.
//
// Parameters are f32 on the CPU when constructed; Module::to moves them. Constructors initialise
// parameters with PyTorch's defaults from default_generator(), unless a SkipInitGuard is active
// (models that initialise themselves, as timm's ViT does, construct their layers inside one).
// Dropout and DropPath draw their masks from the Generator given at construction
// (default_generator() when null), which must outlive the layer.
#include <cstdint>
#include <memory>
#include <utility>

#include "core/random.h"
#include "kernels/nn_ops.h"
#include "nn/module.h"

namespace octet::nn {

struct Fp8LinearState;
struct Fp8Config;

// y = x·Wᵀ + b over the last dim: x [..., in] -> [..., out].
// Inside an enabled Fp8Autocast scope (nn/fp8.h) it runs its GEMMs in FP8 (nn/fp8_linear.h), unless
// fp8_allowed is off or its sizes or dtypes do not suit FP8; then it says so once in the log and runs
// as usual.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  // residual + forward(x), the residual (the output's shape and dtype) added in the GEMM before its one
  // rounding (autograd's linear and nn::fp8_linear with a residual; cuBLASLt reads it as C on the GPU),
  // its gradient the output's. With forward hooks, (*this)(x) + residual: a hook sees the output
  // before the add, as it would without the fusion.
  Tensor residual_forward(const Tensor& x, const Tensor& residual);
  void reset_parameters(Generator& gen);  // PyTorch's default: uniform in ±1/sqrt(in_features)

  const int64_t in_features, out_features;
  Tensor weight;  // [out, in]
  Tensor bias;    // [out]; undefined when built with bias = false

  // The FP8 config this layer runs under for an input of x_dtype: the scope's, when FP8 is on, the
  // layer allows it and its sizes and dtypes suit it; else null (forward then runs unquantised).
  std::shared_ptr<const Fp8Config> fp8_config_for(DType x_dtype) const;

  // Off for layers a model keeps in higher precision under FP8 (a classifier head, as is usual).
  bool fp8_allowed = true;
  // Scales and amax histories, made by the first FP8 forward; saved by fp8_state_dict.
  std::shared_ptr<Fp8LinearState> fp8_state;

 private:
  Tensor run(const Tensor& x, const Tensor& residual);  // forward, with the residual when defined
  bool fp8_fallback_logged_ = false;
};

// Normalises over the last dim, then scales and shifts. eps defaults to timm's ViT value.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;
  // The residual add before a pre-norm layer, fused into this LayerNorm: returns {h, forward(h)}
  // with h = x + y, from one kernel per direction (autograd's add_layer_norm). Same parameters,
  // same results as `h = x + y; (*this)(h)` (bit for bit in f32 on the CPU). When the module has
  // forward hooks it runs exactly that, unfused: a hook must see h as the input before the
  // LayerNorm runs (a pre-hook may gather parameters or replace the input), and h only exists once
  // the fused kernel has run.
  //
  // Here and in add_linear_forward and Mlp's add_norm_* functions, y may be undefined: the residual
  // add already ran (TransformerBlock has attention's projection add it in its GEMM), so h is x itself,
  // kept as the LayerNorm node's output (autograd's residual_layer_norm) so that backward still sums
  // h's two gradients in the LayerNorm's pass.
  std::pair<Tensor, Tensor> add_forward(const Tensor& x, const Tensor& y);
  // This LayerNorm, then `next`: next(forward(x)). When `next` runs in FP8, the LayerNorm writes its
  // FP8 input itself and its output is never stored in x's dtype (nn::fp8_layernorm_linear, under
  // delayed scaling). When either module has forward hooks, or `next` runs unquantised, it is exactly
  // the two calls. Same results either way (bit for bit on the CPU).
  Tensor linear_forward(Linear& next, const Tensor& x);
  // linear_forward keeping x for the residual add after it: {r, next(forward(x))} with r = x as an output
  // of the LayerNorm's node (autograd's residual_layer_norm; nn::fp8_residual_layernorm_linear when
  // `next` runs in FP8), so that in backward r's gradient and the LayerNorm's input gradient are summed
  // in the LayerNorm's pass, not by a separate add. With hooks on either module, {x, next((*this)(x))}.
  std::pair<Tensor, Tensor> residual_linear_forward(Linear& next, const Tensor& x);
  // add_forward, then `next` on the normalised h: {h, next(forward(h))}, fused the same way
  // (nn::fp8_add_layernorm_linear).
  std::pair<Tensor, Tensor> add_linear_forward(Linear& next, const Tensor& x, const Tensor& y);
  void reset_parameters();  // weight ones, bias zeros

  const int64_t dim;
  const double eps;
  Tensor weight, bias;  // [dim]
};

// Zeroes each element with probability p and scales the rest by 1/(1-p); identity in eval mode or
// when p == 0.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  const double p;
  Generator& generator() const;  // the stream its masks come from (default_generator() when none was given)

 private:
  Generator* gen_;
};

// Stochastic depth (timm's DropPath): in training, each sample of the batch (dim 0) has its whole
// residual branch zeroed with probability p, and kept samples are scaled by 1/(1-p). The B-element
// mask is drawn on x's device from the generator's Philox stream (kernels::keep_mask): the same
// values on every device, and nothing read on the host.
class DropPath : public Module {
 public:
  explicit DropPath(double p = 0.0, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  const double p;
  Generator& generator() const;  // the stream its masks come from (default_generator() when none was given)

 private:
  Generator* gen_;
};

// Whether a Dropout or DropPath passes its input through untouched: p = 0 or evaluation, and no hook
// that could see or change what passes. The fused paths (a residual add in a GEMM, an MLP as one
// node) run only where the modules between them do.
template <class M>
bool passes_through(const M& m) {
  return (m.p == 0.0 || !m.is_training()) && !m.has_forward_hooks();
}

class GELU : public Module {
 public:
  explicit GELU(kernels::GeluApproximation approximation = kernels::GeluApproximation::None);
  Tensor forward(const Tensor& x) override;
  const kernels::GeluApproximation approximation;
};

// timm's Mlp: fc1 -> GELU -> drop1 -> fc2 -> drop2. `gelu` is the GELU's form: the erf form (timm's
// default) or the tanh approximation (timm's act_layer=partial(nn.GELU, approximate='tanh')).
class Mlp : public Module {
 public:
  Mlp(int64_t in_features, int64_t hidden_features, int64_t out_features, double drop = 0.0,
      Generator* gen = nullptr, kernels::GeluApproximation gelu = kernels::GeluApproximation::None);
  // Unquantised and with nothing that could see the difference (no hooks on fc1, act, drop1 or fc2;
  // drop1 the identity), fc1 -> GELU -> fc2 is one node (autograd's linear_gelu_linear): its GELU
  // backward pass also sums fc1's bias gradient, and with the tanh form its GEMMs carry the GELU on the
  // GPU.
  Tensor forward(const Tensor& x) override;
  // The layers after fc1, given fc1's output: forward(x) is after_fc1((*fc1)(x)). For a caller that
  // runs fc1 itself (TransformerBlock, with norm2 writing fc1's FP8 input).
  Tensor after_fc1(const Tensor& hidden);
  // The residual add and the pre-norm before this MLP: {h, forward(norm(h))} with h = x + y, as
  // norm.add_forward then this module. Under FP8 with delayed scaling, and with nothing that could
  // see the difference (no hooks on norm, fc1, act, drop1 or fc2; drop1 the identity), it is one
  // node (nn::fp8_add_layernorm_mlp): every cast rides on the kernel before it. For a caller that
  // owns the residual (TransformerBlock).
  std::pair<Tensor, Tensor> add_norm_forward(LayerNorm& norm, const Tensor& x, const Tensor& y);
  // add_norm_forward with h added back to the output: h + forward(norm(h)), h = x + y, the whole second
  // half of a pre-norm block. Where drop2 is the identity with no hooks and add_norm_forward's MLP is
  // one node, fc2's GEMM adds h before its one rounding (cuBLASLt reads it as C on the GPU): under FP8
  // nn::fp8_add_layernorm_mlp_residual, without it linear_gelu_linear with h as its residual.
  // Otherwise add_norm_forward and the add. In both, y may be undefined: h is then x itself, its
  // residual add already done (LayerNorm::add_forward).
  Tensor add_norm_residual_forward(LayerNorm& norm, const Tensor& x, const Tensor& y);

  std::shared_ptr<Linear> fc1;
  std::shared_ptr<GELU> act;
  std::shared_ptr<Dropout> drop1;
  std::shared_ptr<Linear> fc2;
  std::shared_ptr<Dropout> drop2;

 private:
  // Whether fc1, act, drop1 and fc2 run as autograd's linear_gelu_linear for an input of x_dtype.
  bool runs_as_one_node(DType x_dtype) const;
};

// timm's Attention: one fused qkv projection [3·dim, dim] whose output is read as [B, N, 3, H, hd]
// (q, k and v each a contiguous block of dim rows of the weight, heads contiguous inside them),
// scaled dot-product attention per head, then the output projection. x [B, N, dim] -> [B, N, dim].
class MultiheadAttention : public Module {
 public:
  // attn_drop must be 0: the attention kernels have no dropout (timm's ViTs use 0).
  MultiheadAttention(int64_t dim, int64_t num_heads, bool qkv_bias = true, double attn_drop = 0.0,
                     double proj_drop = 0.0, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  // The layers after qkv, given qkv's output [B, N, 3·dim]: forward(x) is after_qkv((*qkv)(x)). For a
  // caller that runs qkv itself (TransformerBlock, with norm1 writing qkv's FP8 input). With a residual
  // ([B, N, dim], the output's dtype), residual + after_qkv(qkv_out): where proj_drop passes its input
  // through, proj's GEMM adds it (Linear::residual_forward), else an add after proj_drop.
  Tensor after_qkv(const Tensor& qkv_out, const Tensor& residual = Tensor());

  const int64_t dim, num_heads, head_dim;
  std::shared_ptr<Linear> qkv;
  std::shared_ptr<Linear> proj;
  std::shared_ptr<Dropout> proj_drop;
};

// timm's pre-norm Block: x + drop_path(attn(norm1(x))), then x + drop_path(mlp(norm2(x))). `gelu` is
// the MLP's GELU form (Mlp).
class TransformerBlock : public Module {
 public:
  TransformerBlock(int64_t dim, int64_t num_heads, double mlp_ratio = 4.0, bool qkv_bias = true,
                   double proj_drop = 0.0, double attn_drop = 0.0, double drop_path = 0.0,
                   Generator* gen = nullptr, kernels::GeluApproximation gelu = kernels::GeluApproximation::None);
  Tensor forward(const Tensor& x) override;

  // Activation recompute (nn/recompute.h): when on and gradients are being recorded, forward
  // keeps only the block's input, and backward runs the block again to rebuild the rest. Dropout and
  // DropPath draw the same masks in the rerun (every stream the block's Dropout and DropPath modules
  // draw from, a LoRA adapter's dropout included, and the default one, are rewound for it and put
  // back after), and under FP8 the rerun casts with the forward's scales and records no
  // amax (nn/fp8.h, Fp8Replay), so gradients and FP8 state are bit for bit those without recompute.
  bool recompute = false;

  std::shared_ptr<LayerNorm> norm1;
  std::shared_ptr<MultiheadAttention> attn;
  std::shared_ptr<DropPath> drop_path1;
  std::shared_ptr<LayerNorm> norm2;
  std::shared_ptr<Mlp> mlp;
  std::shared_ptr<DropPath> drop_path2;

 private:
  Tensor run(const Tensor& x);  // the block's computation, recorded or recomputed
};

// A Conv2d whose stride equals its kernel, as PatchEmbed uses it: every p×p patch is projected on
// its own, so the convolution is patchify (features in (c, ky, kx) order) followed by a Linear with
// the weight read as [D, C·p·p]. Returns tokens [B, N, D] (timm's conv output flattened and
// transposed) for images [B, C, H, W]. Images of another floating dtype (f32 from a loader) are cast
// to the weight's dtype first, so a model converted with to(DType::bf16) takes f32 images as they are.
class PatchProjection : public Module {
 public:
  PatchProjection(int64_t in_chans, int64_t embed_dim, int64_t patch_size);
  Tensor forward(const Tensor& images) override;
  void reset_parameters(Generator& gen);  // PyTorch's Conv2d default: uniform in ±1/sqrt(C·p·p)

  const int64_t in_chans, embed_dim, patch_size;
  Tensor weight;  // [D, C, p, p]
  Tensor bias;    // [D]
};

// timm's PatchEmbed: images [B, C, img, img] -> patch tokens [B, (img/p)², D] through `proj`.
class PatchEmbed : public Module {
 public:
  PatchEmbed(int64_t img_size, int64_t patch_size, int64_t in_chans, int64_t embed_dim);
  Tensor forward(const Tensor& images) override;

  const int64_t img_size, patch_size, in_chans, embed_dim, num_patches;
  std::shared_ptr<PatchProjection> proj;
};

// Mean softmax cross-entropy of logits [N, C] against class indices [N] (i64), with PyTorch's
// label smoothing: the target is (1 - s)·onehot + s/C. Not a Module: it takes two inputs and holds
// no parameters.
class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(double label_smoothing = 0.0);
  Tensor operator()(const Tensor& logits, const Tensor& targets) const;
  const double label_smoothing;
};

}  // namespace octet::nn
