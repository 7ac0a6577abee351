// data::DevicePrefetcher on the GPU: every batch arrives as the loader assembled it, and a batch is
// not overwritten while work that reads it is still queued.
//
// The contract (data/device_prefetcher.h): next() returns batch k from one of two device buffers and
// stages batch k+1 into the other; the copy of batch k+2, made during the call that returns k+1,
// goes into batch k's buffer, and may start only once the compute stream has passed everything
// queued on it before that call. So work queued on the compute stream before the call that returns
// k+1 must see batch k intact, however late it runs. The test holds batch k in exactly that way: a
// kernel that waits for the host's signal, then a copy of batch k, both queued before two more
// next() calls; only after them (and a pause long enough for any DMA) does the host let the kernel
// finish. A prefetcher whose copy did not wait for the compute stream would overwrite the buffer
// during the wait, and the copy would read batch k+2. The verdict does not depend on the machine's
// speed: a correct prefetcher passes however long anything takes (the kernel also stops waiting on
// its own after a long bound, which can only hide a bug, never fail a correct prefetcher).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <thread>
#include <vector>

#include "core/cuda_stream.h"
#include "core/device.h"
#include "data/device_prefetcher.h"
#include "data/loader.h"
#include "data/synthetic.h"
#include "tests/cuda/cuda_testing.h"

namespace octet {
namespace {

using testing::kGpu;

// Spins until the host sets *go (mapped pinned memory) or about `max_cycles` clock cycles pass, and
// records which of the two ended the wait.
__global__ void wait_for_host(const volatile int* go, long long max_cycles, int* timed_out) {
  const long long start = clock64();
  while (*go == 0) {
    if (clock64() - start > max_cycles) {
      *timed_out = 1;
      return;
    }
    __nanosleep(1000);
  }
  *timed_out = 0;
}

// A flag the host sets and a kernel reads. Set on destruction too, so that no early return of a
// failing test leaves the kernel waiting.
class HostSignal {
 public:
  HostSignal() {
    octet::cuda::check(cudaHostAlloc(reinterpret_cast<void**>(&flag_), sizeof(int), cudaHostAllocMapped),
                       "cudaHostAlloc");
    *flag_ = 0;
    octet::cuda::check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flag_), flag_, 0),
                       "cudaHostGetDevicePointer");
  }
  ~HostSignal() {
    send();
    cudaDeviceSynchronize();
    cudaFreeHost(flag_);
  }
  HostSignal(const HostSignal&) = delete;
  HostSignal& operator=(const HostSignal&) = delete;
  const volatile int* device_flag() const { return device_flag_; }
  void send() { *static_cast<volatile int*>(flag_) = 1; }

 private:
  int* flag_ = nullptr;
  int* device_flag_ = nullptr;
};

struct HostBatch {
  std::vector<float> images;
  std::vector<int64_t> labels;
};

// Batch `index` of `epoch` as the loader must assemble it: the sampler's indices for that epoch, each
// item read from the dataset itself.
HostBatch expected_batch(const data::DataLoader& loader, int64_t epoch, int64_t index) {
  const data::DistributedSampler& sampler = loader.sampler();
  const std::vector<int64_t> order = sampler.indices(epoch);
  const int64_t first = index * sampler.batch_size(), count = sampler.batch_count(index);
  const int64_t image_numel = loader.dataset().image_shape().numel();
  HostBatch b{std::vector<float>(static_cast<size_t>(count * image_numel)), std::vector<int64_t>(count)};
  for (int64_t i = 0; i < count; ++i) {
    loader.dataset().get(order[first + i], &b.images[i * image_numel], &b.labels[i]);
  }
  return b;
}

// A device tensor's bytes equal the expected host values.
::testing::AssertionResult same_as(const Tensor& device_or_host, const void* expected, size_t bytes) {
  const Tensor host = device_or_host.to(Device::cpu());
  if (host.nbytes() != bytes) {
    return ::testing::AssertionFailure() << host.describe() << " holds " << host.nbytes() << " bytes, expected "
                                         << bytes;
  }
  if (std::memcmp(host.data_ptr(), expected, bytes) != 0) {
    return ::testing::AssertionFailure() << host.describe() << " differs from the batch it should hold";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult holds_batch(const Tensor& images, const Tensor& labels, const HostBatch& want) {
  ::testing::AssertionResult r = same_as(images, want.images.data(), want.images.size() * sizeof(float));
  if (!r) return r << " (images)";
  r = same_as(labels, want.labels.data(), want.labels.size() * sizeof(int64_t));
  if (!r) return r << " (labels)";
  return ::testing::AssertionSuccess();
}

std::shared_ptr<data::SyntheticImages> small_images(int64_t size) {
  return data::make_synthetic(size, Shape({3, 64, 64}), 10, 17);
}

TEST(CudaDevicePrefetcher, DeliversEveryBatchAsTheLoaderAssemblesIt) {
  SKIP_WITHOUT_GPU();
  // 5 batches of 8 per epoch (drop_last keeps them full), shuffled: 12 calls cross two epoch ends.
  data::DataLoader loader(small_images(43), {.batch_size = 8, .shuffle = true, .seed = 5, .prefetch = 2});
  data::DevicePrefetcher prefetcher(loader, kGpu);
  const cudaStream_t compute = octet::cuda::compute_stream(0);
  for (int call = 0; call < 12; ++call) {
    SCOPED_TRACE(::testing::Message() << "call " << call);
    const data::Batch batch = prefetcher.next();
    EXPECT_EQ(batch.epoch, call / 5);
    EXPECT_EQ(batch.index, call % 5);
    EXPECT_TRUE(batch.images.is_cuda());
    EXPECT_EQ(batch.images.shape(), Shape({8, 3, 64, 64}));
    ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
    EXPECT_TRUE(holds_batch(batch.images, batch.labels, expected_batch(loader, batch.epoch, batch.index)));
  }
}

TEST(CudaDevicePrefetcher, ABatchStaysIntactForWorkQueuedBeforeTheNextCall) {
  SKIP_WITHOUT_GPU();
  // 16 images of 3·64·64 f32: 786 KB a batch, one DMA of a fraction of a millisecond.
  data::DataLoader loader(small_images(160), {.batch_size = 16, .shuffle = true, .seed = 9, .prefetch = 2});
  data::DevicePrefetcher prefetcher(loader, kGpu);
  const cudaStream_t compute = octet::cuda::compute_stream(0);
  const Device gpu = kGpu;

  prefetcher.next();                                  // batch 0 (slot A); batch 1 staged into slot B
  const data::Batch held = prefetcher.next();         // batch 1 (slot B); batch 2 staged into slot A
  ASSERT_EQ(held.index, 1);
  // Everything the test writes to, allocated before the wait: nothing may be allocated or freed on
  // the device while the kernel waits (without a memory pool a free waits for the device).
  const Tensor held_images = empty(held.images.shape(), DType::f32, gpu);
  const Tensor held_labels = empty(held.labels.shape(), DType::i64, gpu);
  const Tensor second_images = empty(held.images.shape(), DType::f32, gpu);
  const Tensor third_images = empty(held.images.shape(), DType::f32, gpu);
  const Tensor timed_out = zeros({1}, DType::i32, gpu);

  HostSignal go;
  // The late reader of batch 1: wait for the host, then copy the batch, all on the compute stream.
  wait_for_host<<<1, 1, 0, compute>>>(go.device_flag(), 100'000'000'000LL, static_cast<int*>(timed_out.data_ptr()));
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(held_images.data_ptr(), held.images.data_ptr(), held.images.nbytes(),
                            cudaMemcpyDeviceToDevice, compute),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(held_labels.data_ptr(), held.labels.data_ptr(), held.labels.nbytes(),
                            cudaMemcpyDeviceToDevice, compute),
            cudaSuccess);

  // Batch 2 (slot A), staging batch 3 into slot B, batch 1's buffer: that copy must wait for the
  // reader above. Batch 2 itself is read (late too) before the next call.
  const data::Batch second = prefetcher.next();
  ASSERT_EQ(second.index, 2);
  ASSERT_EQ(second.images.nbytes(), second_images.nbytes());
  ASSERT_EQ(cudaMemcpyAsync(second_images.data_ptr(), second.images.data_ptr(), second.images.nbytes(),
                            cudaMemcpyDeviceToDevice, compute),
            cudaSuccess);
  // Batch 3 (slot B, once its copy is in), staging batch 4 into slot A after the copy of batch 2.
  const data::Batch third = prefetcher.next();
  ASSERT_EQ(third.index, 3);

  // An unordered copy into slot A or B would have landed by now.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  go.send();
  ASSERT_EQ(third.images.nbytes(), third_images.nbytes());
  ASSERT_EQ(cudaMemcpyAsync(third_images.data_ptr(), third.images.data_ptr(), third.images.nbytes(),
                            cudaMemcpyDeviceToDevice, compute),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  if (timed_out.to(Device::cpu()).item() != 0) {
    std::cout << "note: the waiting kernel stopped on its own bound before the host's signal, so this run could "
                 "not have caught an early overwrite\n";
  }

  EXPECT_TRUE(holds_batch(held_images, held_labels, expected_batch(loader, held.epoch, held.index)))
      << "batch 1 was overwritten before the work queued on it ran";
  const HostBatch want_second = expected_batch(loader, second.epoch, second.index);
  EXPECT_TRUE(same_as(second_images, want_second.images.data(), want_second.images.size() * sizeof(float)))
      << "batch 2 was overwritten before the work queued on it ran";
  const HostBatch want_third = expected_batch(loader, third.epoch, third.index);
  EXPECT_TRUE(same_as(third_images, want_third.images.data(), want_third.images.size() * sizeof(float)))
      << "batch 3 was not in place for work queued after the call that returned it";
}

}  // namespace
}  // namespace octet
