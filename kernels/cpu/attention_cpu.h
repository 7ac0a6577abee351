#pragma once
// CPU attention backend: unfused, in the compute type T (float or double), over B·H independent heads
// whose rows sit where kernels/attention_layout.h says (the [B, H, S, D] layout or the packed qkv).
// The entry points in kernels/attention.cpp check shapes and widen the inputs.
#include <cstdint>

#include "core/float_formats.h"
#include "kernels/attention_layout.h"

namespace octet::kernels::cpu {

// One attention operand: its first element and the strides of its heads' rows (D is contiguous).
template <class T>
struct HeadMatrix {
  T* data = nullptr;
  HeadStrides strides;
  T* head(int64_t bh, int64_t heads) const { return data + strides.head_offset(bh, heads); }
  int64_t ld() const { return strides.row; }
};

// q [S, D], k and v [Sk, D] per head -> out [S, D] per head and lse, contiguous [B·H, S].
template <class T>
void attention_forward(HeadMatrix<const T> q, HeadMatrix<const T> k, HeadMatrix<const T> v, HeadMatrix<T> out, T* lse,
                       const AttentionDims& z, T scale);

// Gradients of out with respect to q, k and v given dout, recomputing the probabilities from lse.
// dq, dk and dv may interleave in one buffer (the packed layout): each head writes only its rows.
template <class T>
void attention_backward(HeadMatrix<const T> dout, HeadMatrix<const T> q, HeadMatrix<const T> k, HeadMatrix<const T> v,
                        HeadMatrix<const T> out, const T* lse, HeadMatrix<T> dq, HeadMatrix<T> dk, HeadMatrix<T> dv,
                        const AttentionDims& z, T scale);

// The same for bf16 q, k, v (dout, out) and outputs, with lse in f32, through the tile kernels: each
// head's operands widened into f32 rows in its scratch and its results rounded into place, the bits
// of widening every tensor whole and calling the f32 functions above. False, having done nothing,
// where the tile kernels are not available (the caller then widens whole).
bool attention_forward_bf16(HeadMatrix<const bfloat16> q, HeadMatrix<const bfloat16> k, HeadMatrix<const bfloat16> v,
                            HeadMatrix<bfloat16> out, float* lse, const AttentionDims& z, float scale);
bool attention_backward_bf16(HeadMatrix<const bfloat16> dout, HeadMatrix<const bfloat16> q,
                             HeadMatrix<const bfloat16> k, HeadMatrix<const bfloat16> v, HeadMatrix<const bfloat16> out,
                             const float* lse, HeadMatrix<bfloat16> dq, HeadMatrix<bfloat16> dk,
                             HeadMatrix<bfloat16> dv, const AttentionDims& z, float scale);

}  // namespace octet::kernels::cpu
