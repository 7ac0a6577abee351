#pragma once
// Scaled dot-product attention, out = softmax(q·kᵀ·scale)·v, non-causal, in two layouts:
//   attention_forward/backward         q, k, v, out: [B, H, S, D] (k and v may have their own Sk)
//   packed_attention_forward/backward  q, k and v read in place from the qkv projection's output
//                                      [B, S, 3, H, D]; out is [B, S, H, D]; dq, dk and dv are
//                                      written into one [B, S, 3, H, D] gradient. This is what
//                                      nn::MultiheadAttention runs: no permutes, no selects, no
//                                      zero-padded gradient buffers (kernels/attention_layout.h).
// Forward saves the per-row log-sum-exp (f32) instead of the probabilities, as fused attention
// does; backward recomputes the probabilities from it.
//
// On a GPU, cuDNN's fused kernels run when they can; otherwise the unfused GPU kernels do, and the
// first time in a process that happens a warning is logged that starts with the fixed text
// "attention: no fused cuDNN plan" (grep a run's log for it). The environment variables:
//   OCTET_REQUIRE_FUSED_ATTENTION=1  taking the unfused path throws instead, with the shapes, the
//                                    dtype, the cuDNN version, why no fused plan was found and
//                                    what to change (for runs and tests that must be fused);
//   OCTET_DISABLE_CUDNN_ATTENTION=1  always takes the unfused path (A/B timing, tests).
#include "core/tensor.h"

namespace octet::kernels {

struct AttentionOutput {
  Tensor out;  // q's dtype
  Tensor lse;  // [B, H, S], f32 (f64 for f64 inputs)
};
AttentionOutput attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale);

struct AttentionGrads {
  Tensor dq, dk, dv;
};
AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, double scale);

// qkv [B, S, 3, H, D] (timm's qkv Linear output [B, S, 3·H·D] with its heads spelled out) ->
// out [B, S, H, D] in qkv's dtype (a view of [B, S, H·D], what `proj` takes) and lse [B, H, S]
// (f32; f64 for f64 qkv on the CPU).
AttentionOutput packed_attention_forward(const Tensor& qkv, double scale);
// dout and out [B, S, H, D] -> dqkv [B, S, 3, H, D] in qkv's dtype: dq, dk and dv side by side, as
// the gradient of the qkv projection's output needs them.
Tensor packed_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                 double scale);

// Which GPU path attention_forward and attention_backward took, counted per process over every
// device since the process started: `fused` is cuDNN's fused SDPA, `unfused` the GPU kernels of
// kernels/cuda/attention_unfused.cu. Calls on the CPU are not counted, nor direct calls into the
// backends of kernels/cuda/attention_cuda.h. Tests and benchmarks read it to prove that the fused
// kernels ran; all zero in a build without CUDA.
struct AttentionPathCounts {
  int64_t fused_forward = 0, fused_backward = 0;
  int64_t unfused_forward = 0, unfused_backward = 0;
};
AttentionPathCounts attention_path_counts();

}  // namespace octet::kernels
