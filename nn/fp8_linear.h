#pragma once
// A Linear's three GEMMs in FP8 (nn/fp8.h has the recipes and the scope).
//
//   forward  y  = x·Wᵀ + b     x (E4M3) and W (E4M3), fast accumulation, then the bias in y's dtype
//   backward dx = dy·W         dy (E5M2 under HYBRID) and Wᵀ (E4M3)
//            dW = dyᵀ·x        dyᵀ and xᵀ, both padded to a multiple of 16 tokens
//            db = Σ_rows dy    from the unquantised dy, in the same pass as dy's cast
//
// Each FP8 operand is cast by one fused pass that writes the copy the forward reads and, when a
// gradient will need it, the transposed copy the backward reads (kernels/fp8.h). Only xᵀ in FP8 and
// its scale_inv are kept for backward: a quarter of an f32 input's bytes, half of a bf16 one's. The
// weight's casts are made once per change of the weight (nn::Fp8WeightCache).
//
// Outputs are in x's dtype, bf16 or f32 (bf16 in FP8 training: the model is bf16); dW is in the
// weight's dtype and db in the bias's.
//
// The fused functions below go further, as Transformer Engine's LayerNormLinear and LayerNormMLP do:
// the kernel that produces a Linear's input (a LayerNorm, a GELU, GELU's backward) writes its FP8
// copies itself, and the Linear's GEMMs and backward, shared with fp8_linear, take them as they are.
#include <memory>
#include <string>
#include <utility>

#include "core/tensor.h"
#include "kernels/nn_ops.h"
#include "nn/fp8.h"

namespace octet::nn {

// Whether a Linear can run its GEMMs in FP8: both dims multiples of 16 (the FP8 GEMM's rule,
// kernels/fp8_gemm.h), and an input and weight the FP8 GEMM can write gradients for (bf16 or f32).
// Returns the reason when it cannot, empty when it can.
std::string fp8_linear_unsupported_reason(int64_t in_features, int64_t out_features, DType x_dtype,
                                          DType weight_dtype);

// y = x·Wᵀ + b with the GEMMs in FP8 under config's recipe; differentiable in x, weight and bias.
// `state` is created, or made anew when the recipe's formats or history length changed, on the
// weight's device. Check fp8_linear_unsupported_reason first. With a residual (y's shape, x's dtype),
// y + residual, the residual added in the FP8 GEMM before its one rounding (kernels::fp8_gemm's
// addend), and its gradient y's.
Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, std::shared_ptr<Fp8LinearState>& state,
                  const std::shared_ptr<const Fp8Config>& config, const Tensor& residual = Tensor());

// LayerNorm, then an FP8 Linear, with the LayerNorm writing the Linear's FP8 input itself (Transformer
// Engine's LayerNormLinear): fp8_linear(layer_norm(x, ln_weight, ln_bias, eps), weight, bias), where
// the LayerNorm's output is never stored in x's dtype. kernels::layernorm_fp8_forward writes the E4M3
// copy, the transposed copy wgrad reads and the amax in one pass, with the Linear's input scale. That
// scale must be known before the pass: under delayed scaling it is (the history gave it); under
// current scaling it comes from this very tensor's amax, so there this runs the unfused pair, the
// LayerNorm and then the two-pass cast. Backward: the Linear's three GEMMs, then the LayerNorm's
// backward on the dgrad. Bit for bit the unfused pair on the CPU, forward and backward. Differentiable
// in x, ln_weight, ln_bias, weight and bias. Check fp8_linear_unsupported_reason first.
Tensor fp8_layernorm_linear(const Tensor& x, const Tensor& ln_weight, const Tensor& ln_bias, double eps,
                            const Tensor& weight, const Tensor& bias, std::shared_ptr<Fp8LinearState>& state,
                            const std::shared_ptr<const Fp8Config>& config);

// fp8_layernorm_linear keeping its input for the residual add (autograd's residual_layer_norm, then the
// FP8 Linear): returns {r, y} with r = x's data as this node's output. Backward adds r's gradient to the
// LayerNorm's input gradient in the LayerNorm's pass. Bit for bit residual_layer_norm then fp8_linear on
// the CPU, forward and backward.
std::pair<Tensor, Tensor> fp8_residual_layernorm_linear(const Tensor& x, const Tensor& ln_weight,
                                                        const Tensor& ln_bias, double eps, const Tensor& weight,
                                                        const Tensor& bias, std::shared_ptr<Fp8LinearState>& state,
                                                        const std::shared_ptr<const Fp8Config>& config);

// The residual add before the LayerNorm too (autograd's add_layer_norm): returns {h, y} with
// h = x + residual and y = fp8_linear(layer_norm(h)), the LayerNorm writing y's FP8 input as above.
// Backward sums h's gradient from its other consumers with the LayerNorm's input gradient in one pass.
// An undefined residual means no add (h is x): fp8_residual_layernorm_linear.
std::pair<Tensor, Tensor> fp8_add_layernorm_linear(const Tensor& x, const Tensor& residual, const Tensor& ln_weight,
                                                   const Tensor& ln_bias, double eps, const Tensor& weight,
                                                   const Tensor& bias, std::shared_ptr<Fp8LinearState>& state,
                                                   const std::shared_ptr<const Fp8Config>& config);

// GELU, then an FP8 Linear, with the GELU writing the Linear's FP8 input (an MLP's act -> fc2):
// fp8_linear(gelu(hidden, approximation), weight, bias) with the GELU's output never stored in
// hidden's dtype (kernels::gelu_fp8_forward), under delayed scaling; current scaling runs the pair.
// Backward: the Linear's GEMMs, then GELU's backward on the dgrad. Bit for bit the pair on the CPU.
// A residual as fp8_linear's.
Tensor fp8_gelu_linear(const Tensor& hidden, kernels::GeluApproximation approximation, const Tensor& weight,
                       const Tensor& bias, std::shared_ptr<Fp8LinearState>& state,
                       const std::shared_ptr<const Fp8Config>& config, const Tensor& residual = Tensor());

// One Linear of an FP8 MLP: its parameters and its FP8 state (created on first use).
struct Fp8MlpLinear {
  const Tensor& weight;
  const Tensor& bias;
  std::shared_ptr<Fp8LinearState>& state;
};

// A pre-norm MLP in FP8, as one node (Transformer Engine's LayerNormMLP): h = x + residual,
// y = fc2(gelu(fc1(layer_norm(h)))), returning {h, y}. The LayerNorm writes fc1's FP8 input, the GELU
// fc2's, and in backward GELU's backward writes fc1's output gradient in FP8 with fc1's bias gradient
// (kernels::dgelu_fp8_cast_dbias): neither the GELU's output nor its input gradient is ever stored in
// x's dtype. Under current scaling, or with set_fp8_fused_bias_grad(false), it runs as
// fp8_add_layernorm_linear then fp8_gelu_linear. Bit for bit the unfused modules on the CPU. An
// undefined residual means no add: h is x itself, returned as this node's output (as
// fp8_residual_layernorm_linear's r), and the LayerNorm writes fc1's input from x.
std::pair<Tensor, Tensor> fp8_add_layernorm_mlp(const Tensor& x, const Tensor& residual, const Tensor& ln_weight,
                                                const Tensor& ln_bias, double eps, const Fp8MlpLinear& fc1,
                                                kernels::GeluApproximation approximation, const Fp8MlpLinear& fc2,
                                                const std::shared_ptr<const Fp8Config>& config);

// The same with h added back to the output, the whole second half of a pre-norm block: returns h + y,
// h added in fc2's FP8 GEMM before its one rounding (fp8_gelu_linear's residual), and its gradient
// summed with the LayerNorm's input gradient in the LayerNorm's backward pass. Bit for bit
// fp8_add_layernorm_linear then fp8_gelu_linear with h as its residual, on the CPU.
Tensor fp8_add_layernorm_mlp_residual(const Tensor& x, const Tensor& residual, const Tensor& ln_weight,
                                      const Tensor& ln_bias, double eps, const Fp8MlpLinear& fc1,
                                      kernels::GeluApproximation approximation, const Fp8MlpLinear& fc2,
                                      const std::shared_ptr<const Fp8Config>& config);

// Whether fp8_layernorm_linear, fp8_add_layernorm_linear, fp8_gelu_linear and fp8_add_layernorm_mlp fuse (the default) or run their unfused
// pairs even under delayed scaling: the same bits on the CPU; the switch lets tests show it.
// Process-wide, read as each forward runs.
void set_fp8_fused_producers(bool fused);
bool fp8_fused_producers();

// Whether the backward sums the bias gradient in the pass that casts dy (kernels::fp8_cast_dbias, the
// default) or casts dy and then sums it with kernels::sum, reading dy twice. On the CPU both give the
// same bits; the switch is there so that tests can show it. Process-wide, read as each backward runs.
void set_fp8_fused_bias_grad(bool fused);
bool fp8_fused_bias_grad();

}  // namespace octet::nn
