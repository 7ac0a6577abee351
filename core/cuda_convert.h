#pragma once
// Dtype conversion, fill and copies of device memory, for Tensor's CUDA branches (CUDA builds only).
//
// The conversions are the device twin of convert_elements (core/dtype.h): the same functions of
// core/float_formats.h round and saturate, and the same routes are taken (f32 <-> bf16/f16/FP8
// directly, everything else through double), so a device conversion gives the host's bits for
// every pair of dtypes. Floating to integral truncates toward zero; NaN and values outside the
// integer's range give what x86-64 gives on the host (the "integer indefinite" INT_MIN, and for
// u8 the low byte of the i32 conversion), where C++ leaves the result undefined.
//
// Everything runs on the device's current stream (core/cuda_stream.h) and returns without waiting.
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace octet::cuda {

// dst[i] = src[i] converted from src_dtype to dst_dtype, for n elements in device memory.
void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, int device_index);

// Writes n copies of the element_size-byte pattern at host address `element` (1, 2, 4 or 8 bytes).
void fill_elements(void* dst, const void* element, size_t element_size, int64_t n, int device_index);

// Copies nbytes within one device's memory (stream-ordered, no host wait).
void copy_device_bytes(void* dst, const void* src, size_t nbytes, int device_index);

}  // namespace octet::cuda
