#include "core/cuda_memory.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

#include "core/error.h"
#include "core/host_sync.h"

#if OCTET_HAS_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_stream.h"
#include "core/log.h"
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

// How a device's blocks are allocated, decided once per device on first use.
enum Allocator : int { kUndecided = 0, kPool, kPlain };
std::array<std::atomic<int>, kMaxDevices> allocators{};

bool pool_disabled_by_environment() {
  const char* value = std::getenv("OCTET_NO_CUDA_MEMORY_POOL");
  return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
}

// Whether the device's blocks come from its stream-ordered pool. On first use of a device: with
// pools (cudaDevAttrMemoryPoolsSupported), keep freed memory in the pool for good (release
// threshold = max), so a training step's allocations are served from the pool instead of the
// driver. Without them (some virtualised GPUs and older drivers), or when
// OCTET_NO_CUDA_MEMORY_POOL=1 asks for it, blocks come from cudaMalloc and go back with cudaFree:
// nothing is cached, and cudaFree waits for the device's queued work, so a free is still ordered
// after the kernels that use the block, at the cost of a host wait per free.
bool uses_pool(int device_index) {
  static std::array<std::once_flag, kMaxDevices> decided;
  std::call_once(decided[device_index], [device_index] {
    int supported = 0;
    cuda::check(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device_index),
                "cudaDeviceGetAttribute(cudaDevAttrMemoryPoolsSupported)");
    if (supported == 0 || pool_disabled_by_environment()) {
      if (supported == 0) {
        logging::warn("cuda:{} has no stream-ordered memory pool (cudaMallocAsync), so Octet allocates with "
                      "cudaMalloc and frees with cudaFree: nothing is cached and every free waits for the device, "
                      "which slows training; a driver and GPU that support memory pools (CUDA 11.2 or newer) "
                      "avoid this",
                      device_index);
      } else {
        logging::info("OCTET_NO_CUDA_MEMORY_POOL is set: cuda:{} allocates with cudaMalloc and frees with cudaFree "
                      "(no pool, no caching)",
                      device_index);
      }
      allocators[device_index].store(kPlain);
      return;
    }
    cudaMemPool_t pool = nullptr;
    cuda::check(cudaDeviceGetDefaultMemPool(&pool, device_index), "cudaDeviceGetDefaultMemPool");
    uint64_t threshold = UINT64_MAX;
    cuda::check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
                "cudaMemPoolSetAttribute(ReleaseThreshold)");
    allocators[device_index].store(kPool);
  });
  return allocators[device_index].load() == kPool;
}

// Reports a block release() could not give back. Never throws: release runs in destructors. The
// error is cleared from the runtime's last-error slot, or the next kernel launch's check would
// report it as its own. At exit the runtime or context may already be gone, and with it every
// block: that is not worth a line. Only the first failure per device is logged, since after a
// fault every free fails.
void report_release_failure(const void* ptr, size_t nbytes, int device_index, const char* call,
                            cudaError_t status) noexcept {
  cudaGetLastError();
  if (status == cudaErrorCudartUnloading || status == cudaErrorContextIsDestroyed) return;
  static std::array<std::atomic<bool>, kMaxDevices> reported{};
  if (device_index >= 0 && device_index < kMaxDevices && reported[device_index].exchange(true)) return;
  try {
    logging::error("cuda:{}: freeing {} bytes at {} failed in {}: {} ({}); the block stays allocated (further "
                   "failures to free on this device are not logged)",
                   device_index, nbytes, ptr, call, cudaGetErrorName(status), cudaGetErrorString(status));
  } catch (...) {
  }
}

void check_device(int device_index) {
  const int count = cuda::device_count();
  OCTET_CHECK(device_index >= 0 && device_index < count && device_index < kMaxDevices, "cuda:", device_index,
              ": this machine has ", count, " CUDA device(s); pick one of cuda:0..cuda:", count - 1);
}
}  // namespace

void* allocate(size_t nbytes, int device_index) {
  check_device(device_index);
  const bool pool = uses_pool(device_index);
  cuda::DeviceGuard guard(device_index);
  void* ptr = nullptr;
  const size_t bytes = nbytes == 0 ? 1 : nbytes;
  const cudaError_t status =
      pool ? cudaMallocAsync(&ptr, bytes, cuda::current_stream(device_index)) : cudaMalloc(&ptr, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    const MemoryStats s = memory_stats(device_index);
    OCTET_FAIL("out of memory on cuda:", device_index, " allocating ", nbytes, " bytes (", s.in_use,
               " bytes in use, ", s.reserved, " reserved); use a smaller batch size or model");
  }
  cuda::check(status, pool ? "cudaMallocAsync" : "cudaMalloc");
  note_allocation(device_index, nbytes);
  return ptr;
}

// Raw runtime calls with their error codes instead of DeviceGuard and cuda::check, which throw: a
// failure here is logged, never thrown (a throw out of a destructor would end the program).
void release(void* ptr, size_t nbytes, int device_index) noexcept {
  if (device_index < 0 || device_index >= kMaxDevices) {
    report_release_failure(ptr, nbytes, device_index, "release (no such device)", cudaErrorInvalidDevice);
    return;
  }
  // The tensor is gone whatever the driver answers below.
  counters[device_index].in_use.fetch_sub(nbytes);
  int previous = -1;
  cudaError_t status = cudaGetDevice(&previous);
  const char* call = "cudaGetDevice";
  if (status == cudaSuccess && previous != device_index) {
    status = cudaSetDevice(device_index);
    call = "cudaSetDevice";
  }
  if (status == cudaSuccess) {
    if (allocators[device_index].load() == kPlain) {
      const host_sync::Scope counted(host_sync::Kind::synchronize);  // cudaFree waits for the device
      status = cudaFree(ptr);
      call = "cudaFree";
    } else {
      cudaStream_t stream = nullptr;
      try {
        stream = cuda::current_stream(device_index);
      } catch (...) {
        status = cudaErrorInvalidResourceHandle;  // the compute stream could not be made
        call = "release (the device's stream)";
      }
      if (status == cudaSuccess) {
        status = cudaFreeAsync(ptr, stream);
        call = "cudaFreeAsync";
      }
    }
  }
  if (status != cudaSuccess) report_release_failure(ptr, nbytes, device_index, call, status);
  if (previous >= 0 && previous != device_index) cudaSetDevice(previous);
}

void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  const int index = dst_device.is_cuda() ? dst_device.index : src_device.index;
  std::optional<host_sync::Scope> counted;  // a copy with a host side is waited for
  if (dst_device.is_cpu()) counted.emplace(host_sync::Kind::device_to_host);
  if (src_device.is_cpu()) counted.emplace(host_sync::Kind::host_to_device);
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

void release_pinned(void* ptr) noexcept {
  const host_sync::Scope counted(host_sync::Kind::synchronize);  // cudaFreeHost waits for the device
  cudaFreeHost(ptr);
}

MemoryStats memory_stats(int device_index) {
  check_device(device_index);
  MemoryStats s;
  s.in_use = counters[device_index].in_use.load();
  s.peak = counters[device_index].peak.load();
  if (!uses_pool(device_index)) {
    // No pool: the driver holds exactly the live blocks (less its own rounding up, not counted).
    s.reserved = s.in_use;
    s.reserved_peak = s.peak;
    return s;
  }
  cudaMemPool_t pool = nullptr;
  cuda::check(cudaDeviceGetDefaultMemPool(&pool, device_index), "cudaDeviceGetDefaultMemPool");
  uint64_t value = 0;
  cuda::check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &value), "cudaMemPoolGetAttribute");
  s.reserved = value;
  cuda::check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &value), "cudaMemPoolGetAttribute");
  s.reserved_peak = value;
  return s;
}

size_t memory_in_use(int device_index) {
  check_device(device_index);
  return counters[device_index].in_use.load();
}

void reset_peak_memory_stats(int device_index) {
  check_device(device_index);
  counters[device_index].peak.store(counters[device_index].in_use.load());
  if (!uses_pool(device_index)) return;  // reserved_peak is peak then
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
size_t memory_in_use(int) { return 0; }
void reset_peak_memory_stats(int) {}
}  // namespace cuda_memory

#endif

}  // namespace octet
