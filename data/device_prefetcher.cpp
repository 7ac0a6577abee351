#include "data/device_prefetcher.h"

#if OCTET_HAS_CUDA
#include <cuda_runtime_api.h>

#include <array>
#include <cstring>

#include "core/cuda_stream.h"
#include "core/error.h"

namespace octet::data {

// One of the two buffers batches alternate through. Host and device halves are each reused only
// after the event that guards them: `copied` (the last copy out of the pinned buffer has finished)
// and `consumed` (the compute stream has passed the step that read the device buffer).
struct Slot {
  Tensor pinned_images, pinned_labels;  // page-locked host memory, [batch_size, ...]
  Tensor images, labels;                // on the device, [batch_size, ...]
  cuda::Event copied, consumed;         // never-recorded events count as complete
  int64_t count = 0, epoch = 0, index = 0;  // the batch held: its size and position
};

struct DevicePrefetcher::Impl {
  DataLoader& loader;
  Device device;
  cudaStream_t copy_stream = nullptr;
  std::array<Slot, 2> slots;
  int staged = 0;        // the slot holding the batch next() returns next
  bool has_staged = false;

  Impl(DataLoader& loader, Device device) : loader(loader), device(device) {}

  // Reads the loader's next batch into slot k and starts its copy to the device.
  void stage(int k) {
    const Batch host = loader.next();
    Slot& s = slots[static_cast<size_t>(k)];
    s.copied.synchronize();  // the pinned buffer's previous copy has left it
    const size_t image_bytes = host.images.nbytes(), label_bytes = host.labels.nbytes();
    std::memcpy(s.pinned_images.data_ptr(), host.images.data_ptr(), image_bytes);
    std::memcpy(s.pinned_labels.data_ptr(), host.labels.data_ptr(), label_bytes);
    s.consumed.wait_on(copy_stream);  // the device buffer's last batch has been computed on
    cuda::check(cudaMemcpyAsync(s.images.data_ptr(), s.pinned_images.data_ptr(), image_bytes,
                                cudaMemcpyHostToDevice, copy_stream),
                "DevicePrefetcher: cudaMemcpyAsync (images)");
    cuda::check(cudaMemcpyAsync(s.labels.data_ptr(), s.pinned_labels.data_ptr(), label_bytes,
                                cudaMemcpyHostToDevice, copy_stream),
                "DevicePrefetcher: cudaMemcpyAsync (labels)");
    s.copied.record(copy_stream);
    s.count = host.labels.numel(), s.epoch = host.epoch, s.index = host.index;
    staged = k;
    has_staged = true;
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
    s.pinned_images = empty_pinned(image_shape, DType::f32);
    s.pinned_labels = empty_pinned({batch_size}, DType::i64);
    s.images = empty(image_shape, DType::f32, device);
    s.labels = empty({batch_size}, DType::i64, device);
  }
  // The device buffers were allocated on the compute stream: the copy stream may write them only
  // after that allocation.
  cuda::Event allocated;
  allocated.record(cuda::compute_stream(device.index));
  cuda::check(cudaStreamCreateWithFlags(&impl_->copy_stream, cudaStreamNonBlocking),
              "DevicePrefetcher: cudaStreamCreateWithFlags");
  allocated.wait_on(impl_->copy_stream);
}

DevicePrefetcher::~DevicePrefetcher() {
  if (!impl_) return;
  cuda::DeviceGuard guard(impl_->device.index);
  cudaStreamSynchronize(impl_->copy_stream);
  cudaStreamDestroy(impl_->copy_stream);
}

Batch DevicePrefetcher::next() {
  Impl& m = *impl_;
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
  m.stage(other);
  return batch;
}

DataLoader::State DevicePrefetcher::state() const {
  if (!impl_->has_staged) return impl_->loader.state();
  const Slot& s = impl_->slots[static_cast<size_t>(impl_->staged)];
  return {s.epoch, s.index};
}

void DevicePrefetcher::set_state(DataLoader::State state) {
  Impl& m = *impl_;
  cuda::DeviceGuard guard(m.device.index);
  m.loader.set_state(state);
  // The next stage() overwrites a slot whose batch may still be read by queued work: mark both.
  for (Slot& s : m.slots) s.consumed.record(cuda::compute_stream(m.device.index));
  m.has_staged = false;
}

}  // namespace octet::data
#endif
