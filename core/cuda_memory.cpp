#include "core/cuda_memory.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "core/error.h"

#if OCTET_HAS_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_stream.h"
#endif

namespace octet {

#if OCTET_HAS_CUDA

namespace cuda {
bool is_available() { return device_count() > 0; }
int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error so later calls start clean
    return 0;
  }
  return count;
}
}  // namespace cuda

namespace cuda_memory {

namespace {
constexpr int kMaxDevices = 64;

// Octet's own count of bytes in live tensors: the pool's "used" attribute also counts blocks
// whose free is queued but not yet reached by the stream.
struct Counters {
  std::atomic<size_t> in_use{0};
  std::atomic<size_t> peak{0};
};
std::array<Counters, kMaxDevices> counters;

void note_allocation(int device_index, size_t nbytes) {
  Counters& c = counters[device_index];
  const size_t now = c.in_use.fetch_add(nbytes) + nbytes;
  size_t peak = c.peak.load();
  while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
  }
}

// On first use of a device: keep freed memory in the pool for good (release threshold = max), so
// a training step's allocations are served from the pool instead of the driver.
void configure_pool(int device_index) {
  static std::array<std::once_flag, kMaxDevices> configured;
  std::call_once(configured[device_index], [device_index] {
    cudaMemPool_t pool = nullptr;
    cuda::check(cudaDeviceGetDefaultMemPool(&pool, device_index), "cudaDeviceGetDefaultMemPool");
    uint64_t threshold = UINT64_MAX;
    cuda::check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
                "cudaMemPoolSetAttribute(ReleaseThreshold)");
  });
}

void check_device(int device_index) {
  const int count = cuda::device_count();
  OCTET_CHECK(device_index >= 0 && device_index < count && device_index < kMaxDevices, "cuda:", device_index,
              ": this machine has ", count, " CUDA device(s); pick one of cuda:0..cuda:", count - 1);
}
}  // namespace

void* allocate(size_t nbytes, int device_index) {
  check_device(device_index);
  configure_pool(device_index);
  cuda::DeviceGuard guard(device_index);
  void* ptr = nullptr;
  const cudaError_t status = cudaMallocAsync(&ptr, nbytes == 0 ? 1 : nbytes, cuda::current_stream(device_index));
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    const MemoryStats s = memory_stats(device_index);
    OCTET_FAIL("out of memory on cuda:", device_index, " allocating ", nbytes, " bytes (", s.in_use,
               " bytes in use, ", s.reserved, " reserved); use a smaller batch size or model");
  }
  cuda::check(status, "cudaMallocAsync");
  note_allocation(device_index, nbytes);
  return ptr;
}

void release(void* ptr, size_t nbytes, int device_index) noexcept {
  cuda::DeviceGuard guard(device_index);
  cudaFreeAsync(ptr, cuda::current_stream(device_index));
  counters[device_index].in_use.fetch_sub(nbytes);
}

void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  const int index = dst_device.is_cuda() ? dst_device.index : src_device.index;
  cuda::DeviceGuard guard(index);
  cudaStream_t stream = cuda::current_stream(index);
  cuda::check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
  // Device to device stays ordered on the stream like any kernel; a copy with a host side waits,
  // because the host buffer may be pageable memory that the caller reads or frees next.
  if (dst_device.is_cpu() || src_device.is_cpu()) {
    cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize after a copy");
  }
}

void* allocate_pinned(size_t nbytes) {
  void* ptr = nullptr;
  cuda::check(cudaMallocHost(&ptr, nbytes == 0 ? 1 : nbytes), "cudaMallocHost (pinned host memory)");
  return ptr;
}

void release_pinned(void* ptr) noexcept { cudaFreeHost(ptr); }

MemoryStats memory_stats(int device_index) {
  check_device(device_index);
  MemoryStats s;
  s.in_use = counters[device_index].in_use.load();
  s.peak = counters[device_index].peak.load();
  cudaMemPool_t pool = nullptr;
  cuda::check(cudaDeviceGetDefaultMemPool(&pool, device_index), "cudaDeviceGetDefaultMemPool");
  uint64_t value = 0;
  cuda::check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &value), "cudaMemPoolGetAttribute");
  s.reserved = value;
  cuda::check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &value), "cudaMemPoolGetAttribute");
  s.reserved_peak = value;
  return s;
}

void reset_peak_memory_stats(int device_index) {
  check_device(device_index);
  counters[device_index].peak.store(counters[device_index].in_use.load());
  cudaMemPool_t pool = nullptr;
  cuda::check(cudaDeviceGetDefaultMemPool(&pool, device_index), "cudaDeviceGetDefaultMemPool");
  uint64_t zero = 0;  // the only value the driver accepts: resets the high-water mark to "current"
  cuda::check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero), "cudaMemPoolSetAttribute");
}

}  // namespace cuda_memory

#else  // CPU-only build

namespace {
[[noreturn]] void no_cuda(const char* what) {
  OCTET_FAIL(what, ": Octet was built without CUDA (OCTET_CUDA=OFF). Put nvcc on PATH and reconfigure, "
                   "or keep the tensor on the cpu device.");
}
}  // namespace

namespace cuda {
bool is_available() { return false; }
int device_count() { return 0; }
}  // namespace cuda

namespace cuda_memory {
void* allocate(size_t, int) { no_cuda("allocate on a CUDA device"); }
void release(void*, size_t, int) noexcept {}
void copy(void*, Device, const void*, Device, size_t) { no_cuda("copy to or from a CUDA device"); }
void* allocate_pinned(size_t) { no_cuda("allocate pinned host memory"); }
void release_pinned(void*) noexcept {}
MemoryStats memory_stats(int) { return {}; }
void reset_peak_memory_stats(int) {}
}  // namespace cuda_memory

#endif

}  // namespace octet
