// Random masks on the GPU, with the CPU kernel's draws (kernels/cpu/random_masks.cpp): element i from
// word i % 4 of Philox block offset + i / 4 (core/philox.h, shared source) and keep_draw's comparison
// (kernels/random_masks.h), so both devices draw the same mask. Each thread handles the four elements
// of one Philox block. Bytes per element: writes the mask (its element size); reads nothing.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/random_masks_cuda.h"
#include "kernels/random_masks.h"

namespace octet::kernels::cuda {
namespace {

template <class W>
__global__ void keep_mask_kernel(W* __restrict__ out, int64_t n, double keep, W kept, uint64_t seed,
                                 uint64_t offset) {
  for_each_philox_word(n, seed, offset, [&](int64_t i, uint32_t word) { out[i] = keep_draw(word, keep) ? kept : W(0); });
}

template <class W>
void launch(const Tensor& mask, double keep, uint64_t pattern, uint64_t seed, uint64_t offset) {
  const int64_t n = mask.numel();
  keep_mask_kernel<W><<<blocks_for((n + 3) / 4), kThreads, 0, stream_for(mask)>>>(
      static_cast<W*>(mask.data_ptr()), n, keep, static_cast<W>(pattern), seed, offset);
  check_launch("keep_mask");
}

}  // namespace

void keep_mask(const Tensor& mask, double keep, uint64_t pattern, uint64_t seed, uint64_t offset) {
  switch (mask.element_size()) {
    case 1: return launch<uint8_t>(mask, keep, pattern, seed, offset);
    case 2: return launch<uint16_t>(mask, keep, pattern, seed, offset);
    case 4: return launch<uint32_t>(mask, keep, pattern, seed, offset);
    case 8: return launch<uint64_t>(mask, keep, pattern, seed, offset);
    default: OCTET_FAIL("keep_mask: no mask for ", mask.element_size(), "-byte elements (", mask.describe(), ")");
  }
}

}  // namespace octet::kernels::cuda
