#pragma once
// Data movement: permutes, concatenation, slicing, patchify and gathers. Any dtype unless noted;
// every result is a new contiguous tensor.
#include <vector>

#include "core/tensor.h"

namespace octet::kernels {

// out.shape[i] = x.shape[dims[i]]; dims is a permutation of 0..ndim-1 (negative dims allowed).
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose_last2(const Tensor& x);  // [..., M, N] -> [..., N, M]

// Joins tensors along dim; all other extents, dtypes and devices must match.
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
// Splits along dim into pieces of the given sizes (they must add up to x.shape[dim]).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
// Rows [start, start + length) along any dim, copied.
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t length);
// The gradient of slice: zeros of `full_shape` with grad written at [start, start + length) along dim.
Tensor slice_backward(const Tensor& grad, const Shape& full_shape, int64_t dim, int64_t start);

// Images [B, C, H, W] -> patches [B, (H/p)·(W/p), C·p·p]. Patches are in row-major grid order and each
// patch's features in (c, ky, kx) order, so a Conv2d weight [D, C, p, p] reshaped to [D, C·p·p] is
// the equivalent Linear weight (timm's PatchEmbed). H and W must be multiples of p.
Tensor patchify(const Tensor& images, int64_t patch);
// The inverse: [B, N, C·p·p] -> [B, C, H, W].
Tensor unpatchify(const Tensor& patches, int64_t patch, int64_t channels, int64_t height, int64_t width);

// out = x gathered at `indices` (i64 or i32, 1-D) along dim.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& indices);
// The gradient of index_select: zeros of `full_shape`, with grad rows added at `indices` along dim
// (repeated indices accumulate).
Tensor index_select_backward(const Tensor& grad, const Shape& full_shape, int64_t dim, const Tensor& indices);

}  // namespace octet::kernels
