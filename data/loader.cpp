#include "data/loader.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace octet::data {
namespace {

std::shared_ptr<const Dataset> require_dataset(std::shared_ptr<const Dataset> dataset) {
  OCTET_CHECK(dataset != nullptr, "DataLoader: the dataset is null; pass a loaded dataset");
  return dataset;
}

// Checked before the sampler is built, so that errors name the loader's options.
const LoaderOptions& require_valid(const LoaderOptions& options, const Dataset& dataset) {
  OCTET_CHECK(options.batch_size > 0, "DataLoader: batch_size is ", options.batch_size,
              "; it must be positive (items per rank per step)");
  OCTET_CHECK(options.threads >= 1, "DataLoader: threads is ", options.threads, "; use 1 or more");
  OCTET_CHECK(options.prefetch >= 0, "DataLoader: prefetch is ", options.prefetch,
              "; use 0 (no thread) or a positive number of batches");
  const int64_t global = options.batch_size * std::max(options.world_size, 1);
  OCTET_CHECK(!options.drop_last || dataset.size() >= global, "DataLoader: world_size ", options.world_size,
              " x batch_size ", options.batch_size, " = ", global, " items per global batch, but the dataset has only ",
              dataset.size(), ", not enough for one batch with drop_last; lower batch_size, use fewer ranks, or set "
              "drop_last = false");
  return options;
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : dataset_(require_dataset(std::move(dataset))),
      options_(require_valid(options, *dataset_)),
      sampler_(dataset_->size(), options_.rank, options_.world_size, options_.batch_size, options_.shuffle,
               options_.seed, options_.drop_last),
      batches_per_epoch_(sampler_.batches_per_epoch()),
      image_shape_(dataset_->image_shape()) {}

DataLoader::~DataLoader() { stop_worker(); }

DataLoader::State DataLoader::after(State at) const {
  return at.batch + 1 < batches_per_epoch_ ? State{at.epoch, at.batch + 1} : State{at.epoch + 1, 0};
}

Batch DataLoader::assemble(State at, const std::vector<int64_t>& order) const {
  // order holds this rank's batches back to back, all full but the last.
  const int64_t first = at.batch * options_.batch_size;
  const int64_t count = sampler_.batch_count(at.batch);
  Shape shape{count};
  shape.insert(shape.end(), image_shape_.begin(), image_shape_.end());
  Batch batch{empty(shape, DType::f32), empty({count}, DType::i64), at.epoch, at.batch};
  float* images = batch.images.data<float>();
  int64_t* labels = batch.labels.data<int64_t>();
  const int64_t image_numel = image_shape_.numel();
  // Exceptions may not leave an OpenMP region: each item keeps its own, and the first in batch
  // order is rethrown, so the error seen does not depend on the thread count.
  std::vector<std::exception_ptr> errors(static_cast<size_t>(count));
#pragma omp parallel for num_threads(options_.threads) schedule(static) if (options_.threads > 1)
  for (int64_t k = 0; k < count; ++k) {
    if (stop_.load(std::memory_order_relaxed)) continue;  // the loader is going away: stop promptly
    try {
      dataset_->get(order[first + k], images + k * image_numel, labels + k);
    } catch (...) {
      errors[k] = std::current_exception();
    }
  }
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  if (stop_) return {};
  return batch;
}

Batch DataLoader::next() {
  if (options_.prefetch == 0) {
    if (sync_order_epoch_ != next_.epoch) {
      sync_order_ = sampler_.indices(next_.epoch);
      sync_order_epoch_ = next_.epoch;
    }
    Batch batch = assemble(next_, sync_order_);
    next_ = after(next_);
    return batch;
  }
  if (!worker_.joinable()) start_worker();
  std::unique_lock lock(mutex_);
  has_batch_.wait(lock, [&] { return !queue_.empty(); });
  // A failed slot stays at the front, so every later call rethrows it too (the worker has stopped).
  if (queue_.front().error) std::rethrow_exception(queue_.front().error);
  Batch batch = std::move(queue_.front().batch);
  queue_.pop_front();
  next_ = after({batch.epoch, batch.index});
  lock.unlock();
  has_room_.notify_one();
  return batch;
}

DataLoader::State DataLoader::state() const {
  std::lock_guard lock(mutex_);
  return next_;
}

void DataLoader::set_state(State state) {
  OCTET_CHECK(state.epoch >= 0 && state.batch >= 0 && state.batch < batches_per_epoch_, "DataLoader::set_state: {",
              state.epoch, ", ", state.batch, "} is not a position of this loader (epoch >= 0, 0 <= batch < ",
              batches_per_epoch_, "); pass what state() returned for a loader with the same options");
  stop_worker();
  std::lock_guard lock(mutex_);
  queue_.clear();
  next_ = state;  // the worker restarts from here on the next call to next()
}

void DataLoader::start_worker() {
  stop_ = false;
  worker_ = std::thread([this, start = state()] { worker_loop(start); });
}

void DataLoader::stop_worker() {
  if (!worker_.joinable()) return;
  {
    // Raised under the lock so the worker cannot miss the notification between its check and its wait.
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  has_room_.notify_all();
  worker_.join();
  std::lock_guard lock(mutex_);
  queue_.clear();
}

void DataLoader::worker_loop(State at) {
  int64_t order_epoch = -1;
  std::vector<int64_t> order;
  while (true) {
    {
      std::unique_lock lock(mutex_);
      has_room_.wait(lock, [&] { return stop_ || static_cast<int64_t>(queue_.size()) < options_.prefetch; });
      if (stop_) return;
    }
    Slot slot;
    try {
      if (order_epoch != at.epoch) {
        order = sampler_.indices(at.epoch);
        order_epoch = at.epoch;
      }
      slot.batch = assemble(at, order);
    } catch (...) {
      slot.error = std::current_exception();
    }
    if (stop_) return;
    const bool failed = slot.error != nullptr;
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(slot));
    }
    has_batch_.notify_one();
    if (failed) return;
    at = after(at);
  }
}

}  // namespace octet::data
