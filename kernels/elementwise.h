#pragma once
// Elementwise arithmetic with NumPy broadcasting. Operands of binary ops must share dtype and
// device (Octet never promotes silently); the result has that dtype. f64 computes in double,
// every other floating dtype in f32 with the result rounded once to the dtype.
#include "core/tensor.h"

namespace octet::kernels {

// The broadcast shape of a and b, or an Error naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);

Tensor add_scalar(const Tensor& a, double s);   // a + s
Tensor mul_scalar(const Tensor& a, double s);   // a * s
Tensor rsub_scalar(const Tensor& a, double s);  // s - a
Tensor rdiv_scalar(const Tensor& a, double s);  // s / a
Tensor pow_scalar(const Tensor& a, double e);   // a ^ e

Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor sign(const Tensor& a);  // -1, 0 or 1

// Copies a into a new tensor of `shape` (NumPy broadcasting rules).
Tensor broadcast_to(const Tensor& a, const Shape& shape);
// In place: dst += alpha * src, same shape and device (gradient accumulation, SGD-style updates).
// dst is a handle: the write lands in its storage, so views such as flat.narrow(a, n) work.
// dst and src may differ in dtype; src is converted on the fly.
void add_(const Tensor& dst, const Tensor& src, double alpha = 1.0);
// In place: dst *= s.
void mul_scalar_(const Tensor& dst, double s);

}  // namespace octet::kernels
