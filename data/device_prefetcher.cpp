#include "data/device_prefetcher.h"

#if OCTET_HAS_CUDA
#include <cuda_runtime_api.h>

#include <array>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "core/cuda_stream.h"
#include "core/error.h"
#include "core/host_sync.h"

namespace octet::data {

// One of the two device buffers batches alternate through, reused only after the compute stream
// has passed the step that read it (`consumed`).
struct Slot {
  Tensor images, labels;        // on the device, [batch_size, ...]
  cuda::Event copied, consumed;  // never-recorded events count as complete
  int64_t count = 0, epoch = 0, index = 0;  // the batch held: its size and position
};

// One of the two pinned host buffers the worker fills, reused only after the last copy out of it
// has finished (`copied`).
struct PinnedBuffer {
  Tensor images, labels;  // page-locked host memory, [batch_size, ...]
  cuda::Event copied;
  int64_t count = 0, epoch = 0, index = 0;
};

struct DevicePrefetcher::Impl {
  DataLoader& loader;
  Device device;
  cudaStream_t copy_stream = nullptr;
  std::array<Slot, 2> slots;
  std::array<PinnedBuffer, 2> pinned;
  int staged = 0;  // the slot holding the batch next() returns next
  bool has_staged = false;
  DataLoader::State first{};          // the position of the batch next() returns first (no batch staged)
  std::exception_ptr staging_failed;  // why the last stage() failed: next() rethrows it

  // The worker and what it shares with next(), under `mutex`.
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<int> free_buffers;    // pinned buffers the worker may fill
  std::deque<int> filled_buffers;  // pinned buffers holding the next batches, in the loader's order
  std::exception_ptr worker_failed;  // after the filled buffers: the batch the worker could not read
  bool stopping = false;
  std::thread worker;

  Impl(DataLoader& loader, Device device) : loader(loader), device(device) {}

  // Fills free pinned buffers with the loader's batches, in order, until stopped or failed. Its
  // waits hold up no step (core/host_sync.h).
  void worker_loop() {
    const host_sync::HelperThreadScope helper;
    try {
      cuda::DeviceGuard guard(device.index);
      while (true) {
        int b = 0;
        {
          std::unique_lock lock(mutex);
          changed.wait(lock, [&] { return stopping || !free_buffers.empty(); });
          if (stopping) return;
          b = free_buffers.front();
          free_buffers.pop_front();
        }
        PinnedBuffer& p = pinned[static_cast<size_t>(b)];
        p.copied.synchronize();  // the last copy out of this buffer has left it
        const Batch host = loader.next();
        std::memcpy(p.images.data_ptr(), host.images.data_ptr(), host.images.nbytes());
        std::memcpy(p.labels.data_ptr(), host.labels.data_ptr(), host.labels.nbytes());
        p.count = host.labels.numel(), p.epoch = host.epoch, p.index = host.index;
        {
          std::lock_guard lock(mutex);
          filled_buffers.push_back(b);
        }
        changed.notify_all();
      }
    } catch (...) {
      {
        std::lock_guard lock(mutex);
        worker_failed = std::current_exception();
      }
      changed.notify_all();
    }
  }

  void start_worker() {
    free_buffers = {0, 1};
    filled_buffers.clear();
    worker_failed = nullptr;
    stopping = false;
    worker = std::thread([this] { worker_loop(); });
  }

  // Stops the worker once it is between batches (a loader.next() under way finishes first).
  void stop_worker() {
    if (!worker.joinable()) return;
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    changed.notify_all();
    worker.join();
  }

  // The worker's next filled buffer, waiting for it if need be; the worker's error once the buffers
  // it filled before failing are used up.
  int take_filled() {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return !filled_buffers.empty() || worker_failed; });
    if (filled_buffers.empty()) std::rethrow_exception(worker_failed);
    const int b = filled_buffers.front();
    filled_buffers.pop_front();
    return b;
  }

  // Starts the copy of the worker's next batch into slot k.
  void stage(int k) {
    const int b = take_filled();
    PinnedBuffer& p = pinned[static_cast<size_t>(b)];
    Slot& s = slots[static_cast<size_t>(k)];
    s.consumed.wait_on(copy_stream);  // the device buffer's last batch has been computed on
    const auto count = static_cast<size_t>(p.count);
    const size_t image_bytes = count * (p.images.nbytes() / static_cast<size_t>(p.images.size(0)));
    cuda::check(cudaMemcpyAsync(s.images.data_ptr(), p.images.data_ptr(), image_bytes, cudaMemcpyHostToDevice,
                                copy_stream),
                "DevicePrefetcher: cudaMemcpyAsync (images)");
    cuda::check(cudaMemcpyAsync(s.labels.data_ptr(), p.labels.data_ptr(), count * sizeof(int64_t),
                                cudaMemcpyHostToDevice, copy_stream),
                "DevicePrefetcher: cudaMemcpyAsync (labels)");
    s.copied.record(copy_stream);
    p.copied.record(copy_stream);
    s.count = p.count, s.epoch = p.epoch, s.index = p.index;
    staged = k;
    has_staged = true;
    {
      std::lock_guard lock(mutex);
      free_buffers.push_back(b);  // the worker refills it once this copy is done
    }
    changed.notify_all();
  }
};

DevicePrefetcher::DevicePrefetcher(DataLoader& loader, Device device) {
  OCTET_CHECK(device.is_cuda(), "DevicePrefetcher: device is ", device.str(),
              "; it copies batches to a GPU, read the DataLoader directly on the CPU");
  cuda::DeviceGuard guard(device.index);
  impl_ = std::make_unique<Impl>(loader, device);
  const int64_t batch_size = loader.options().batch_size;
  Shape image_shape{batch_size};
  for (int64_t d : loader.dataset().image_shape()) image_shape.push_back(d);
  for (Slot& s : impl_->slots) {
    s.images = empty(image_shape, DType::f32, device);
    s.labels = empty({batch_size}, DType::i64, device);
  }
  for (PinnedBuffer& p : impl_->pinned) {
    p.images = empty_pinned(image_shape, DType::f32);
    p.labels = empty_pinned({batch_size}, DType::i64);
  }
  // The device buffers were allocated on the compute stream: the copy stream may write them only
  // after that allocation.
  cuda::Event allocated;
  allocated.record(cuda::compute_stream(device.index));
  cuda::check(cudaStreamCreateWithFlags(&impl_->copy_stream, cudaStreamNonBlocking),
              "DevicePrefetcher: cudaStreamCreateWithFlags");
  allocated.wait_on(impl_->copy_stream);
  impl_->first = loader.state();
  impl_->start_worker();
}

DevicePrefetcher::~DevicePrefetcher() {
  if (!impl_) return;
  impl_->stop_worker();
  cuda::DeviceGuard guard(impl_->device.index);
  {
    const host_sync::Scope counted(host_sync::Kind::synchronize);
    cudaStreamSynchronize(impl_->copy_stream);
  }
  cudaStreamDestroy(impl_->copy_stream);
}

Batch DevicePrefetcher::next() {
  Impl& m = *impl_;
  if (m.staging_failed) std::rethrow_exception(m.staging_failed);
  cuda::DeviceGuard guard(m.device.index);
  const cudaStream_t compute = cuda::compute_stream(m.device.index);
  if (!m.has_staged) m.stage(0);
  const int current = m.staged;
  const int other = 1 - current;
  // Everything queued so far on the compute stream, the step that read the other slot's batch
  // included, has to finish before the copy below overwrites that slot.
  m.slots[static_cast<size_t>(other)].consumed.record(compute);
  Slot& s = m.slots[static_cast<size_t>(current)];
  s.copied.wait_on(compute);
  Batch batch{s.images.narrow(0, s.count), s.labels.narrow(0, s.count), s.epoch, s.index};
  try {
    m.stage(other);
  } catch (...) {
    // This batch is fine; the next call, which would return the one that failed, throws.
    m.has_staged = false;
    m.staging_failed = std::current_exception();
  }
  return batch;
}

DataLoader::State DevicePrefetcher::state() const {
  if (!impl_->has_staged) return impl_->first;
  const Slot& s = impl_->slots[static_cast<size_t>(impl_->staged)];
  return {s.epoch, s.index};
}

void DevicePrefetcher::set_state(DataLoader::State state) {
  Impl& m = *impl_;
  m.stop_worker();
  cuda::DeviceGuard guard(m.device.index);
  m.loader.set_state(state);
  // The next stage() overwrites a slot whose batch may still be read by queued work: mark both.
  for (Slot& s : m.slots) s.consumed.record(cuda::compute_stream(m.device.index));
  m.has_staged = false;
  m.staging_failed = nullptr;
  m.first = state;
  m.start_worker();
}

}  // namespace octet::data
#endif
