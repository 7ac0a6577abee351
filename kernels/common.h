#pragma once
// What every kernel entry point shares: argument checks that name the op and the tensors, and the
// rule for which precision a CPU kernel computes in.
//
// Compute precision: f64 tensors compute in double; every other floating dtype is widened to f32,
// computed in f32 and rounded once on the way out. That is the exact emulation of bf16/FP8 storage
// the design asks for: operands are already rounded to their format, arithmetic is f32.
#include <initializer_list>
#include <string>

#include "core/tensor.h"

namespace octet::kernels {

// "a: f32[2, 3] on cpu, b: bf16[3] on cpu"
std::string describe_all(std::initializer_list<const Tensor*> tensors);

void check_defined(const char* op, std::initializer_list<const Tensor*> tensors);
void check_same_device(const char* op, std::initializer_list<const Tensor*> tensors);
void check_same_dtype(const char* op, std::initializer_list<const Tensor*> tensors);
void check_floating(const char* op, const Tensor& t);
void check_dim(const char* op, const Tensor& t, int64_t ndim);
// A LayerNorm's weight (and bias, which must match it) is f32 or of x's dtype, on every device: other
// pairs (a bf16 x with f16 weights) have no use, and the GPU kernels are not compiled for them.
void check_layernorm_weight_dtype(const char* op, const Tensor& x, const Tensor& weight);
// Refuses device tensors on the CPU path: inputs no CUDA kernel takes, or any device tensor in a
// CPU-only build (where kernels/cuda_stubs.cpp refuses most of them first).
void check_cpu(const char* op, std::initializer_list<const Tensor*> tensors);

// The dtype a CPU kernel computes in for storage dtype d: f64 for f64, f32 otherwise.
inline DType compute_dtype(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }
// t in its compute dtype (t itself when it already is).
inline Tensor to_compute(const Tensor& t) { return t.detach().to(compute_dtype(t.dtype())); }

// Calls f.template operator()<T>() with T = double for f64 and float for everything else.
template <class F>
decltype(auto) with_compute_type(DType d, F&& f) {
  if (d == DType::f64) return f.template operator()<double>();
  return f.template operator()<float>();
}

}  // namespace octet::kernels
