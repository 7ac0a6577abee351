#pragma once
// CPU compute behind kernels/elementwise.cpp. T is the type the op computes in: float or double
// for floating tensors (kernels/common.h), int32_t or int64_t for integer ones. Every pointer is a
// contiguous row-major buffer; argument checking has already happened in the entry point.
#include <cstddef>
#include <cstdint>

#include "core/float_formats.h"
#include "core/shape.h"

namespace octet::kernels::cpu {

enum class BinaryOp { add, sub, mul, div, pow, maximum };
enum class UnaryOp { neg, exp, log, tanh, sqrt, rsqrt, abs, sign };
enum class ScalarOp { add, mul, rsub, rdiv, pow };  // a + s, a * s, s - a, s / a, a ^ s

// out = op(a, b), with a and b broadcast (NumPy rules) to out_shape.
template <class T>
void binary(BinaryOp op, const T* a, const Shape& a_shape, const T* b, const Shape& b_shape, T* out,
            const Shape& out_shape);
// out = op(a, b) for bf16 a and b of one shape, n elements: computed in f32 a chunk at a time and
// rounded once (kernels/cpu/bf16_chunks.h), the bits of binary<float> on the widened tensors.
void binary_same_shape_bf16(BinaryOp op, const bfloat16* a, const bfloat16* b, bfloat16* out, int64_t n);
// out = op(a) over n elements; out may equal a.
template <class T>
void unary(UnaryOp op, const T* a, T* out, int64_t n);
// out = op(a, s) over n elements; out may equal a.
template <class T>
void scalar(ScalarOp op, const T* a, T s, T* out, int64_t n);
// dst += alpha * src over n elements.
template <class T>
void axpy(T* dst, const T* src, T alpha, int64_t n);

// Copies src into dst, repeating it along broadcast dims. Works on raw elements of any size.
void broadcast_copy(const void* src, const Shape& src_shape, void* dst, const Shape& dst_shape, size_t element_size);

}  // namespace octet::kernels::cpu
