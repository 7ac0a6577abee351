#pragma once
// CUDA implementations behind kernels/optimizers.h (plain C++: no CUDA types). The entry points in
// kernels/optimizers.cpp have checked every tensor (shapes, dtypes, one CUDA device, no aliasing)
// and computed the per-step constants in double; the kernels round them once to f32 (f64 for f64
// parameters), as the CPU kernels do.
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/optimizers_cpu.h"
#include "kernels/optimizers.h"

namespace octet::kernels::cuda {

// One launch per group of entries sharing dtypes (param, grad, master or not), per 512 tensors; see
// optimizers.cu for the table of tensors the kernels take.
void adamw_step_multi_(const std::vector<AdamWTensors>& tensors, const cpu::AdamWConstants<double>& constants);
// momentum_buffer must be undefined in every entry when momentum is 0, defined in every entry otherwise.
void sgd_step_multi_(const std::vector<SgdTensors>& tensors, const cpu::SgdConstants<double>& constants);
// One launch per source dtype (bf16, f16) and 512 tensors; the entry point has checked the pairs.
void widen_to_f32_multi_(const std::vector<Tensor>& sources, const std::vector<Tensor>& destinations);
// Fixed chunks, block sums in double, a fixed-order final sum on the device, left there: a one-element
// f64 tensor on `device` (0 for an empty list).
Tensor sum_of_squares_multi(const std::vector<Tensor>& tensors, Device device);
// √sum_of_squares and the clip coefficient, by one single-thread kernel.
ClipScalars clip_scalars(const Tensor& sum_of_squares, double max_norm);
// One launch per dtype group and table; the kernels read the scale (f32 or f64) themselves.
void scale_multi_(const std::vector<Tensor>& tensors, const Tensor& scale);

}  // namespace octet::kernels::cuda
