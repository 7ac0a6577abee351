#pragma once
// Where attention's operands live in memory, shared by the CPU and GPU backends and by the GPU
// kernels themselves (plain C++: no Tensor, CUDA or cuDNN types).
//
// Attention works per head on [S, D] matrices whose rows are contiguous (stride 1 along D) but need
// not follow each other: row i of head h of batch b starts at
//     base + b·batch + h·head + i·row        (element offsets)
// Two layouts occur:
//   kBhsd    q, k, v, out each their own contiguous [B, H, S, D] tensor (the op-level
//            scaled_dot_product_attention, and the reference the tests use);
//   kPacked  q, k and v read straight out of the qkv projection's output [B, S, 3, H, D] (timm's
//            layout: the 3·H·D features of a token are q's heads, then k's, then v's), and out
//            written as [B, S, H, D], which is [B, S, H·D]: what `proj` takes, with no permute.
//            dq, dk and dv go back into one [B, S, 3, H, D] gradient the same way.
// lse (and the backward's δ) are always contiguous [B, H, S].
#include <cstdint>

#include "core/hostdevice.h"

namespace octet::kernels {

struct HeadStrides {
  int64_t batch = 0, head = 0, row = 0;
  // Element offset of the first row of head `bh` (= b·H + h).
  OCTET_HD int64_t head_offset(int64_t bh, int64_t heads) const { return (bh / heads) * batch + (bh % heads) * head; }
};

// Batch, heads, query and key sequence lengths, head dim.
struct AttentionDims {
  int64_t b = 0, h = 0, s = 0, sk = 0, d = 0;
};

enum class AttentionLayout { kBhsd, kPacked };

// Strides of q (and dq) in `layout`.
inline HeadStrides query_strides(AttentionLayout layout, const AttentionDims& z) {
  if (layout == AttentionLayout::kPacked) return {z.s * 3 * z.h * z.d, z.d, 3 * z.h * z.d};
  return {z.h * z.s * z.d, z.s * z.d, z.d};
}
// Strides of k and v (and dk, dv): in the packed layout Sk = S and they share q's strides.
inline HeadStrides key_strides(AttentionLayout layout, const AttentionDims& z) {
  if (layout == AttentionLayout::kPacked) return {z.sk * 3 * z.h * z.d, z.d, 3 * z.h * z.d};
  return {z.h * z.sk * z.d, z.sk * z.d, z.d};
}
// Strides of out and dout: [B, S, H, D] packed, [B, H, S, D] otherwise.
inline HeadStrides output_strides(AttentionLayout layout, const AttentionDims& z) {
  if (layout == AttentionLayout::kPacked) return {z.s * z.h * z.d, z.d, z.h * z.d};
  return {z.h * z.s * z.d, z.s * z.d, z.d};
}
// Where k and v start inside the packed qkv (and dk, dv inside dqkv), in elements from q.
inline int64_t packed_k_offset(const AttentionDims& z) { return z.h * z.d; }
inline int64_t packed_v_offset(const AttentionDims& z) { return 2 * z.h * z.d; }

}  // namespace octet::kernels
