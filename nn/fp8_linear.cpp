// The FP8 Linear (nn/fp8_linear.h): casts, the three FP8 GEMMs, and what backward keeps.
#include "nn/fp8_linear.h"

#include <atomic>
#include <optional>

#include "autograd/function.h"
#include "core/grad_mode.h"
#include "kernels/fp8_gemm.h"
#include "kernels/reduce.h"

namespace octet::nn {

std::string fp8_linear_unsupported_reason(int64_t in_features, int64_t out_features, DType x_dtype,
                                          DType weight_dtype) {
  std::string reason;
  for (DType d : {x_dtype, weight_dtype}) {
    if (d != DType::f32 && d != DType::bf16) {
      reason = std::string("its ") + (d == x_dtype ? "input" : "weight") + " is " + dtype_name(d) +
               ", and FP8 GEMMs write bf16 or f32";
    }
  }
  if (in_features % 16 != 0 || out_features % 16 != 0) {
    reason = "in_features " + std::to_string(in_features) + " and out_features " + std::to_string(out_features) +
             " must both be multiples of 16 for the FP8 GEMM";
  }
  return reason;
}

namespace {

std::atomic<bool> fused_bias_grad{true};

// One cast pass: fp8_cast, or with a dbias_dtype fp8_cast_dbias, which also sums x's columns (the bias
// gradient when x is an output gradient) from the same read of x.
kernels::Fp8CastWithBiasGrad cast_pass(const Tensor& x, const Tensor& scale, const Tensor& amax, DType fp8_dtype,
                                       bool rowwise, bool transposed, std::optional<DType> dbias_dtype) {
  if (dbias_dtype) return kernels::fp8_cast_dbias(x, scale, amax, fp8_dtype, rowwise, transposed, *dbias_dtype);
  kernels::Fp8CastWithBiasGrad out;
  static_cast<kernels::Fp8Cast&>(out) = kernels::fp8_cast(x, scale, amax, fp8_dtype, rowwise, transposed);
  return out;
}

// Casts an activation or a gradient: entry j of a scaling group, and with a dbias_dtype the column sums
// of x in that dtype (out.dbias). Delayed scaling casts with the scale the history gave and records x's
// amax in history row 0 as it goes: one pass over x. Current scaling measures x first, derives the
// scale from that amax (left in row 0 for inspection) and then casts: one more pass over x, since the
// scale is not known before the amax is (the column sums still ride along with the cast).
kernels::Fp8CastWithBiasGrad cast_entry(const Tensor& x, const kernels::Fp8ScalingTensors& group, int64_t j,
                                        const Fp8Recipe& recipe, bool rowwise, bool transposed,
                                        std::optional<DType> dbias_dtype = std::nullopt) {
  const Fp8LinearState::Entry e = Fp8LinearState::entry(group, j);
  if (recipe.is_delayed()) return cast_pass(x, e.scale, e.amax, group.fp8_dtype, rowwise, transposed, dbias_dtype);
  e.amax.zero_();
  kernels::fp8_amax_(x, e.amax);
  kernels::fp8_scale_from_amax_(e.amax, e.scale, e.scale_inv, group.fp8_dtype, recipe.margin());
  return cast_pass(x, e.scale, Tensor(), group.fp8_dtype, rowwise, transposed, dbias_dtype);
}

// The weight's cast: the cached one while the weight is unchanged (Fp8WeightCache), else made again
// from its amax with record_weight_amax, which FSDP's FP8 all-gather uses for its shards too.
const kernels::Fp8Cast& weight_cast(Fp8LinearState& state, const Tensor& weight, const Fp8Recipe& recipe,
                                    bool need_transposed) {
  Fp8WeightCache& cache = state.weight_cache;
  if (cache.supplied()) {
    OCTET_CHECK(cache.supplied_is_current(),
                "fp8_linear: this layer's FP8 weight is supplied from outside (FSDP's FP8 all-gather) but was "
                "made before the weights last changed (an optimizer step, a load); run the forward through the "
                "FSDP-wrapped model, which supplies it afresh");
    OCTET_CHECK(!need_transposed || cache.cast().transposed.defined(),
                "fp8_linear: this layer's FP8 weight is supplied from outside (FSDP's FP8 all-gather) without "
                "the transposed copy a gradient needs: the wrapped model's forward began with gradients off; "
                "enable them before the forward, not inside it");
    return cache.cast();
  }
  if (const kernels::Fp8Cast* cached = cache.find(weight, need_transposed)) return *cached;
  const Tensor amax = zeros({1}, DType::f32, weight.device());
  kernels::fp8_amax_(weight, amax);
  const Fp8LinearState::Entry w = record_weight_amax(state, amax, recipe);
  cache.store(weight, kernels::fp8_cast(weight, w.scale, Tensor(), state.forward.fp8_dtype, /*rowwise=*/true,
                                        need_transposed));
  return cache.cast();
}

}  // namespace

Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, std::shared_ptr<Fp8LinearState>& state,
                  const std::shared_ptr<const Fp8Config>& config) {
  OCTET_CHECK(config != nullptr, "fp8_linear: no FP8 config; run it inside an enabled nn::Fp8Autocast scope");
  OCTET_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1),
              "fp8_linear: x must be [..., in] and weight [out, in], got ", x.describe(), " and ", weight.describe());
  const int64_t out = weight.size(0), in = weight.size(1);
  const std::string reason = fp8_linear_unsupported_reason(in, out, x.dtype(), weight.dtype());
  OCTET_CHECK(reason.empty(), "fp8_linear: cannot run Linear(", in, " -> ", out, ") in FP8: ", reason,
              "; run it with nn::linear instead (nn::Linear falls back by itself)");
  OCTET_CHECK(x.device() == weight.device() && (!bias.defined() || bias.device() == x.device()),
              "fp8_linear: x ", x.describe(), ", weight ", weight.describe(), " and bias must share a device");
  const Fp8Recipe& recipe = config->recipe;
  Fp8LinearState::prepare(state, weight.device(), recipe);

  const bool grad_on = GradMode::is_enabled();
  const bool need_dx = grad_on && x.requires_grad();
  const bool need_dw = grad_on && weight.requires_grad();
  const bool need_db = grad_on && bias.defined() && bias.requires_grad();
  const Tensor x2 = x.detach().reshape({-1, in});
  const int64_t rows = x2.size(0);

  const kernels::Fp8Cast xq = cast_entry(x2, state->forward, Fp8FwdTensors::kInput, recipe, /*rowwise=*/true, /*transposed=*/need_dw);
  const kernels::Fp8Cast wq = weight_cast(*state, weight.detach(), recipe, /*need_transposed=*/need_dx);
  fp8_forward_ran(state);

  const DType y_dtype = x.dtype();
  Tensor y = empty({rows, out}, y_dtype, x.device());
  const Tensor b = bias.defined() ? bias.detach().to(y_dtype) : Tensor();
  kernels::fp8_gemm(xq.data, xq.scale_inv, wq.data, wq.scale_inv, y, b, /*accumulate=*/false, /*fast_accumulate=*/true);
  Shape y_shape = x.shape();
  y_shape.back() = out;
  y = y.reshape(y_shape);
  if (!need_dx && !need_dw && !need_db) return y;

  // Backward keeps xᵀ and Wᵀ in FP8 with their scale_invs, and nothing of x itself.
  const Tensor x_t = need_dw ? xq.transposed : Tensor(), x_scale_inv = xq.scale_inv;
  const Tensor w_t = need_dx ? wq.transposed : Tensor(), w_scale_inv = wq.scale_inv;
  const Shape x_shape = x.shape();
  const DType x_dtype = x.dtype(), w_dtype = weight.dtype(), b_dtype = bias.defined() ? bias.dtype() : x.dtype();
  const Device device = x.device();
  std::shared_ptr<Fp8LinearState> st = state;
  return autograd::record("fp8_linear", y, {x, weight, bias}, [=](const autograd::Grads& g) -> autograd::Grads {
    const Tensor dy2 = g[0].reshape({-1, out});
    // dy's cast writes the rowwise copy dgrad reads and the transposed one wgrad reads and, when the
    // bias needs a gradient, db = Σ_rows dy from the same read of dy (fp8_cast_dbias): under delayed
    // scaling one pass over dy does it all, where the cast and kernels::sum took two.
    const bool fuse_db = need_db && fused_bias_grad.load(std::memory_order_relaxed);
    const kernels::Fp8CastWithBiasGrad dyq =
        cast_entry(dy2, st->backward, Fp8BwdTensors::kGradOutput, config->recipe, /*rowwise=*/need_dx,
                   /*transposed=*/need_dw, fuse_db ? std::optional<DType>(b_dtype) : std::nullopt);
    fp8_backward_ran(st, config);
    Tensor dx, dw, db;
    if (need_dx) {
      dx = empty({rows, in}, x_dtype, device);
      kernels::fp8_gemm(dyq.data, dyq.scale_inv, w_t, w_scale_inv, dx);
      dx = dx.reshape(x_shape);
    }
    if (need_dw) {
      dw = empty({out, in}, w_dtype, device);
      kernels::fp8_gemm(dyq.transposed, dyq.scale_inv, x_t, x_scale_inv, dw);
    }
    if (need_db) db = fuse_db ? dyq.dbias : kernels::sum(dy2, 0).to(b_dtype);
    return {dx, dw, db};
  });
}

void set_fp8_fused_bias_grad(bool fused) { fused_bias_grad.store(fused, std::memory_order_relaxed); }
bool fp8_fused_bias_grad() { return fused_bias_grad.load(std::memory_order_relaxed); }

}  // namespace octet::nn
