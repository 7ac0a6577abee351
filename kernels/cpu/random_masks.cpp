// Random masks on the CPU: element i from word i % 4 of Philox block offset + i / 4, as rand() draws
// it (kernels/random_masks.h). Each element depends on (seed, offset, i) alone, so any thread split
// gives the same mask.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/random_masks_cpu.h"
#include "kernels/random_masks.h"

namespace octet::kernels::cpu {
namespace {

constexpr int64_t kParallelWork = int64_t{1} << 15;

template <class W>
void keep_mask_as(W* out, int64_t n, double keep, W kept, uint64_t seed, uint64_t offset) {
  const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n > kParallelWork)
  for (int64_t b = 0; b < blocks; ++b) {
    const philox::Words words = philox::block_words(seed, offset + static_cast<uint64_t>(b));
    const int64_t end = std::min<int64_t>(4, n - 4 * b);
    for (int64_t k = 0; k < end; ++k) out[4 * b + k] = keep_draw(words.w[k], keep) ? kept : W(0);
  }
}

}  // namespace

void keep_mask(void* out, size_t element_size, int64_t n, double keep, uint64_t pattern, uint64_t seed,
               uint64_t offset) {
  // The value's bytes, as an unsigned word of the element's width (little-endian: the low bytes).
  switch (element_size) {
    case 1: return keep_mask_as(static_cast<uint8_t*>(out), n, keep, static_cast<uint8_t>(pattern), seed, offset);
    case 2: return keep_mask_as(static_cast<uint16_t*>(out), n, keep, static_cast<uint16_t>(pattern), seed, offset);
    case 4: return keep_mask_as(static_cast<uint32_t*>(out), n, keep, static_cast<uint32_t>(pattern), seed, offset);
    case 8: return keep_mask_as(static_cast<uint64_t*>(out), n, keep, pattern, seed, offset);
    default: OCTET_FAIL("keep_mask: no mask for ", element_size, "-byte elements");
  }
}

}  // namespace octet::kernels::cpu
