#pragma once
// CPU implementations behind kernels/fp8.h. The entry points in kernels/fp8.cpp have checked the
// arguments; here x is a contiguous buffer of storage type X (float, bfloat16 or float16 from
// core/float_formats.h), read as [rows, cols], and every scale tensor is a plain f32 array.
//
// The element arithmetic is the CUDA kernels' (kernels/cuda/fp8.cu), from the same headers:
// q = float_to_e4m3/e5m2(float(x) · scale, saturate) and the rules of kernels/fp8_scale_rule.h, so
// both backends give the same bits.
#include <cstdint>

#include "core/dtype.h"

namespace octet::kernels::cpu {

// Writes data[r, c] = fp8(x[r, c]·scale) when data is non-null and transposed[c, r] = the same byte
// when transposed is non-null, with transposed[c, rows..padded_rows) = 0. Returns amax(x) as bits:
// the largest of (bits of float(x[i])) & 0x7FFFFFFF, an order- and thread-count-independent result.
template <class X>
uint32_t fp8_cast(const X* x, int64_t rows, int64_t cols, float scale, DType fp8_dtype, uint8_t* data,
                  uint8_t* transposed, int64_t padded_rows);

// amax(x) as bits, as fp8_cast returns it.
template <class X>
uint32_t fp8_amax_bits(const X* x, int64_t n);

// Delayed scaling for one group: history is [L, n], scale and scale_inv [n] (kernels/fp8.h).
void fp8_update_scales(float* history, float* scale, float* scale_inv, int64_t L, int64_t n, float fp8_max,
                       float two_pow_margin, bool most_recent);

// Current scaling: scale[j], scale_inv[j] from amax[j], for j < n.
void fp8_scale_from_amax(const float* amax, float* scale, float* scale_inv, int64_t n, float fp8_max,
                         float two_pow_margin);

}  // namespace octet::kernels::cpu
