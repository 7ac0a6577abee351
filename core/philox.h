#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator. Each (key, counter) pair maps to four independent 32-bit words with no
// state to carry between them, so a CPU loop and a CUDA thread that compute element i from the
// same (seed, offset) get the same bits.
//
// Octet's convention (shared by every random op, CPU and CUDA):
//   key     = the generator's 64-bit seed, split into two 32-bit halves;
//   counter = a 64-bit block index in the low two words, the upper two words zero;
//   element i of an op that reserved blocks starting at `offset` uses block offset + i/4, word i%4.
#include <cstdint>

#include "core/hostdevice.h"

namespace octet::philox {

struct Words {
  uint32_t w[4];
};

OCTET_HD void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}

// Ten rounds of the Philox4x32 bijection, keyed by k0, k1.
OCTET_HD Words philox4x32_10(Words ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // key schedule increments
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, ctr.w[0], hi0, lo0);
    mulhilo(kMul1, ctr.w[2], hi1, lo1);
    ctr = Words{{hi1 ^ ctr.w[1] ^ k0, lo1, hi0 ^ ctr.w[3] ^ k1, lo0}};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return ctr;
}

// The four words of block `block` for generator seed `seed`.
OCTET_HD Words block_words(uint64_t seed, uint64_t block) {
  Words ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u}};
  return philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// A word to a float uniform in [0, 1): the top 24 bits, so every value is exactly representable.
OCTET_HD float uniform(uint32_t word) { return static_cast<float>(word >> 8) * (1.0f / 16777216.0f); }
// ... and in (0, 1], for logarithms.
OCTET_HD float uniform_open_zero(uint32_t word) { return (static_cast<float>(word >> 8) + 1.0f) * (1.0f / 16777216.0f); }

}  // namespace octet::philox
