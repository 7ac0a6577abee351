// The parameter-light layers: Linear, LayerNorm, GELU, Dropout, DropPath and the loss.
#include "autograd/ops.h"
#include "core/grad_mode.h"
#include "core/log.h"
#include "kernels/random_masks.h"
#include "nn/fp8.h"
#include "nn/fp8_linear.h"
#include "nn/init.h"
#include "nn/layers.h"

namespace octet::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : Module("Linear"), in_features(in_features), out_features(out_features) {
  OCTET_CHECK(in_features > 0 && out_features > 0,
              "Linear: in_features and out_features must be positive, got ", in_features, " and ",
              out_features);
  weight = register_parameter("weight", empty({out_features, in_features}));
  if (bias) this->bias = register_parameter("bias", empty({out_features}));
  if (init_enabled()) reset_parameters(default_generator());
}

std::shared_ptr<const Fp8Config> Linear::fp8_config_for(DType x_dtype) const {
  if (!fp8_allowed) return nullptr;
  std::shared_ptr<const Fp8Config> config = fp8_config();
  if (config == nullptr || !fp8_linear_unsupported_reason(in_features, out_features, x_dtype, weight.dtype()).empty()) {
    return nullptr;
  }
  return config;
}

Tensor Linear::forward(const Tensor& x) { return run(x, Tensor()); }

Tensor Linear::residual_forward(const Tensor& x, const Tensor& residual) {
  if (!residual.defined()) return (*this)(x);
  if (has_forward_hooks()) return (*this)(x) + residual;
  return run(x, residual);
}

Tensor Linear::run(const Tensor& x, const Tensor& residual) {
  OCTET_CHECK(x.dim() >= 1 && x.size(-1) == in_features, "Linear(", in_features, " -> ", out_features,
              "): input ", x.describe(), " must end in ", in_features, " features");
  if (fp8_allowed) {
    if (std::shared_ptr<const Fp8Config> config = fp8_config()) {
      const std::string reason = fp8_linear_unsupported_reason(in_features, out_features, x.dtype(), weight.dtype());
      if (reason.empty()) return fp8_linear(x, weight, bias, fp8_state, config, residual);
      OCTET_CHECK(fp8_state == nullptr || !fp8_state->weight_cache.supplied(), "Linear(", in_features, " -> ",
                  out_features, "): FSDP's FP8 all-gather supplies this layer's weight in FP8 only, but the layer "
                  "cannot run in FP8: ", reason, "; turn fp8_all_gather off, or set fp8_allowed = false on the "
                  "layer before wrapping the model");
      if (!fp8_fallback_logged_) {
        logging::info("Linear({} -> {}) runs in {}, not FP8: {}", in_features, out_features, dtype_name(x.dtype()),
                  reason);
        fp8_fallback_logged_ = true;
      }
    }
  }
  return linear(x, weight, bias, residual);
}

void Linear::reset_parameters(Generator& gen) { pytorch_default_init_(weight, bias, gen); }

LayerNorm::LayerNorm(int64_t dim, double eps) : Module("LayerNorm"), dim(dim), eps(eps) {
  OCTET_CHECK(dim > 0, "LayerNorm: dim must be positive, got ", dim);
  weight = register_parameter("weight", empty({dim}));
  bias = register_parameter("bias", empty({dim}));
  if (init_enabled()) reset_parameters();
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, weight, bias, eps); }

std::pair<Tensor, Tensor> LayerNorm::add_forward(const Tensor& x, const Tensor& y) {
  if (!y.defined()) {
    if (has_forward_hooks()) return {x, (*this)(x)};
    return residual_layer_norm(x, weight, bias, eps);
  }
  if (has_forward_hooks()) {
    const Tensor h = x + y;
    return {h, (*this)(h)};
  }
  return add_layer_norm(x, y, weight, bias, eps);
}

// The fused path only where nothing can tell the difference: neither module has hooks (a hook must see
// the LayerNorm's output as the Linear's input), and the Linear runs in FP8.
namespace {

// The FP8 config under which `norm` may write `next`'s FP8 input for x, or null for the two calls.
std::shared_ptr<const Fp8Config> fused_config(const LayerNorm& norm, const Linear& next, const Tensor& x) {
  if (norm.has_forward_hooks() || next.has_forward_hooks()) return nullptr;
  std::shared_ptr<const Fp8Config> config = next.fp8_config_for(x.dtype());
  if (config != nullptr) {
    OCTET_CHECK(x.dim() >= 1 && x.size(-1) == norm.dim && norm.dim == next.in_features, "LayerNorm(", norm.dim,
                ") then Linear(", next.in_features, " -> ", next.out_features, "): input ", x.describe(),
                " must end in ", norm.dim, " features, and the Linear must take ", norm.dim);
  }
  return config;
}

}  // namespace

Tensor LayerNorm::linear_forward(Linear& next, const Tensor& x) {
  if (std::shared_ptr<const Fp8Config> config = fused_config(*this, next, x)) {
    return fp8_layernorm_linear(x, weight, bias, eps, next.weight, next.bias, next.fp8_state, config);
  }
  return next((*this)(x));
}

std::pair<Tensor, Tensor> LayerNorm::residual_linear_forward(Linear& next, const Tensor& x) {
  if (std::shared_ptr<const Fp8Config> config = fused_config(*this, next, x)) {
    return fp8_residual_layernorm_linear(x, weight, bias, eps, next.weight, next.bias, next.fp8_state, config);
  }
  if (has_forward_hooks()) return {x, next((*this)(x))};
  const auto [r, normed] = residual_layer_norm(x, weight, bias, eps);
  return {r, next(normed)};
}

std::pair<Tensor, Tensor> LayerNorm::add_linear_forward(Linear& next, const Tensor& x, const Tensor& y) {
  if (!y.defined()) return residual_linear_forward(next, x);
  if (std::shared_ptr<const Fp8Config> config = fused_config(*this, next, x)) {
    return fp8_add_layernorm_linear(x, y, weight, bias, eps, next.weight, next.bias, next.fp8_state, config);
  }
  const auto [h, normed] = add_forward(x, y);
  return {h, next(normed)};
}

void LayerNorm::reset_parameters() {
  ones_(weight);
  zeros_(bias);
}

Dropout::Dropout(double p, Generator* gen) : Module("Dropout"), p(p), gen_(gen) {
  OCTET_CHECK(p >= 0.0 && p < 1.0, "Dropout: p must be in [0, 1), got ", p);
}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p, is_training(), gen_); }

Generator& Dropout::generator() const { return gen_ != nullptr ? *gen_ : default_generator(); }

DropPath::DropPath(double p, Generator* gen) : Module("DropPath"), p(p), gen_(gen) {
  OCTET_CHECK(p >= 0.0 && p < 1.0, "DropPath: p must be in [0, 1), got ", p);
}

Tensor DropPath::forward(const Tensor& x) {
  if (!is_training() || p == 0.0) return x;
  OCTET_CHECK(x.dim() >= 1, "DropPath: input ", x.describe(), " needs a batch dim");
  // One keep/drop decision per sample, broadcast over the rest: mask [B, 1, ..., 1].
  Shape mask_shape(static_cast<size_t>(x.dim()), 1);
  mask_shape[0] = x.size(0);
  Generator& gen = generator();
  const double keep = 1.0 - p;
  // Drawn on x's device from the generator's Philox stream, never read on the host: the (seed, offset)
  // and the draws rand(mask_shape, gen) would take, so the mask is `rand() < keep ? 1 / keep : 0`.
  const uint64_t seed = gen.seed();
  const uint64_t offset = gen.reserve_for(mask_shape.numel());
  return mul(x, kernels::keep_mask(mask_shape, keep, 1.0 / keep, x.dtype(), x.device(), seed, offset));
}

Generator& DropPath::generator() const { return gen_ != nullptr ? *gen_ : default_generator(); }

GELU::GELU(kernels::GeluApproximation approximation) : Module("GELU"), approximation(approximation) {}

Tensor GELU::forward(const Tensor& x) { return gelu(x, approximation); }

CrossEntropyLoss::CrossEntropyLoss(double label_smoothing) : label_smoothing(label_smoothing) {
  OCTET_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
              "CrossEntropyLoss: label_smoothing must be in [0, 1], got ", label_smoothing);
}

Tensor CrossEntropyLoss::operator()(const Tensor& logits, const Tensor& targets) const {
  return cross_entropy(logits, targets, label_smoothing);
}

}  // namespace octet::nn
