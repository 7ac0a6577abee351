#pragma once
// Differentiable functions: each runs a kernel forward and records its gradient (autograd/function.h).
// Names and semantics follow PyTorch. All live in namespace octet so that `a + b` finds them.
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "kernels/nn_ops.h"

namespace octet {

// ---- arithmetic (broadcasting) --------------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);  // a > 0 where b's gradient is needed
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor pow(const Tensor& a, double exponent);
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(const Tensor& a, double s);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(const Tensor& a, double s);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(const Tensor& a, double s);
Tensor operator/(double s, const Tensor& a);

// ---- reductions and softmax ----------------------------------------------------------------------
Tensor sum(const Tensor& a);
Tensor sum(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& a);
Tensor mean(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& a, int64_t dim, bool keepdim = false);  // values; the gradient goes to the first argmax
Tensor softmax(const Tensor& a, int64_t dim = -1);
Tensor log_softmax(const Tensor& a, int64_t dim = -1);

// ---- shape and data movement ---------------------------------------------------------------------
Tensor reshape(const Tensor& a, const Shape& shape);
Tensor flatten(const Tensor& a, int64_t start_dim = 0);  // merges dims start_dim.. into one
Tensor permute(const Tensor& a, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& a);  // swaps the last two dims
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t length);
Tensor narrow(const Tensor& a, int64_t start, int64_t length);  // slice along dim 0
Tensor select(const Tensor& a, int64_t dim, int64_t index);     // slice of length 1, dim dropped (the ViT's class token)
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& a, const std::vector<int64_t>& sizes, int64_t dim);
Tensor broadcast_to(const Tensor& a, const Shape& shape);  // e.g. cls_token [1,1,D] -> [B,1,D]
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& indices);
Tensor patchify(const Tensor& images, int64_t patch);
Tensor cast(const Tensor& a, DType dtype);     // the gradient is cast back to a's dtype
Tensor to_device(const Tensor& a, Device device);
Tensor clone(const Tensor& a);

// ---- linear algebra -------------------------------------------------------------------------------
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// y = x·Wᵀ + b with x [..., in], weight [out, in], bias [out] or undefined. With a residual (y's
// shape and dtype), residual + x·Wᵀ + b: a residual add after a Linear (a pre-norm block's attention
// projection), which on the GPU the GEMM reads in its epilogue (kernels::linear_forward, one rounding
// where the add after it rounds twice); the residual's gradient is the output's.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Tensor& residual = Tensor());

// ---- neural-network functions --------------------------------------------------------------------
// LayerNorm over the last dim; weight and bias [C] or undefined.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-6);
// The pre-norm residual step fused: returns (h, layer_norm(h)) with h = x + y, from one kernel per
// direction (kernels::add_layernorm_forward/backward). x and y: one shape, dtype and device. Both
// outputs are differentiable; h's gradient from its other consumers is added to LayerNorm's input
// gradient in the same pass, and x and y both receive that sum.
std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,
                                         double eps = 1e-6);
// A pre-norm block's first step: returns (r, layer_norm(x)) with r = x (the same data) as this node's
// output, for x's other consumer, the residual add. Backward adds r's gradient to LayerNorm's input
// gradient in LayerNorm's own pass (kernels::add_layernorm_backward), where using x twice would leave
// the sum to a separate add. Same values as (x, layer_norm(x)); bit for bit in f32 and f64 on the CPU,
// and in narrower dtypes the gradient is rounded once where the add rounded twice.
std::pair<Tensor, Tensor> residual_layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                              double eps = 1e-6);
Tensor gelu(const Tensor& x, kernels::GeluApproximation approximation = kernels::GeluApproximation::None);
// linear(gelu(h), weight, bias) as one node that keeps h for backward but not the GELU's output (the
// Linear's input, as large as h): backward makes it again from h for the weight gradient. An MLP's
// act -> fc2 then saves one [tokens, hidden] tensor instead of two, at the cost of one more pass over
// h in backward. The values and gradients are those of the two functions, bit for bit.
Tensor gelu_linear(const Tensor& h, kernels::GeluApproximation approximation, const Tensor& weight,
                   const Tensor& bias = Tensor());
// linear(gelu(linear(x, weight1, bias1)), weight2, bias2), an MLP's fc1 -> GELU -> fc2, as one node
// that keeps x and fc1's output for backward but not the GELU's output (as gelu_linear does). Its
// forward GEMM carries the GELU where it can (kernels::linear_gelu_forward: the tanh form in bf16/f16
// on the GPU): fc1's GEMM writes the GELU's output beside its own. Elsewhere (the CPU, the erf form,
// f32) the values are those of the three functions, bit for bit; the gradients are everywhere
// (kernels::linear_dgelu_backward is the dgrad then the GELU backward kernel). fc1's bias gradient is
// summed in the GELU backward's pass (kernels::gelu_backward_and_forward).
//
// With a residual (the output's shape and dtype), returns residual + the MLP: a pre-norm block's last
// residual add, which on the GPU fc2's GEMM reads in its epilogue (kernels::linear_forward, one
// rounding where the add after it rounds twice); the residual's gradient is the output's.
Tensor linear_gelu_linear(const Tensor& x, const Tensor& weight1, const Tensor& bias1,
                          kernels::GeluApproximation approximation, const Tensor& weight2,
                          const Tensor& bias2 = Tensor(), const Tensor& residual = Tensor());
// Mean softmax cross-entropy of logits [N, C] against class indices [N]; returns shape [].
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, double label_smoothing = 0.0,
                     int64_t ignore_index = -100);
// Inverted dropout with a Philox mask drawn from `gen` (default_generator() when null); identity
// when p == 0 or `training` is false.
Tensor dropout(const Tensor& x, double p, bool training = true, Generator* gen = nullptr);
// softmax(q·kᵀ·scale)·v over [B, H, S, D]; scale defaults to 1/sqrt(D).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    std::optional<double> scale = std::nullopt);
// The same attention over the qkv projection's output as it is: qkv [B, S, 3·H·D], each token's
// features q's H heads, then k's, then v's (timm's layout) -> [B, S, H·D], heads side by side, ready
// for the output projection. No permute or select runs in either direction: the kernels read q, k
// and v through strides, and the backward writes dq, dk and dv straight into one [B, S, 3·H·D]
// gradient. scale defaults to 1/sqrt(D).
Tensor packed_qkv_attention(const Tensor& qkv, int64_t num_heads, std::optional<double> scale = std::nullopt);

}  // namespace octet
