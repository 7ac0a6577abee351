#pragma once
// CUDA data movement behind kernels/shape_ops.cpp (plain C++: no CUDA types). These mirror the CPU
// routines of kernels/cpu/shape_ops_cpu.h: they move raw elements of `elem` bytes, so every dtype
// shares them, and the entry points have already checked the arguments and allocated the outputs.
// `device` is the CUDA device holding the pointers; work goes on its current stream.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace octet::kernels::cuda {

// out = in permuted: out.shape[i] = in_shape[dims[i]]. At most 8 dims once size-1 dims are dropped
// and dims that stay neighbours are merged.
void permute(Device device, const void* in, void* out, const Shape& in_shape, const std::vector<int64_t>& dims,
             size_t elem);

// `rows` rows of `row_bytes` from src (rows src_stride bytes apart) to dst (dst_stride apart).
void copy_rows(Device device, const void* src, int64_t src_stride, void* dst, int64_t dst_stride, int64_t rows,
               int64_t row_bytes);

// Each of `rows` rows of `row_bytes` in dst gets src's packed row (band_bytes) at byte band_begin
// and zero bytes elsewhere: the gradient of a slice, written once.
void place_band(Device device, const void* src, int64_t rows, int64_t row_bytes, int64_t band_begin, int64_t band_bytes,
                void* dst);

// x seen as [outer, extent, inner]: out[o, j, :] = x[o, indices[j], :]. Indices are already checked.
void gather_rows(Device device, const void* x, void* out, int64_t outer, int64_t extent, int64_t inner,
                 const std::vector<int64_t>& indices, size_t elem);

// The gradient of gather_rows: a tensor of full_shape (grad's dtype, f32/bf16/f16 or FP8) with
// out[o, e, :] = sum of grad[o, j, :] over the j with indices[j] == e, added in index order in f32
// (deterministic, no atomics: the same sums in the same order as the CPU).
Tensor scatter_add_rows(const Tensor& grad, const Shape& full_shape, int64_t outer, int64_t extent, int64_t inner,
                        const std::vector<int64_t>& indices);

}  // namespace octet::kernels::cuda
