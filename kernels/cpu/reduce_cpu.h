#pragma once
// CPU compute behind kernels/reduce.cpp. T is the compute type, float or double. Every kernel sees
// its contiguous input as [outer, n, inner] with the reduced (or softmaxed) dim in the middle, so
// one code path covers any dim: reducing the last dim is inner = 1, reducing everything is
// outer = inner = 1. Outputs are [outer, inner] for reductions and [outer, n, inner] otherwise.
#include <cstdint>

namespace octet::kernels::cpu {

// out[o, i] = (sum over k of a[o, k, i]) / divisor. Pairwise summation in fixed-size chunks, so the
// result does not depend on the thread count.
template <class T>
void sum(const T* a, int64_t outer, int64_t n, int64_t inner, T divisor, T* out);

// values[o, i] = max over k of a[o, k, i]; indices (may be null) gets the first k attaining it.
// NaN counts as larger than everything. Needs n >= 1.
template <class T>
void max(const T* a, int64_t outer, int64_t n, int64_t inner, T* values, int64_t* indices);

// out[o, i] = max over k of |a[o, k, i]|, NaN propagating; 0 when n == 0.
template <class T>
void amax(const T* a, int64_t outer, int64_t n, int64_t inner, T* out);

// out = softmax (or log_softmax) of a along the middle dim.
template <class T>
void softmax(const T* a, int64_t outer, int64_t n, int64_t inner, bool log, T* out);

// dx from y = softmax(x) (or log_softmax(x)) and dy, along the middle dim.
template <class T>
void softmax_backward(const T* y, const T* dy, int64_t outer, int64_t n, int64_t inner, bool log, T* dx);

}  // namespace octet::kernels::cpu
