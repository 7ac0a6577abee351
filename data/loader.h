#pragma once
// Batches for a training or evaluation loop. A DataLoader reads this rank's share of each epoch
// (DistributedSampler: each global batch of world_size x batch_size items split in rank order)
// into batches of f32 images [B, C, H, W] and i64 labels [B], assembled by a background thread that
// stays up to `prefetch` batches ahead. It runs forever: after the last batch of epoch e, next()
// returns the first batch of e + 1. Every rank has the same batches_per_epoch(), and rank r's batch
// b, concatenated over the ranks in rank order, is batch b of a world-1 loader with batch size
// world_size x batch_size.
//
// Every batch is a pure function of (options, epoch, batch index), so state()/set_state() resume a
// run exactly: the batches after set_state(s) are bit for bit those an uninterrupted loader would
// have returned after reaching s. A state names a global batch, so it also carries over between
// rank layouts with the same world_size x batch_size (saved by 1 x 64, resumed by 2 x 32).
//
// Evaluation: shuffle = false, drop_last = false, and read exactly batches_per_epoch() batches. The
// last batch is short, and with several ranks it may be EMPTY on the higher ranks (images
// [0, C, H, W], labels [0]): every item is read once over all ranks, none twice. Skip empty batches
// and reduce sums and counts, not per-rank means, across ranks.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "data/dataset.h"
#include "data/sampler.h"

namespace octet::data {

struct Batch {
  Tensor images;  // f32 [B, C, H, W]; B may be below batch_size in an epoch's last batch, even 0
  Tensor labels;  // i64 [B]
  int64_t epoch = 0;
  int64_t index = 0;  // the batch's position in its epoch
};

struct LoaderOptions {
  int64_t batch_size = 128;  // per rank: a step reads world_size x batch_size items over all ranks
  bool shuffle = true;
  // Drops the epoch's last partial global batch, so every batch is full. Without it the last batch
  // is short (possibly empty on higher ranks); nothing is padded or read twice.
  bool drop_last = true;
  uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  int prefetch = 2;  // batches assembled ahead; 0 assembles each batch inside next(), with no thread
  // Threads that share the assembly of one batch (an OpenMP team inside the prefetch thread; the
  // batch does not depend on it). One is plenty for Fashion-MNIST (~0.1 ms per 128 images);
  // synthetic 3x224x224 images cost ~4 ms each per thread, so GPU throughput runs want several.
  int threads = 1;
};

class DataLoader {
 public:
  struct State {
    int64_t epoch = 0;
    int64_t batch = 0;  // the position of the NEXT batch next() returns
  };

  DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~DataLoader();  // stops the prefetch thread without waiting for the queue to drain
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next batch, crossing into the next epoch by itself. An exception raised while assembling
  // a batch (a dataset error) is rethrown here, in order, and again on every later call.
  Batch next();
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  State state() const;
  // Continue from `state` (from state(), possibly of another loader with the same options).
  void set_state(State state);

  const LoaderOptions& options() const { return options_; }
  const Dataset& dataset() const { return *dataset_; }
  const DistributedSampler& sampler() const { return sampler_; }

 private:
  struct Slot {
    Batch batch;
    std::exception_ptr error;
  };

  // The batch at `at`, with `order` this rank's indices for at.epoch. Returns early with an
  // undefined batch when stop_ is raised.
  Batch assemble(State at, const std::vector<int64_t>& order) const;
  State after(State at) const;
  void start_worker();
  void stop_worker();
  void worker_loop(State start);

  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions options_;
  DistributedSampler sampler_;
  int64_t batches_per_epoch_;  // the sampler's, the same on every rank
  Shape image_shape_;

  mutable std::mutex mutex_;
  std::condition_variable has_room_;   // the worker waits for the queue to shrink below `prefetch`
  std::condition_variable has_batch_;  // next() waits for the worker
  std::deque<Slot> queue_;
  std::atomic<bool> stop_{false};
  std::thread worker_;
  State next_;  // what next() returns next

  // For prefetch = 0: the order of the epoch last read, kept so each batch does not recompute it.
  int64_t sync_order_epoch_ = -1;
  std::vector<int64_t> sync_order_;
};

}  // namespace octet::data
