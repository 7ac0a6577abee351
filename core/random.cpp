#include "core/random.h"

namespace octet {

void Generator::manual_seed(uint64_t seed) { set_state(seed, 0); }

void Generator::set_state(uint64_t seed, uint64_t offset) {
  std::lock_guard lock(mutex_);
  seed_ = seed;
  offset_ = offset;
}

uint64_t Generator::reserve(uint64_t blocks) {
  std::lock_guard lock(mutex_);
  const uint64_t first = offset_;
  offset_ += blocks;
  return first;
}

Generator& default_generator() {
  static Generator generator(0);
  return generator;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace octet
