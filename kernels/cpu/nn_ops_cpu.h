#pragma once
// CPU implementations behind kernels/nn_ops.h. Each works on contiguous buffers of its compute
// type T (float or double; kernels/common.h says why there are only two): the entry points in
// kernels/nn_ops.cpp have already checked the arguments, widened the inputs to T and will round
// the outputs back to the caller's dtype. Instantiated for float and double; the *_bf16 entry points
// take bf16 buffers as they are and widen them a chunk at a time.
#include <cstdint>

#include "core/float_formats.h"
#include "kernels/nn_ops.h"

namespace octet::kernels::cpu {

// LayerNorm over rows of length C. weight and bias may be null (no affine; bias may be null alone).
template <class T>
void layernorm_forward(const T* x, const T* weight, const T* bias, T* y, T* mean, T* rstd, int64_t rows, int64_t C,
                       T eps);
// dweight and dbias are written only when weight is non-null.
template <class T>
void layernorm_backward(const T* dy, const T* x, const T* weight, const T* mean, const T* rstd, T* dx, T* dweight,
                        T* dbias, int64_t rows, int64_t C);
// h = x + y, then layernorm_forward of h, row by row. The one exception to "outputs are rounded on
// the way out": h is rounded to h_dtype (the caller's dtype) in place before its row is normalized,
// so that the LayerNorm sees the h the caller gets back, as add() followed by layernorm_forward()
// would. With h_dtype the compute type itself nothing is rounded.
template <class T>
void add_layernorm_forward(const T* x, const T* y, const T* weight, const T* bias, T* h, T* out, T* mean, T* rstd,
                           int64_t rows, int64_t C, T eps, DType h_dtype);
// The forwards for bf16 x (and y) with f32 weight and bias (either may be null): each row widened
// into a buffer at the alignment its f32 row would have, normalized by the f32 row routine and
// rounded into place, so the bits of widening whole, calling the f32 kernels and rounding.
void layernorm_forward_bf16(const bfloat16* x, const float* weight, const float* bias, bfloat16* y, float* mean,
                            float* rstd, int64_t rows, int64_t C, float eps);
void add_layernorm_forward_bf16(const bfloat16* x, const bfloat16* y, const float* weight, const float* bias,
                                bfloat16* h, bfloat16* out, float* mean, float* rstd, int64_t rows, int64_t C,
                                float eps);
// The backward for bf16 dy and x (and dresidual, which may be null, added to dx before its rounding)
// with an f32 weight (or null: then dweight and dbias are not written), the same way: a row at a
// time, dweight and dbias in f32.
void add_layernorm_backward_bf16(const bfloat16* dy, const bfloat16* dresidual, const bfloat16* x, const float* weight,
                                 const float* mean, const float* rstd, bfloat16* dx, float* dweight, float* dbias,
                                 int64_t rows, int64_t C);
// layernorm_backward of h, with dresidual (may be null) added to dh row by row.
template <class T>
void add_layernorm_backward(const T* dy, const T* dresidual, const T* h, const T* weight, const T* mean,
                            const T* rstd, T* dh, T* dweight, T* dbias, int64_t rows, int64_t C);

template <class T>
void gelu_forward(const T* x, T* y, int64_t n, GeluApproximation approximation);
template <class T>
void gelu_backward(const T* dy, const T* x, T* dx, int64_t n, GeluApproximation approximation);
// The same in bf16: computed in f32 a chunk at a time and rounded once (kernels/cpu/bf16_chunks.h),
// the bits of widening x (and dy) whole, calling the f32 kernels above and rounding their result.
void gelu_forward_bf16(const bfloat16* x, bfloat16* y, int64_t n, GeluApproximation approximation);
void gelu_backward_bf16(const bfloat16* dy, const bfloat16* x, bfloat16* dx, int64_t n,
                        GeluApproximation approximation);

// targets are already checked to be in [0, C) or ignore_index. Writes lse[N] and returns the mean
// loss over the rows that are not ignored (0 when there are none).
template <class T>
T cross_entropy_forward(const T* logits, const int64_t* targets, T* lse, int64_t N, int64_t C, T label_smoothing,
                        int64_t ignore_index);
// dlogits = grad_scale · (softmax - target distribution) on rows that are not ignored, 0 on the rest.
template <class T>
void cross_entropy_backward(const T* logits, const int64_t* targets, const T* lse, T* dlogits, int64_t N, int64_t C,
                            T grad_scale, T label_smoothing, int64_t ignore_index);

// out = mask · in / (1 - p), the mask regenerated from (seed, offset). Forward (in = x) and
// backward (in = dy) are the same computation.
template <class T>
void dropout_apply(const T* in, T* out, int64_t n, double p, uint64_t seed, uint64_t offset);

}  // namespace octet::kernels::cpu
