#include "data/sampler.h"

#include <algorithm>
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

DistributedSampler::DistributedSampler(int64_t size, int rank, int world, int64_t batch_size, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : size_(size), rank_(rank), world_(world), batch_size_(batch_size), shuffle_(shuffle), seed_(seed) {
  OCTET_CHECK(size_ > 0, "DistributedSampler: the dataset is empty (size ", size_, "); give it at least one item");
  OCTET_CHECK(world_ >= 1 && rank_ >= 0 && rank_ < world_, "DistributedSampler: rank ", rank_, " of world size ",
              world_, " is invalid; need world >= 1 and 0 <= rank < world");
  OCTET_CHECK(batch_size_ >= 1, "DistributedSampler: batch_size is ", batch_size_,
              "; it must be positive (items per rank per step)");
  const int64_t global = global_batch_size();
  batches_per_epoch_ = drop_last ? size_ / global : (size_ + global - 1) / global;
  OCTET_CHECK(batches_per_epoch_ > 0, "DistributedSampler: drop_last with world size ", world_, " and batch_size ",
              batch_size_, " needs one global batch of ", world_, " x ", batch_size_, " = ", global,
              " items, but the dataset has only ", size_, "; lower the batch size, use fewer ranks, or set drop_last = "
              "false");
  num_samples_ = (batches_per_epoch_ - 1) * batch_size_ + batch_count(batches_per_epoch_ - 1);
}

int64_t DistributedSampler::batch_count(int64_t batch) const {
  OCTET_CHECK(batch >= 0 && batch < batches_per_epoch_, "DistributedSampler::batch_count: batch ", batch,
              " is outside the epoch's ", batches_per_epoch_, " batches");
  // What is left of the order from this rank's slice of the global batch on, at most one slice:
  // B for every batch but a short last one, where ranks past the remainder get nothing.
  const int64_t first = batch * global_batch_size() + rank_ * batch_size_;
  return std::clamp<int64_t>(size_ - first, 0, batch_size_);
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
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t b = 0; b < batches_per_epoch_; ++b) {
    const int64_t count = batch_count(b);
    if (count == 0) continue;  // an empty last batch: its slice starts past the end of the order
    const int64_t first = b * global_batch_size() + rank_ * batch_size_;
    mine.insert(mine.end(), order.begin() + first, order.begin() + first + count);
  }
  return mine;
}

}  // namespace octet::data
