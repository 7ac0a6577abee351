// The FP8 Linear (nn/fp8_linear.h): casts, the three FP8 GEMMs, and what backward keeps.
#include "nn/fp8_linear.h"

#include <atomic>
#include <optional>

#include "autograd/function.h"
#include "autograd/ops.h"
#include "core/grad_mode.h"
#include "kernels/fp8.h"
#include "kernels/fp8_gemm.h"
#include "kernels/nn_ops.h"
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

// The weight's cast: the cached one while the weight is unchanged (Fp8WeightCache), else made again.
// Under delayed scaling the cast uses the scale the history gave, which this step's amax does not
// change, so the cast itself records the weight's amax in its slot as it goes (slot <- max(slot,
// amax(w)), what record_weight_amax does under delayed scaling): one pass over the weight. Under
// current scaling the scale comes from this amax, so a separate amax pass goes first, through
// record_weight_amax, which FSDP's FP8 all-gather uses for its shards too.
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
  if (recipe.is_delayed()) {
    // Bytes (ViT-H in bf16): the weights' 1.26 GB read once, not twice; and 2 of the 3 launches per
    // weight gone (the amax pass, 5.6 us, and folding its [1] result into the slot, 2.5 us, on an
    // H200 on 2026-11-28): 128 weights, about 1 ms of the FP8 step.
    const Fp8LinearState::Entry w = Fp8LinearState::entry(state.forward, Fp8FwdTensors::kWeight);
    cache.store(weight, kernels::fp8_cast(weight, w.scale, w.amax, state.forward.fp8_dtype, /*rowwise=*/true,
                                          need_transposed));
    return cache.cast();
  }
  const Tensor amax = zeros({1}, DType::f32, weight.device());
  kernels::fp8_amax_(weight, amax);
  const Fp8LinearState::Entry w = record_weight_amax(state, amax, recipe);
  cache.store(weight, kernels::fp8_cast(weight, w.scale, Tensor(), state.forward.fp8_dtype, /*rowwise=*/true,
                                        need_transposed));
  return cache.cast();
}

// The checks every FP8 Linear entry makes on x (read as [..., in]), the weight and the bias; then the
// state is made ready for the recipe.
void check_and_prepare(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                       std::shared_ptr<Fp8LinearState>& state, const std::shared_ptr<const Fp8Config>& config) {
  OCTET_CHECK(config != nullptr, op, ": no FP8 config; run it inside an enabled nn::Fp8Autocast scope");
  OCTET_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1), op,
              ": x must be [..., in] and weight [out, in], got ", x.describe(), " and ", weight.describe());
  const int64_t out = weight.size(0), in = weight.size(1);
  const std::string reason = fp8_linear_unsupported_reason(in, out, x.dtype(), weight.dtype());
  OCTET_CHECK(reason.empty(), op, ": cannot run Linear(", in, " -> ", out, ") in FP8: ", reason,
              "; run it with nn::linear instead (nn::Linear falls back by itself)");
  OCTET_CHECK(x.device() == weight.device() && (!bias.defined() || bias.device() == x.device()), op, ": x ",
              x.describe(), ", weight ", weight.describe(), " and bias must share a device");
  Fp8LinearState::prepare(state, weight.device(), config->recipe);
}

// What a forward decided and its backward needs, besides the FP8 copies it keeps.
struct Fp8LinearPlan {
  int64_t rows = 0, in = 0, out = 0;
  bool need_dx = false, need_dw = false, need_db = false;
  DType x_dtype = DType::f32, w_dtype = DType::f32, b_dtype = DType::f32;
  Device device;
};

// y [rows, out] = x·Wᵀ + b from the FP8 copies, in x's dtype.
// y = x·Wᵀ + b (+ residual, added before the one rounding: cuBLASLt reads it as C on the GPU).
Tensor forward_gemm(const kernels::Fp8Cast& xq, const kernels::Fp8Cast& wq, const Tensor& bias, const Fp8LinearPlan& p,
                    const Tensor& residual = Tensor()) {
  Tensor y = empty({p.rows, p.out}, p.x_dtype, p.device);
  const Tensor b = bias.defined() ? bias.detach().to(p.x_dtype) : Tensor();
  const Tensor r = residual.defined() ? residual.detach().reshape({p.rows, p.out}) : Tensor();
  kernels::fp8_gemm(xq.data, xq.scale_inv, wq.data, wq.scale_inv, y, b, /*accumulate=*/false, /*fast_accumulate=*/true,
                    r);
  return y;
}

// A residual for an FP8 Linear's output: its shape and x's dtype, checked by name.
void check_residual(const char* op, const Tensor& residual, const Shape& y_shape, DType dtype) {
  OCTET_CHECK(!residual.defined() || (residual.shape() == y_shape && residual.dtype() == dtype), op,
              ": the residual ", residual.defined() ? residual.describe() : std::string(), " must have the output's shape ",
              y_shape, " and dtype ", dtype_name(dtype));
}

struct Fp8LinearGrads {
  Tensor dx;  // [rows, in], the gradient of the Linear's input
  Tensor dw, db;
};

// dgrad and wgrad from dy's cast (the gradients the plan asks for; db is the caller's).
Fp8LinearGrads gemms_from_cast(const kernels::Fp8Cast& dyq, const Fp8LinearPlan& p, const Tensor& x_t,
                               const Tensor& x_scale_inv, const Tensor& w_t, const Tensor& w_scale_inv) {
  Fp8LinearGrads g;
  if (p.need_dx) {
    g.dx = empty({p.rows, p.in}, p.x_dtype, p.device);
    kernels::fp8_gemm(dyq.data, dyq.scale_inv, w_t, w_scale_inv, g.dx);
  }
  if (p.need_dw) {
    g.dw = empty({p.out, p.in}, p.w_dtype, p.device);
    kernels::fp8_gemm(dyq.transposed, dyq.scale_inv, x_t, x_scale_inv, g.dw);
  }
  return g;
}

// The backward of every FP8 Linear, given dy [rows, out] and what the forward kept: xᵀ and Wᵀ in FP8
// with their scale_invs, nothing of x itself.
Fp8LinearGrads backward_gemms(const Tensor& dy2, const Fp8LinearPlan& p, const Tensor& x_t, const Tensor& x_scale_inv,
                              const Tensor& w_t, const Tensor& w_scale_inv, const std::shared_ptr<Fp8LinearState>& st,
                              const std::shared_ptr<const Fp8Config>& config) {
  // dy's cast writes the rowwise copy dgrad reads and the transposed one wgrad reads and, when the
  // bias needs a gradient, db = Σ_rows dy from the same read of dy (fp8_cast_dbias): under delayed
  // scaling one pass over dy does it all, where the cast and kernels::sum took two.
  const bool fuse_db = p.need_db && fused_bias_grad.load(std::memory_order_relaxed);
  const kernels::Fp8CastWithBiasGrad dyq =
      cast_entry(dy2, st->backward, Fp8BwdTensors::kGradOutput, config->recipe, /*rowwise=*/p.need_dx,
                 /*transposed=*/p.need_dw, fuse_db ? std::optional<DType>(p.b_dtype) : std::nullopt);
  fp8_backward_ran(st, config);
  Fp8LinearGrads g = gemms_from_cast(dyq, p, x_t, x_scale_inv, w_t, w_scale_inv);
  if (p.need_db) g.db = fuse_db ? dyq.dbias : kernels::sum(dy2, 0).to(p.b_dtype);
  return g;
}

Fp8LinearPlan plan_for(const Tensor& input, const Tensor& weight, const Tensor& bias, bool need_dx) {
  const bool grad_on = GradMode::is_enabled();
  Fp8LinearPlan p;
  p.in = weight.size(1);
  p.out = weight.size(0);
  p.rows = input.numel() / p.in;
  p.need_dx = need_dx;
  p.need_dw = grad_on && weight.requires_grad();
  p.need_db = grad_on && bias.defined() && bias.requires_grad();
  p.x_dtype = input.dtype();
  p.w_dtype = weight.dtype();
  p.b_dtype = bias.defined() ? bias.dtype() : input.dtype();
  p.device = input.device();
  return p;
}

std::atomic<bool> fused_producers{true};

// Whether a LayerNorm may write this Linear's FP8 input: delayed scaling (the scale is known before
// the pass) and not switched off.
bool producer_fuses(const std::shared_ptr<const Fp8Config>& config) {
  return config != nullptr && config->recipe.is_delayed() && fused_producers.load(std::memory_order_relaxed);
}

// An FP8 Linear whose input is cast by `cast(x2, plan)` (x2: the input as [rows, in], detached): the
// checks, the weight's cast, the forward GEMM (+ residual) and the node, whose backward runs the
// backward GEMMs and hands the dgrad to `input_grad(dx, kept)` for the gradient of `input`. `kept` is
// what input_grad needs of the forward (x2 for a GELU's backward), or undefined, so that nothing more
// of the input is held. fp8_linear and fp8_gelu_linear are this with their own cast and input_grad.
template <class Cast, class InputGrad>
Tensor linear_from_cast(const char* op, const Tensor& input, const Tensor& weight, const Tensor& bias,
                        std::shared_ptr<Fp8LinearState>& state, const std::shared_ptr<const Fp8Config>& config,
                        const Tensor& residual, bool keep_input, Cast cast, InputGrad input_grad) {
  check_and_prepare(op, input, weight, bias, state, config);
  const Fp8LinearPlan p = plan_for(input, weight, bias, GradMode::is_enabled() && input.requires_grad());
  Shape y_shape = input.shape();
  y_shape.back() = p.out;
  check_residual(op, residual, y_shape, p.x_dtype);  // before the casts move the FP8 state on
  const Tensor x2 = input.detach().reshape({-1, p.in});
  const kernels::Fp8Cast xq = cast(x2, p);
  const kernels::Fp8Cast wq = weight_cast(*state, weight.detach(), config->recipe, /*need_transposed=*/p.need_dx);
  fp8_forward_ran(state);
  const Tensor y = forward_gemm(xq, wq, bias, p, residual).reshape(y_shape);
  const bool nr = GradMode::is_enabled() && residual.defined() && residual.requires_grad();
  if (!p.need_dx && !p.need_dw && !p.need_db && !nr) return y;

  const Tensor x_t = p.need_dw ? xq.transposed : Tensor(), x_scale_inv = xq.scale_inv;
  const Tensor w_t = p.need_dx ? wq.transposed : Tensor(), w_scale_inv = wq.scale_inv;
  const Tensor kept = keep_input && p.need_dx ? x2 : Tensor();
  std::shared_ptr<Fp8LinearState> st = state;
  return autograd::record(op, y, {input, weight, bias, residual},
                          [=, shape = input.shape()](const autograd::Grads& g) -> autograd::Grads {
                            if (!p.need_dx && !p.need_dw && !p.need_db) return {Tensor(), Tensor(), Tensor(), g[0]};
                            Fp8LinearGrads d = backward_gemms(g[0].reshape({-1, p.out}), p, x_t, x_scale_inv, w_t,
                                                              w_scale_inv, st, config);
                            const Tensor dx = p.need_dx ? input_grad(d.dx, kept).reshape(shape) : Tensor();
                            return {dx, d.dw, d.db, nr ? g[0] : Tensor()};
                          });
}

}  // namespace

Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, std::shared_ptr<Fp8LinearState>& state,
                  const std::shared_ptr<const Fp8Config>& config, const Tensor& residual) {
  return linear_from_cast(
      "fp8_linear", x, weight, bias, state, config, residual, /*keep_input=*/false,
      [&](const Tensor& x2, const Fp8LinearPlan& p) -> kernels::Fp8Cast {
        return cast_entry(x2, state->forward, Fp8FwdTensors::kInput, config->recipe, /*rowwise=*/true,
                          /*transposed=*/p.need_dw);
      },
      [](const Tensor& dx, const Tensor&) { return dx; });
}

namespace {

// fp8_layernorm_linear's node: {y}, or with keep_input {r, y} where r is x's data as this node's
// output (fp8_residual_layernorm_linear), whose gradient the LayerNorm's backward adds in its pass.
std::vector<Tensor> layernorm_linear_node(const char* op, const Tensor& x, const Tensor& ln_weight,
                                          const Tensor& ln_bias, double eps, const Tensor& weight, const Tensor& bias,
                                          std::shared_ptr<Fp8LinearState>& state,
                                          const std::shared_ptr<const Fp8Config>& config, bool keep_input) {
  check_and_prepare(op, x, weight, bias, state, config);
  const bool grad_on = GradMode::is_enabled();
  const bool nx = grad_on && x.requires_grad(), nlw = grad_on && ln_weight.defined() && ln_weight.requires_grad(),
             nlb = grad_on && ln_bias.defined() && ln_bias.requires_grad();
  const Fp8LinearPlan p = plan_for(x, weight, bias, nx || nlw || nlb);
  const Tensor x2 = x.detach().reshape({-1, p.in});
  const Tensor lnw = ln_weight.defined() ? ln_weight.detach() : Tensor(), lnb = ln_bias.defined() ? ln_bias.detach() : Tensor();
  const Fp8LinearState::Entry e = Fp8LinearState::entry(state->forward, Fp8FwdTensors::kInput);
  const kernels::LayerNormFp8 ln = kernels::layernorm_fp8_forward(x2, lnw, lnb, eps, e.scale, e.amax,
                                                                  state->forward.fp8_dtype, /*rowwise=*/true,
                                                                  /*transposed=*/p.need_dw);
  const kernels::Fp8Cast wq = weight_cast(*state, weight.detach(), config->recipe, /*need_transposed=*/p.need_dx);
  fp8_forward_ran(state);
  Shape y_shape = x.shape();
  y_shape.back() = p.out;
  const Tensor y = forward_gemm(ln.cast, wq, bias, p).reshape(y_shape);
  std::vector<Tensor> outs = keep_input ? std::vector<Tensor>{x.detach(), y} : std::vector<Tensor>{y};
  if (!p.need_dx && !p.need_dw && !p.need_db) return outs;

  const Tensor x_t = p.need_dw ? ln.cast.transposed : Tensor(), x_scale_inv = ln.cast.scale_inv;
  const Tensor w_t = p.need_dx ? wq.transposed : Tensor(), w_scale_inv = wq.scale_inv;
  std::shared_ptr<Fp8LinearState> st = state;
  return autograd::record(
      op, std::move(outs), {x, ln_weight, ln_bias, weight, bias},
      [=, mean = ln.mean, rstd = ln.rstd, shape = x.shape()](const autograd::Grads& g) -> autograd::Grads {
        // With keep_input, g[0] is r's gradient from x's other consumer (zeros when none came).
        const Tensor& dy = keep_input ? g[1] : g[0];
        Fp8LinearGrads d = backward_gemms(dy.reshape({-1, p.out}), p, x_t, x_scale_inv, w_t, w_scale_inv, st, config);
        if (!p.need_dx) return {Tensor(), Tensor(), Tensor(), d.dw, d.db};
        // The LayerNorm's backward, as layer_norm's (residual_layer_norm's) own runs it.
        if (!keep_input) {
          const kernels::LayerNormGrads l = kernels::layernorm_backward(d.dx, x2, lnw, mean, rstd);
          return {nx ? l.dx.reshape(shape) : Tensor(), nlw ? l.dweight : Tensor(), nlb ? l.dbias : Tensor(), d.dw,
                  d.db};
        }
        const kernels::AddLayerNormGrads l =
            kernels::add_layernorm_backward(d.dx, g[0].reshape({-1, p.in}), x2, lnw, mean, rstd);
        return {nx ? l.dh.reshape(shape) : Tensor(), nlw ? l.dweight : Tensor(), nlb ? l.dbias : Tensor(), d.dw, d.db};
      });
}

}  // namespace

Tensor fp8_layernorm_linear(const Tensor& x, const Tensor& ln_weight, const Tensor& ln_bias, double eps,
                            const Tensor& weight, const Tensor& bias, std::shared_ptr<Fp8LinearState>& state,
                            const std::shared_ptr<const Fp8Config>& config) {
  if (!producer_fuses(config)) return fp8_linear(layer_norm(x, ln_weight, ln_bias, eps), weight, bias, state, config);
  return layernorm_linear_node("fp8_layernorm_linear", x, ln_weight, ln_bias, eps, weight, bias, state, config,
                               /*keep_input=*/false)[0];
}

std::pair<Tensor, Tensor> fp8_residual_layernorm_linear(const Tensor& x, const Tensor& ln_weight,
                                                        const Tensor& ln_bias, double eps, const Tensor& weight,
                                                        const Tensor& bias, std::shared_ptr<Fp8LinearState>& state,
                                                        const std::shared_ptr<const Fp8Config>& config) {
  if (!producer_fuses(config)) {
    const auto [r, normed] = residual_layer_norm(x, ln_weight, ln_bias, eps);
    return {r, fp8_linear(normed, weight, bias, state, config)};
  }
  const std::vector<Tensor> outs = layernorm_linear_node("fp8_residual_layernorm_linear", x, ln_weight, ln_bias, eps,
                                                         weight, bias, state, config, /*keep_input=*/true);
  return {outs[0], outs[1]};
}

std::pair<Tensor, Tensor> fp8_add_layernorm_linear(const Tensor& x, const Tensor& residual, const Tensor& ln_weight,
                                                   const Tensor& ln_bias, double eps, const Tensor& weight,
                                                   const Tensor& bias, std::shared_ptr<Fp8LinearState>& state,
                                                   const std::shared_ptr<const Fp8Config>& config) {
  if (!residual.defined()) return fp8_residual_layernorm_linear(x, ln_weight, ln_bias, eps, weight, bias, state, config);
  if (!producer_fuses(config)) {
    const auto [h, normed] = add_layer_norm(x, residual, ln_weight, ln_bias, eps);
    return {h, fp8_linear(normed, weight, bias, state, config)};
  }
  check_and_prepare("fp8_add_layernorm_linear", x, weight, bias, state, config);
  const bool grad_on = GradMode::is_enabled();
  const bool nx = grad_on && x.requires_grad(), nr = grad_on && residual.requires_grad(),
             nlw = grad_on && ln_weight.defined() && ln_weight.requires_grad(),
             nlb = grad_on && ln_bias.defined() && ln_bias.requires_grad();
  const Fp8LinearPlan p = plan_for(x, weight, bias, nx || nr || nlw || nlb);
  const Tensor x2 = x.detach().reshape({-1, p.in}), r2 = residual.detach().reshape({-1, p.in});
  const Tensor lnw = ln_weight.defined() ? ln_weight.detach() : Tensor(), lnb = ln_bias.defined() ? ln_bias.detach() : Tensor();
  const Fp8LinearState::Entry e = Fp8LinearState::entry(state->forward, Fp8FwdTensors::kInput);
  const kernels::LayerNormFp8 ln = kernels::add_layernorm_fp8_forward(x2, r2, lnw, lnb, eps, e.scale, e.amax,
                                                                      state->forward.fp8_dtype, /*rowwise=*/true,
                                                                      /*transposed=*/p.need_dw);
  const kernels::Fp8Cast wq = weight_cast(*state, weight.detach(), config->recipe, /*need_transposed=*/p.need_dx);
  fp8_forward_ran(state);
  Shape y_shape = x.shape();
  y_shape.back() = p.out;
  const Tensor h = ln.h.reshape(x.shape());
  const Tensor y = forward_gemm(ln.cast, wq, bias, p).reshape(y_shape);
  if (!p.need_dx && !p.need_dw && !p.need_db) return {h, y};

  const Tensor x_t = p.need_dw ? ln.cast.transposed : Tensor(), x_scale_inv = ln.cast.scale_inv;
  const Tensor w_t = p.need_dx ? wq.transposed : Tensor(), w_scale_inv = wq.scale_inv;
  std::shared_ptr<Fp8LinearState> st = state;
  // h is an output of this node: the closure keeps a detached handle, never h itself (a cycle).
  std::vector<Tensor> outs = autograd::record(
      "fp8_add_layernorm_linear", {h, y}, {x, residual, ln_weight, ln_bias, weight, bias},
      [=, hd = ln.h.detach(), mean = ln.mean, rstd = ln.rstd, shape = x.shape()](const autograd::Grads& g) -> autograd::Grads {
        // g[0] is h's gradient from its other consumers, g[1] the Linear output's (zeros when none came).
        Fp8LinearGrads d = backward_gemms(g[1].reshape({-1, p.out}), p, x_t, x_scale_inv, w_t, w_scale_inv, st, config);
        if (!p.need_dx) return {Tensor(), Tensor(), Tensor(), Tensor(), d.dw, d.db};
        // add_layer_norm's backward (autograd/ops_nn.cpp): LayerNorm's input gradient plus h's other one.
        const kernels::AddLayerNormGrads l =
            kernels::add_layernorm_backward(d.dx, g[0].reshape({-1, p.in}), hd, lnw, mean, rstd);
        const Tensor dh = l.dh.reshape(shape);
        return {nx ? dh : Tensor(), nr ? dh : Tensor(), nlw ? l.dweight : Tensor(), nlb ? l.dbias : Tensor(), d.dw,
                d.db};
      });
  return {outs[0], outs[1]};
}

Tensor fp8_gelu_linear(const Tensor& hidden, kernels::GeluApproximation approximation, const Tensor& weight,
                       const Tensor& bias, std::shared_ptr<Fp8LinearState>& state,
                       const std::shared_ptr<const Fp8Config>& config, const Tensor& residual) {
  if (!producer_fuses(config)) return fp8_linear(gelu(hidden, approximation), weight, bias, state, config, residual);
  // The GELU writes the FP8 input itself; its backward (autograd/ops_nn.cpp's gelu) runs on the dgrad,
  // from the GELU's input kept for it.
  return linear_from_cast(
      "fp8_gelu_linear", hidden, weight, bias, state, config, residual, /*keep_input=*/true,
      [&](const Tensor& x2, const Fp8LinearPlan& p) -> kernels::Fp8Cast {
        const Fp8LinearState::Entry e = Fp8LinearState::entry(state->forward, Fp8FwdTensors::kInput);
        return kernels::gelu_fp8_forward(x2, approximation, e.scale, e.amax, state->forward.fp8_dtype,
                                         /*rowwise=*/true, /*transposed=*/p.need_dw);
      },
      [approximation](const Tensor& dx, const Tensor& x2) { return kernels::gelu_backward(dx, x2, approximation); });
}

namespace {

// fp8_add_layernorm_mlp's node: {h, y}, or with add_h {h + y} (fc2's GEMM adding h before its one
// rounding: fp8_add_layernorm_mlp_residual), whose gradient is then both y's and h's other one. With
// no residual, h is x itself (the LayerNorm without the add), and its gradients are summed the same way.
std::vector<Tensor> add_layernorm_mlp_node(const Tensor& x, const Tensor& residual, const Tensor& ln_weight,
                                           const Tensor& ln_bias, double eps, const Fp8MlpLinear& fc1,
                                           kernels::GeluApproximation approximation, const Fp8MlpLinear& fc2,
                                           const std::shared_ptr<const Fp8Config>& config, bool add_h) {
  // The shapes that join the two Linears, checked before fc1's casts record an amax: a call that
  // throws leaves every FP8 state as it was (each Linear's own checks run after the one before it cast).
  const char* op = add_h ? "fp8_add_layernorm_mlp_residual" : "fp8_add_layernorm_mlp";
  OCTET_CHECK(fc1.weight.dim() == 2 && fc2.weight.dim() == 2 && fc2.weight.size(1) == fc1.weight.size(0), op,
              ": fc2 must take fc1's output, got fc1 ", fc1.weight.describe(), " and fc2 ", fc2.weight.describe(),
              " (weights [out, in])");
  OCTET_CHECK(!add_h || (x.dim() >= 1 && fc2.weight.size(0) == x.size(-1)), op, ": fc2's output is added to h, so it",
              " must have h's ", x.dim() >= 1 ? x.size(-1) : 0, " features, got fc2 ", fc2.weight.describe(),
              "; call fp8_add_layernorm_mlp and add h yourself");
  // The dGELU fusion hands fc1 its output gradient already cast, with the bias gradient from that
  // pass; when the bias gradient is summed apart (set_fp8_fused_bias_grad(false)) it runs as two nodes.
  if (!producer_fuses(config) || !fused_bias_grad.load(std::memory_order_relaxed)) {
    const auto [h, hidden] = fp8_add_layernorm_linear(x, residual, ln_weight, ln_bias, eps, fc1.weight, fc1.bias,
                                                      fc1.state, config);
    if (add_h) return {fp8_gelu_linear(hidden, approximation, fc2.weight, fc2.bias, fc2.state, config, h)};
    return {h, fp8_gelu_linear(hidden, approximation, fc2.weight, fc2.bias, fc2.state, config)};
  }
  check_and_prepare("fp8_add_layernorm_mlp", x, fc1.weight, fc1.bias, fc1.state, config);
  const bool grad_on = GradMode::is_enabled();
  const bool nx = grad_on && x.requires_grad(), nr = grad_on && residual.requires_grad(),
             nlw = grad_on && ln_weight.defined() && ln_weight.requires_grad(),
             nlb = grad_on && ln_bias.defined() && ln_bias.requires_grad();
  const Fp8LinearPlan p1 = plan_for(x, fc1.weight, fc1.bias, nx || nr || nlw || nlb);
  const Tensor x2 = x.detach().reshape({-1, p1.in});
  const Tensor lnw = ln_weight.defined() ? ln_weight.detach() : Tensor(), lnb = ln_bias.defined() ? ln_bias.detach() : Tensor();

  // fc1: the LayerNorm (after the residual add, when there is one) writes its E4M3 input.
  const Fp8LinearState::Entry e1 = Fp8LinearState::entry(fc1.state->forward, Fp8FwdTensors::kInput);
  const kernels::LayerNormFp8 ln =
      residual.defined()
          ? kernels::add_layernorm_fp8_forward(x2, residual.detach().reshape({-1, p1.in}), lnw, lnb, eps, e1.scale,
                                               e1.amax, fc1.state->forward.fp8_dtype, /*rowwise=*/true,
                                               /*transposed=*/p1.need_dw)
          : kernels::layernorm_fp8_forward(x2, lnw, lnb, eps, e1.scale, e1.amax, fc1.state->forward.fp8_dtype,
                                           /*rowwise=*/true, /*transposed=*/p1.need_dw);
  const Tensor hd = residual.defined() ? ln.h : x2;  // h's data, [rows, in]
  const kernels::Fp8Cast wq1 = weight_cast(*fc1.state, fc1.weight.detach(), config->recipe, p1.need_dx);
  fp8_forward_ran(fc1.state);
  const Tensor hidden = forward_gemm(ln.cast, wq1, fc1.bias, p1);  // [rows, hidden], kept for GELU's backward

  // fc2: the GELU writes its E4M3 input.
  check_and_prepare("fp8_add_layernorm_mlp (fc2)", hidden, fc2.weight, fc2.bias, fc2.state, config);
  const bool upstream = p1.need_dx || p1.need_dw || p1.need_db;
  const Fp8LinearPlan p2 = plan_for(hidden, fc2.weight, fc2.bias, grad_on && upstream);
  const Fp8LinearState::Entry e2 = Fp8LinearState::entry(fc2.state->forward, Fp8FwdTensors::kInput);
  const kernels::Fp8Cast act = kernels::gelu_fp8_forward(hidden, approximation, e2.scale, e2.amax,
                                                         fc2.state->forward.fp8_dtype, /*rowwise=*/true,
                                                         /*transposed=*/p2.need_dw);
  const kernels::Fp8Cast wq2 = weight_cast(*fc2.state, fc2.weight.detach(), config->recipe, p2.need_dx);
  fp8_forward_ran(fc2.state);
  Shape y_shape = x.shape();
  y_shape.back() = p2.out;
  const Tensor h = hd.reshape(x.shape());
  const Tensor y = forward_gemm(act, wq2, fc2.bias, p2, add_h ? h : Tensor()).reshape(y_shape);
  if (!upstream && !p2.need_dw && !p2.need_db) return add_h ? std::vector<Tensor>{y} : std::vector<Tensor>{h, y};

  std::shared_ptr<Fp8LinearState> st1 = fc1.state, st2 = fc2.state;
  const Tensor x1_t = p1.need_dw ? ln.cast.transposed : Tensor(), x1_si = ln.cast.scale_inv;
  const Tensor w1_t = p1.need_dx ? wq1.transposed : Tensor(), w1_si = wq1.scale_inv;
  const Tensor x2_t = p2.need_dw ? act.transposed : Tensor(), x2_si = act.scale_inv;
  const Tensor w2_t = p2.need_dx ? wq2.transposed : Tensor(), w2_si = wq2.scale_inv;
  return autograd::record(
      add_h ? "fp8_add_layernorm_mlp_residual" : "fp8_add_layernorm_mlp",
      add_h ? std::vector<Tensor>{y} : std::vector<Tensor>{h, y},
      {x, residual, ln_weight, ln_bias, fc1.weight, fc1.bias, fc2.weight, fc2.bias},
      [=, hd = hd.detach(), mean = ln.mean, rstd = ln.rstd, shape = x.shape()](const autograd::Grads& g) -> autograd::Grads {
        // The output's gradient, and h's from elsewhere: with add_h both are the one output's.
        const Tensor& gy = add_h ? g[0] : g[1];
        const Tensor& gh = g[0];
        // fc2, as its own node would run it; its dgrad is the GELU output's gradient.
        const Fp8LinearGrads d2 = backward_gemms(gy.reshape({-1, p2.out}), p2, x2_t, x2_si, w2_t, w2_si, st2, config);
        if (!upstream) return {Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), d2.dw, d2.db};
        // GELU's backward and fc1's output-gradient cast (with fc1's bias gradient) in one pass: the
        // bits of gelu_backward and then fc1's cast_entry under delayed scaling.
        const Fp8LinearState::Entry e = Fp8LinearState::entry(st1->backward, Fp8BwdTensors::kGradOutput);
        const kernels::Fp8CastWithBiasGrad dyq1 = kernels::dgelu_fp8_cast_dbias(
            d2.dx, hidden, approximation, e.scale, e.amax, st1->backward.fp8_dtype, /*rowwise=*/p1.need_dx,
            /*transposed=*/p1.need_dw, p1.need_db ? std::optional<DType>(p1.b_dtype) : std::nullopt);
        fp8_backward_ran(st1, config);
        Fp8LinearGrads d1 = gemms_from_cast(dyq1, p1, x1_t, x1_si, w1_t, w1_si);
        const Tensor db1 = p1.need_db ? dyq1.dbias : Tensor();
        if (!p1.need_dx) return {Tensor(), Tensor(), Tensor(), Tensor(), d1.dw, db1, d2.dw, d2.db};
        // add_layer_norm's backward: the LayerNorm's input gradient plus h's other one.
        const kernels::AddLayerNormGrads l =
            kernels::add_layernorm_backward(d1.dx, gh.reshape({-1, p1.in}), hd, lnw, mean, rstd);
        const Tensor dh = l.dh.reshape(shape);
        return {nx ? dh : Tensor(), nr ? dh : Tensor(), nlw ? l.dweight : Tensor(), nlb ? l.dbias : Tensor(), d1.dw,
                db1, d2.dw, d2.db};
      });
}

}  // namespace

std::pair<Tensor, Tensor> fp8_add_layernorm_mlp(const Tensor& x, const Tensor& residual, const Tensor& ln_weight,
                                                const Tensor& ln_bias, double eps, const Fp8MlpLinear& fc1,
                                                kernels::GeluApproximation approximation, const Fp8MlpLinear& fc2,
                                                const std::shared_ptr<const Fp8Config>& config) {
  const std::vector<Tensor> outs =
      add_layernorm_mlp_node(x, residual, ln_weight, ln_bias, eps, fc1, approximation, fc2, config, /*add_h=*/false);
  return {outs[0], outs[1]};
}

Tensor fp8_add_layernorm_mlp_residual(const Tensor& x, const Tensor& residual, const Tensor& ln_weight,
                                      const Tensor& ln_bias, double eps, const Fp8MlpLinear& fc1,
                                      kernels::GeluApproximation approximation, const Fp8MlpLinear& fc2,
                                      const std::shared_ptr<const Fp8Config>& config) {
  return add_layernorm_mlp_node(x, residual, ln_weight, ln_bias, eps, fc1, approximation, fc2, config,
                                /*add_h=*/true)[0];
}

void set_fp8_fused_producers(bool fused) { fused_producers.store(fused, std::memory_order_relaxed); }
bool fp8_fused_producers() { return fused_producers.load(std::memory_order_relaxed); }

void set_fp8_fused_bias_grad(bool fused) { fused_bias_grad.store(fused, std::memory_order_relaxed); }
bool fp8_fused_bias_grad() { return fused_bias_grad.load(std::memory_order_relaxed); }

}  // namespace octet::nn
