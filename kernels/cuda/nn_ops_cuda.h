#pragma once
// CUDA implementations behind kernels/nn_ops.h (plain C++: no CUDA types). The entry points in
// kernels/nn_ops.cpp have checked shapes, dtypes and devices; these allocate the outputs on the
// inputs' device and launch on its current stream. Activations are f32, bf16 or f16 (f64 is refused
// by name: run it on the cpu); statistics, log-sum-exps and losses are f32.
#include <cstdint>
#include <optional>

#include "core/tensor.h"
#include "kernels/nn_ops.h"

namespace octet::kernels::cuda {

// weight and bias may be undefined, or of a floating dtype other than x's (f32 weights, bf16 x).
LayerNormOutput layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
LayerNormGrads layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                  const Tensor& rstd);
// The residual add fused in: one forward kernel writes h = x + y (rounded to x's dtype as the add
// kernel rounds it) and normalizes it; one backward kernel adds dh_residual (may be undefined) to
// LayerNorm's input gradient before the single rounding (the dweight/dbias column sums are the
// second, small kernel layernorm_backward also launches).
AddLayerNormOutput add_layernorm_forward(const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,
                                         double eps);
AddLayerNormGrads add_layernorm_backward(const Tensor& dy_ln, const Tensor& dh_residual, const Tensor& h,
                                         const Tensor& weight, const Tensor& mean, const Tensor& rstd);

Tensor gelu_forward(const Tensor& x, GeluApproximation approximation);
Tensor gelu_backward(const Tensor& dy, const Tensor& x, GeluApproximation approximation);
// dx_into_dy: dx written over dy. dbias_dtype: f32, bf16 or f16 (the entry point checks).
GeluGradAndOutput gelu_backward_and_forward(const Tensor& dy, const Tensor& x, GeluApproximation approximation,
                                            bool dx_into_dy, std::optional<DType> dbias_dtype);

// The targets' values are not checked on the host (that would wait for the GPU): a target outside
// [0, C) that is not ignore_index makes its row's loss and gradient NaN, and so the mean loss.
CrossEntropyOutput cross_entropy_forward(const Tensor& logits, const Tensor& targets, double label_smoothing,
                                         int64_t ignore_index);
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dloss,
                              double label_smoothing, int64_t ignore_index);

// out = mask · in / (1 - p) with the CPU kernel's mask (kernels/cpu/dropout.cpp); 0 < p < 1.
Tensor dropout_apply(const Tensor& in, double p, uint64_t seed, uint64_t offset);

}  // namespace octet::kernels::cuda
