#pragma once
// Reductions and softmax. All accumulate in f32 (f64 for f64 inputs) whatever the storage dtype;
// results keep the input dtype. `dim` may be negative.
#include "core/tensor.h"

namespace octet::kernels {

Tensor sum(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor sum(const Tensor& a);  // over everything: shape []
Tensor mean(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& a);

struct MaxResult {
  Tensor values;
  Tensor indices;  // i64, position along dim of the first maximum
};
MaxResult max(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& a);  // over everything: shape []

// The FP8 meaning of amax: max |x|. NaN propagates. Result is f32 (f64 for f64 inputs).
Tensor amax(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor amax(const Tensor& a);

// Sums a broadcast result back to `shape` (the gradient of broadcasting): dims that were added
// or were 1 in `shape` are summed over.
Tensor sum_to(const Tensor& a, const Shape& shape);

// Numerically stable: subtracts the row max before exponentiating.
Tensor softmax(const Tensor& a, int64_t dim = -1);
Tensor log_softmax(const Tensor& a, int64_t dim = -1);
// Given y = softmax(x) (or log_softmax(x)) and dL/dy, returns dL/dx.
Tensor softmax_backward(const Tensor& y, const Tensor& dy, int64_t dim = -1);
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy, int64_t dim = -1);

}  // namespace octet::kernels
