#pragma once
// Batches on a GPU, copied while the previous step computes (CUDA builds only: OCTET_HAS_CUDA).
//
// The loader's thread assembles batches in pageable host memory. The prefetcher's worker thread
// copies each, in the loader's order, into one of two pinned buffers, once the last copy out of that
// buffer has finished; that memcpy and that wait stay off the thread that calls next(). next() hands
// out batch k and then stages batch k+1: it takes the worker's next pinned buffer and queues a
// cudaMemcpyAsync from it into one of two device buffers, on a copy stream of its own. The compute
// stream waits on the copy's event (on the GPU, not the host) before the step that reads it, so the
// copy of batch k+1 runs beside step k's kernels. next() waits on the host only for a batch the
// worker has not finished: when the loader is slow, or when the host is about three batches ahead
// of the GPU (the worker then waits for a pinned buffer to be copied out), the back-pressure that
// keeps the host from running away from its device.
//
// An error of the loader or the worker (a dataset that throws, a failed CUDA call) is rethrown by
// next() at the batch it would have returned, and again on every later call; the worker stops at the
// first one, so nothing waits for it forever.
//
//   data::DevicePrefetcher batches(loader, Device::cuda(0));
//   for (...) {
//     const data::Batch batch = batches.next();  // images and labels on cuda:0
//     ... forward, backward, step ...
//   }
//
// A batch's tensors live in the prefetcher's device buffers and are overwritten by the copy of the
// batch two calls later, once the compute stream has passed the work queued before that call: use a
// batch within its step, or clone() what must outlive it.
#include "core/device.h"

#if OCTET_HAS_CUDA
#include <memory>

#include "data/loader.h"

namespace octet::data {

class DevicePrefetcher {
 public:
  // `loader` must outlive the prefetcher, which reads it from here on (call its next() no more).
  DevicePrefetcher(DataLoader& loader, Device device);
  ~DevicePrefetcher();  // stops the worker (after the batch it may be reading) and waits for copies in flight
  DevicePrefetcher(const DevicePrefetcher&) = delete;
  DevicePrefetcher& operator=(const DevicePrefetcher&) = delete;

  // The next batch on the device, ordered before everything queued on the device's compute stream
  // after this call.
  Batch next();
  // The position of the batch next() returns next (the loader itself runs one batch ahead).
  DataLoader::State state() const;
  // Continues from `state`: drops the staged batch and the worker's, and restarts the loader there.
  void set_state(DataLoader::State state);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace octet::data
#endif
