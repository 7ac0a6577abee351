#pragma once
// CPU data movement. Everything here moves raw elements of `elem` bytes (1, 2, 4 or 8), so one
// routine serves every dtype; the entry points in kernels/shape_ops.cpp have already checked the
// arguments and allocated the outputs.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/shape.h"

namespace octet::kernels::cpu {

// out = x permuted: out.shape[i] = in_shape[dims[i]], dims a permutation of 0..ndim-1.
void permute(const void* in, void* out, const Shape& in_shape, const std::vector<int64_t>& dims, size_t elem);

// Copies `rows` rows of `row_bytes` from src (rows `src_stride` bytes apart) to dst (rows `dst_stride`
// bytes apart). Concat, split and slice are all this: a tensor seen as [outer, extent·inner] is a
// set of rows, and a piece along `dim` is a column band of them.
void copy_rows(const void* src, int64_t src_stride, void* dst, int64_t dst_stride, int64_t rows, int64_t row_bytes);

// The gradient of a slice, written once: each of `rows` destination rows of `row_bytes` gets src's
// row (rows of `band_bytes`, packed) at byte `band_begin` and zero bytes everywhere else.
void place_band(const void* src, int64_t rows, int64_t row_bytes, int64_t band_begin, int64_t band_bytes, void* dst);
// dst[0, nbytes) = 0, split across threads when large.
void zero_bytes(void* dst, int64_t nbytes);

// x seen as [outer, extent, inner]: out[o, j, :] = x[o, indices[j], :]. Indices are already checked.
void gather_rows(const void* x, void* out, int64_t outer, int64_t extent, int64_t inner,
                 const std::vector<int64_t>& indices, size_t elem);

// The transpose of gather_rows, accumulated: acc[o, indices[j], :] += grad[o, j, :], acc zeroed by
// the caller. T is the compute type; repeated indices add in index order, so results are deterministic.
template <class T>
void scatter_add_rows(const T* grad, T* acc, int64_t outer, int64_t extent, int64_t inner,
                      const std::vector<int64_t>& indices);

}  // namespace octet::kernels::cpu
