#pragma once
// CPU implementation behind kernels/random_masks.h.
#include <cstddef>
#include <cstdint>

namespace octet::kernels::cpu {

// out[i] = keep_draw(word_i, keep) ? the low element_size bytes of `pattern` : 0, for i < n.
void keep_mask(void* out, size_t element_size, int64_t n, double keep, uint64_t pattern, uint64_t seed,
               uint64_t offset);

}  // namespace octet::kernels::cpu
