#pragma once
// Which dataset indices each rank reads in an epoch, as PyTorch's DistributedSampler: one
// permutation per epoch seeded by (seed, epoch), the same on every rank, padded by wrapping around
// to a multiple of the world size (or trimmed to one, with drop_last), then dealt out interleaved:
// rank r takes positions r, r + world, r + 2·world, ... So the shards are disjoint and, without
// padding, cover the dataset exactly once.
#include <cstdint>
#include <vector>

namespace octet::data {

class DistributedSampler {
 public:
  DistributedSampler(int64_t size, int rank, int world, bool shuffle, uint64_t seed, bool drop_last);

  // This rank's indices for `epoch`, num_samples() of them.
  std::vector<int64_t> indices(int64_t epoch) const;
  // Indices per rank: ceil(size / world), or floor(size / world) with drop_last.
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return num_samples_ * world_; }  // over all ranks, padding included

 private:
  int64_t size_;
  int rank_, world_;
  bool shuffle_;
  uint64_t seed_;
  int64_t num_samples_;
};

// A permutation of [0, n) that depends only on (seed, epoch): Fisher-Yates driven by Philox (key =
// seed, counter = (step, epoch)), so every platform and standard library produces the same order.
std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace octet::data
