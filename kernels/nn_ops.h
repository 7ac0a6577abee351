#pragma once
// The ViT's non-GEMM layers: LayerNorm, GELU, cross-entropy and dropout. Statistics and losses
// are kept in f32 (f64 for f64 inputs) whatever the activation dtype.
#include <cstdint>
#include <optional>

#include "core/tensor.h"

namespace octet::kernels {

// ---- LayerNorm over the last dim ------------------------------------------------------------------
struct LayerNormOutput {
  Tensor y;     // x's shape and dtype
  Tensor mean;  // x's shape without the last dim; f32 (f64 for f64 x)
  Tensor rstd;  // 1 / sqrt(var + eps), biased variance, same shape as mean
};
// weight and bias: [C] or undefined (no affine), of one dtype: x's, or f32 (while x is bf16, say).
LayerNormOutput layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-6);
struct LayerNormGrads {
  Tensor dx;       // x's dtype
  Tensor dweight;  // weight's dtype, undefined without affine
  Tensor dbias;
};
LayerNormGrads layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                  const Tensor& rstd);

// ---- residual add fused into LayerNorm ----------------------------------------------------------------
// The pre-norm transformer's `h = x + y; ln = layer_norm(h)` in one pass over the rows: h is rounded
// to x's dtype exactly as add() rounds it, and the LayerNorm normalizes that rounded h, so in every
// dtype h and y equal add() followed by layernorm_forward() bit for bit on the CPU (and on the GPU
// for aligned rows, where both take the same vectorized kernel path).
struct AddLayerNormOutput {
  Tensor h;     // x + y: x's shape and dtype (the residual stream, input of the next residual add)
  Tensor y;     // the LayerNorm of h, as LayerNormOutput::y
  Tensor mean;  // as LayerNormOutput: f32 (f64 for f64 x), x's shape without the last dim
  Tensor rstd;
};
// x and y: one shape, dtype and device (no broadcasting). weight and bias as in layernorm_forward.
AddLayerNormOutput add_layernorm_forward(const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,
                                         double eps = 1e-6);
struct AddLayerNormGrads {
  Tensor dh;       // dh_residual + LayerNorm's input gradient: h's total gradient, h's dtype
  Tensor dweight;  // weight's dtype, undefined without affine
  Tensor dbias;
};
// The backward of h's two consumers in one pass: LayerNorm's input gradient (from dy_ln, the
// gradient of the LayerNorm output) plus dh_residual, the gradient h received from its other
// consumer, summed in the compute type and rounded once. dh_residual may be undefined (plain
// LayerNorm backward). On the CPU in f32 and f64, dh equals layernorm_backward's dx followed by
// add(dx, dh_residual) bit for bit; in narrower dtypes it is more accurate (one rounding, not two).
// h, mean and rstd are what add_layernorm_forward returned; x and y both receive dh.
AddLayerNormGrads add_layernorm_backward(const Tensor& dy_ln, const Tensor& dh_residual, const Tensor& h,
                                         const Tensor& weight, const Tensor& mean, const Tensor& rstd);

// ---- GELU -------------------------------------------------------------------------------------------
enum class GeluApproximation { None, Tanh };  // erf form (timm's default), or the tanh approximation
Tensor gelu_forward(const Tensor& x, GeluApproximation approximation = GeluApproximation::None);
Tensor gelu_backward(const Tensor& dy, const Tensor& x, GeluApproximation approximation = GeluApproximation::None);
// gelu_backward(dy, x) and gelu_forward(x) at once, bit for bit those two calls: for a backward that
// needs the GELU's output again (an MLP's fc2 weight gradient, where forward kept only the GELU's
// input). On the GPU one pass reads x once for both (ViT-H's MLP in bf16: 516 MB moved, not 646).
// With may_overwrite_dy (dy needed by nobody after the call), the GPU writes dx over dy, so the pass
// holds no more memory than gelu_backward alone; the CPU makes dx anew either way.
//
// With dbias_dtype, also dbias = Σ over dx's rows (dx as [rows, x.size(-1)]): the bias gradient of the
// Linear whose output x is (an MLP's fc1), which the GPU sums in the same pass as it stores dx, where
// cuBLASLt's BGRADB epilogue on fc1's wgrad GEMM would read dx again (129 MB in ViT-H's bf16 MLP). On
// the CPU it is sum(dx, 0).to(dbias_dtype), what kernels::linear_backward computes there, bit for bit
// (the sum rounded to x's dtype, as kernels::sum returns it, then to dbias_dtype). The GPU adds the
// f32 sums in its own fixed order (per 64-row band, then the bands), so its bits are reproducible but
// not the CPU's, and rounds them to dbias_dtype alone when that is f32 (as BGRADB wrote an f32
// gradient), else through x's dtype as the CPU does.
// dbias_dtype: a floating dtype, not FP8 (f32, bf16 or f16 on the GPU).
struct GeluGradAndOutput {
  Tensor dx, y;
  Tensor dbias;  // [x.size(-1)] in dbias_dtype, or undefined without it
};
GeluGradAndOutput gelu_backward_and_forward(const Tensor& dy, const Tensor& x, GeluApproximation approximation,
                                            bool may_overwrite_dy = false,
                                            std::optional<DType> dbias_dtype = std::nullopt);

// ---- softmax cross-entropy ----------------------------------------------------------------------------
// logits [N, C] (any floating dtype), targets [N] i64 or i32 with values in [0, C) or ignore_index.
// With label smoothing s the target distribution is (1 - s)·onehot + s/C. The loss is the mean over
// rows whose target is not ignore_index.
struct CrossEntropyOutput {
  Tensor loss;  // shape [], f32 (f64 for f64 logits)
  Tensor lse;   // [N] log-sum-exp per row, saved for backward instead of the probabilities
};
CrossEntropyOutput cross_entropy_forward(const Tensor& logits, const Tensor& targets, double label_smoothing = 0.0,
                                         int64_t ignore_index = -100);
// dloss: the gradient of the loss, a one-element tensor on logits' device (a tensor, not a double,
// so that a GPU backward never waits to read it on the host). Returns dlogits in logits' dtype.
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dloss,
                              double label_smoothing = 0.0, int64_t ignore_index = -100);

// ---- dropout ------------------------------------------------------------------------------------------
// Element i is kept iff philox::uniform(word i of the stream at (seed, offset)) >= p, and kept
// elements are scaled by 1/(1-p). The mask is never stored: backward regenerates it from the same
// (seed, offset), on the CPU or the GPU. Reserve offset with Generator::reserve_for(numel).
Tensor dropout_forward(const Tensor& x, double p, uint64_t seed, uint64_t offset);
Tensor dropout_backward(const Tensor& dy, double p, uint64_t seed, uint64_t offset);

}  // namespace octet::kernels
