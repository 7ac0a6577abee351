#pragma once
// Random masks drawn where they are used, from a generator's counter-based Philox stream
// (core/philox.h): on a GPU the mask never passes through the host, and the CPU and CUDA kernels
// draw the same mask from the same (seed, offset).
#include <cstdint>

#include "core/hostdevice.h"
#include "core/philox.h"
#include "core/tensor.h"

namespace octet::kernels {

// Element i of a keep mask: whether the uniform draw philox::uniform(word i) is below `keep`, the
// float draw compared with the double `keep`. Shared by the CPU and CUDA kernels.
OCTET_HD bool keep_draw(uint32_t word, double keep) { return static_cast<double>(philox::uniform(word)) < keep; }

// A tensor of `shape` and `dtype` on `device` with mask[i] = keep_draw(word_i, keep) ? value : 0, where
// word_i is word i % 4 of Philox block offset + i / 4 for generator seed `seed`: the words rand()
// draws from (seed, offset) (core/tensor.h), so the mask is exactly `rand(shape) < keep ? value : 0`
// computed on the device instead of on the host. `value` is rounded once to dtype, as from_vector
// rounds it; 0 is +0. Reserve offset with Generator::reserve_for(shape.numel()). Any dtype, with
// keep in [0, 1]. DropPath draws its per-sample masks with it.
Tensor keep_mask(const Shape& shape, double keep, double value, DType dtype, Device device, uint64_t seed,
                 uint64_t offset);

}  // namespace octet::kernels
