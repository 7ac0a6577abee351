#pragma once
// CUDA reductions and softmax behind kernels/reduce.cpp (plain C++: no CUDA types). Like the CPU
// kernels (kernels/cpu/reduce_cpu.h), each sees its contiguous input as [outer, n, inner] around
// the reduced dim; the entry point has checked the arguments and computed that geometry. Inputs are
// f32, bf16 or f16 (e4m3/e5m2 go through f32, as on the CPU); everything accumulates in f32. f64
// has no CUDA kernel and throws an error naming the op and the fix.
#include "core/tensor.h"

namespace octet::kernels::cuda {

// out[o·inner + i] = (sum over k of a[o, k, i]) / divisor, as a 1-D tensor of out_dtype (an FP8 or
// f64 result is the f32 sums converted). `op` names the caller (sum, mean, sum_to) in errors.
Tensor sum(const Tensor& a, int64_t outer, int64_t n, int64_t inner, float divisor, DType out_dtype, const char* op);
// The maximum over the middle dim (values in a's dtype) and where it first occurs (i64); NaN
// counts as larger than everything. 1-D results of outer·inner elements. Needs n >= 1.
void max(const Tensor& a, int64_t outer, int64_t n, int64_t inner, Tensor& values, Tensor& indices);
// max |x| over the middle dim, NaN propagating, 0 when n == 0: a 1-D f32 tensor.
Tensor amax(const Tensor& a, int64_t outer, int64_t n, int64_t inner);
// softmax (or log_softmax) along the middle dim; same shape and dtype as a.
Tensor softmax(const Tensor& a, int64_t outer, int64_t n, int64_t inner, bool log);
// dx from y = softmax(x) (or log_softmax(x)) and dy along the middle dim.
Tensor softmax_backward(const Tensor& y, const Tensor& dy, int64_t outer, int64_t n, int64_t inner, bool log);

}  // namespace octet::kernels::cuda
