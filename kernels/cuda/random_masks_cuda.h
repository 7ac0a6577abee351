#pragma once
// CUDA implementation behind kernels/random_masks.h (plain C++: no CUDA types).
#include <cstdint>

#include "core/tensor.h"

namespace octet::kernels::cuda {

// Fills `mask` (allocated on its device, any dtype) on the device's current stream: the kept elements
// get the low bytes of `pattern`, the others 0.
void keep_mask(const Tensor& mask, double keep, uint64_t pattern, uint64_t seed, uint64_t offset);

}  // namespace octet::kernels::cuda
