#pragma once
// Seeded random streams. A Generator is a Philox key (the seed) plus an offset counting the
// 128-bit blocks already handed out; each random op reserves the blocks it needs and computes
// element i from block offset + i/4 (core/philox.h). Re-seeding, or restoring (seed, offset),
// replays the stream exactly, on the CPU or, later, on the GPU.
#include <cstdint>
#include <mutex>

namespace octet {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}

  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void manual_seed(uint64_t seed);
  void set_state(uint64_t seed, uint64_t offset);
  // Reserves `blocks` blocks and returns the first; safe to call from several threads.
  uint64_t reserve(uint64_t blocks);
  // Reserves enough blocks for `n` values (four per block).
  uint64_t reserve_for(int64_t n) { return reserve((static_cast<uint64_t>(n) + 3) / 4); }

 private:
  std::mutex mutex_;
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
};

Generator& default_generator();
// Re-seeds the default generator (and resets its offset), like torch.manual_seed.
void manual_seed(uint64_t seed);

}  // namespace octet
