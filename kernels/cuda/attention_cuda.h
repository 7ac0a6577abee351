#pragma once
// GPU attention backends behind kernels/attention.h (plain C++: no CUDA or cuDNN types here).
//
//   cuDNN fused SDPA (attention_cudnn.cpp): bf16/f16, head dim <= 128 and a multiple of 8, through
//   the cuDNN graph (backend) API. Built plans are cached per device and shape.
//   Unfused (attention_unfused.cu): any floating dtype cuDNN or the GPU has kernels for (f32, bf16,
//   f16) and any head dim; computes in f32 and rounds once, like the CPU reference.
//
// Both take q [B, H, S, D], k and v [B, H, Sk, D] on one CUDA device, all of one dtype, or (the
// packed_ functions) one qkv [B, S, 3, H, D] with out [B, S, H, D] and dqkv in qkv's layout
// (kernels/attention_layout.h). Both return lse as f32 [B, H, S] (natural-log log-sum-exp of each
// row of scale·q·kᵀ), so a forward on one path and a backward on the other agree. Argument checks
// are the caller's (kernels/attention.cpp).
#include <optional>
#include <string>

#include "kernels/attention.h"

namespace octet::kernels::cuda {

// Why cuDNN's fused attention cannot take these inputs at all (dtype, head dim, alignment), or an
// empty string when it may: a plan still has to build.
std::string cudnn_attention_unsupported_reason(const Tensor& q, const Tensor& k, const Tensor& v);

// The fused forward, or nullopt with `why_not` filled when cuDNN builds no plan for this shape.
// A failure while running a plan that did build throws.
std::optional<AttentionOutput> cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                                       std::string& why_not);
// The fused backward; dout and out have q's dtype, lse is f32 [B, H, S].
std::optional<AttentionGrads> cudnn_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                       const Tensor& v, const Tensor& out, const Tensor& lse,
                                                       double scale, std::string& why_not);

// How many plans (forward and backward, per device and shape) the cuDNN cache holds, counting
// shapes that built none. Tests use it to see a second call reuse the first one's plan.
size_t cudnn_attention_cached_plans();

// The loaded cuDNN's cudnnGetVersion(): major·10000 + minor·100 + patch (91900 is 9.19.0). Messages
// about missing fused plans name it, since which graphs have engines depends on the release.
size_t cudnn_version();

// The same three for the packed layout: qkv [B, S, 3, H, D] -> out [B, S, H, D], lse; and
// dout, out [B, S, H, D] -> dqkv [B, S, 3, H, D]. cuDNN reads q, k and v (and writes dq, dk and dv)
// through strided descriptors over the one buffer.
std::string cudnn_packed_attention_unsupported_reason(const Tensor& qkv);
std::optional<AttentionOutput> cudnn_packed_attention_forward(const Tensor& qkv, double scale, std::string& why_not);
std::optional<Tensor> cudnn_packed_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                                      const Tensor& lse, double scale, std::string& why_not);

AttentionOutput unfused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale);
AttentionGrads unfused_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& out, const Tensor& lse, double scale);
AttentionOutput unfused_packed_attention_forward(const Tensor& qkv, double scale);
Tensor unfused_packed_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                         double scale);

}  // namespace octet::kernels::cuda
