#include "data/sampler.h"

#include <numeric>
#include <utility>

#include "core/error.h"
#include "core/philox.h"

namespace octet::data {

std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  OCTET_CHECK(n >= 0, "random_permutation: n is ", n, "; it must be non-negative");
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  const auto k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  const auto e = static_cast<uint64_t>(epoch);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto step = static_cast<uint64_t>(i);
    const philox::Words w = philox::philox4x32_10({{static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32),
                                                    static_cast<uint32_t>(e), static_cast<uint32_t>(e >> 32)}},
                                                  k0, k1);
    // j uniform in [0, i]: the high half of a 64-bit random number times (i + 1). The bias is at
    // most (i + 1) / 2^64, far below anything a training run could notice.
    const uint64_t r = (uint64_t{w.w[0]} << 32) | w.w[1];
    const auto j = static_cast<int64_t>((static_cast<unsigned __int128>(r) * (step + 1)) >> 64);
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

DistributedSampler::DistributedSampler(int64_t size, int rank, int world, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : size_(size), rank_(rank), world_(world), shuffle_(shuffle), seed_(seed) {
  OCTET_CHECK(size_ > 0, "DistributedSampler: the dataset is empty (size ", size_, "); give it at least one item");
  OCTET_CHECK(world_ >= 1 && rank_ >= 0 && rank_ < world_, "DistributedSampler: rank ", rank_, " of world size ",
              world_, " is invalid; need world >= 1 and 0 <= rank < world");
  num_samples_ = drop_last ? size_ / world_ : (size_ + world_ - 1) / world_;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  OCTET_CHECK(epoch >= 0, "DistributedSampler: epoch ", epoch, " is negative");
  std::vector<int64_t> order;
  if (shuffle_) {
    order = random_permutation(size_, seed_, epoch);
  } else {
    order.resize(static_cast<size_t>(size_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  // Position p of the padded (or trimmed) order is order[p mod size]: padding wraps around, as
  // many times as needed when the world is larger than the dataset.
  std::vector<int64_t> mine(static_cast<size_t>(num_samples_));
  for (int64_t k = 0; k < num_samples_; ++k) mine[k] = order[(rank_ + k * world_) % size_];
  return mine;
}

}  // namespace octet::data
