#pragma once
// Which dataset indices each rank reads in an epoch, chosen so that data parallelism does not
// change what is trained on: N ranks with B items each read, step for step, exactly the items that
// one process with N·B items reads.
//
// The epoch's order is random_permutation(size, seed, epoch) (or 0, 1, ..., size - 1 without
// shuffle), the same on every rank. It is cut into global batches of world·B consecutive positions,
// and each global batch is dealt in B-slices in rank order: rank r's batch b is the positions
//     [b·world·B + r·B, b·world·B + (r + 1)·B)
// of that order. Concatenating ranks 0, ..., N-1's batch b gives batch b of a world-1 sampler with
// batch size N·B, in the same order. At world 1 this is the order cut into consecutive batches of B.
//
// Every rank has the same number of batches per epoch, so collectives inside a step never wait on a
// rank that has run out:
// - drop_last = true (training): floor(size / (world·B)) batches, all full; the last size mod
//   (world·B) positions of the order are not read that epoch (a new permutation next epoch).
// - drop_last = false (evaluation): ceil(size / (world·B)) batches, with no padding and no
//   duplicates. The last global batch holds the remainder R = size - (batches - 1)·world·B, dealt in
//   B-slices in rank order, so rank r's last batch has clamp(R - r·B, 0, B) items and may be EMPTY.
//   Every item is read exactly once over all ranks; callers skip empty batches (and reduce counts,
//   not means, across ranks).
#include <cstdint>
#include <vector>

namespace octet::data {

class DistributedSampler {
 public:
  // batch_size is B, the items per rank per step. Throws when the rank is outside [0, world), when
  // batch_size < 1, for an empty dataset, and with drop_last when the dataset holds less than one
  // global batch (world·B items), since every epoch would then be empty.
  DistributedSampler(int64_t size, int rank, int world, int64_t batch_size, bool shuffle, uint64_t seed,
                     bool drop_last);

  // This rank's dataset indices for `epoch`, num_samples() of them, batch after batch: batch b is
  // the batch_count(b) entries from b·batch_size() on (every batch but the last is full).
  std::vector<int64_t> indices(int64_t epoch) const;
  // The same on every rank.
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  // Items in this rank's batch `batch` (0 <= batch < batches_per_epoch()): batch_size(), except the
  // last batch with drop_last = false, which holds 0 to batch_size() items.
  int64_t batch_count(int64_t batch) const;
  // This rank's items per epoch: the sum of batch_count over the epoch's batches.
  int64_t num_samples() const { return num_samples_; }
  int64_t batch_size() const { return batch_size_; }
  int64_t global_batch_size() const { return batch_size_ * world_; }

 private:
  int64_t size_;
  int rank_, world_;
  int64_t batch_size_;
  bool shuffle_;
  uint64_t seed_;
  int64_t batches_per_epoch_;
  int64_t num_samples_;
};

// A permutation of [0, n) that depends only on (seed, epoch): Fisher-Yates driven by Philox (key =
// seed, counter = (step, epoch)), so every platform and standard library produces the same order.
std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace octet::data
