#pragma once
// CUDA elementwise kernels behind kernels/elementwise.cpp (plain C++: no CUDA types). The entry
// points have checked devices, dtypes and shapes; these allocate on the input's device and launch
// on its current stream.
//
// Precision matches the CPU kernels: f32, bf16 and f16 load into f32, compute in f32 and round once
// on the way out; e4m3/e5m2 are converted to f32 and back around the same kernels (as the CPU
// does); i32/i64 compute in their own type with wrapping overflow. f64 and u8 have no CUDA kernel
// and throw an error naming the op and the fix.
#include "core/tensor.h"
#include "kernels/cpu/elementwise_cpu.h"  // BinaryOp, UnaryOp, ScalarOp: the op names both backends share

namespace octet::kernels::cuda {

// op(a, b) with a and b (same dtype) broadcast to out_shape. `name` is the op for error messages.
Tensor binary(cpu::BinaryOp op, const Tensor& a, const Tensor& b, const Shape& out_shape, const char* name);
Tensor unary(cpu::UnaryOp op, const Tensor& a, const char* name);
// op(a, s); for integer tensors s is a whole number the entry point checked fits.
Tensor scalar(cpu::ScalarOp op, const Tensor& a, double s, const char* name);
// a repeated along broadcast dims into a new tensor of `shape`; any dtype (moves raw elements).
Tensor broadcast_to(const Tensor& a, const Shape& shape);
// dst += alpha·src in place (dst may be a view at an offset; src may have another dtype).
void add_(const Tensor& dst, const Tensor& src, double alpha);
// dst *= s in place.
void mul_scalar_(const Tensor& dst, double s);
// dst /= divisor in place, for f32, bf16 and f16: each element is divided by float(divisor) in f32
// (correctly rounded) and rounded once to dst's dtype. Unlike mul_scalar_(dst, 1 / divisor), whose
// factor is already rounded, this gives every bf16 and f16 value its correctly rounded quotient for
// divisors up to 4096, f16 subnormal ties included (the average after a sum: NCCL's all-reduce).
void div_scalar_(const Tensor& dst, double divisor);

}  // namespace octet::kernels::cuda
