#include "core/cuda_memory.h"

#include "core/error.h"

#if OCTET_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace octet {

#if OCTET_HAS_CUDA

namespace {
void check_cuda(cudaError_t status, const char* what) {
  OCTET_CHECK(status == cudaSuccess, what, ": ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
}

// Switches the calling thread to `index` for the lifetime of the guard.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    cudaGetDevice(&previous_);
    if (previous_ != index) check_cuda(cudaSetDevice(index), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};
}  // namespace

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

void* allocate(size_t nbytes, int device_index) {
  OCTET_CHECK(device_index >= 0 && device_index < cuda::device_count(), "allocate on cuda:", device_index,
              ": this machine has ", cuda::device_count(), " CUDA device(s)");
  DeviceGuard guard(device_index);
  void* ptr = nullptr;
  // The legacy default stream orders the block against all work on the device until streams
  // are threaded through the kernels.
  check_cuda(cudaMallocAsync(&ptr, nbytes == 0 ? 1 : nbytes, cudaStreamLegacy), "cudaMallocAsync");
  return ptr;
}

void release(void* ptr, int device_index) noexcept {
  DeviceGuard guard(device_index);
  cudaFreeAsync(ptr, cudaStreamLegacy);
}

void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  const int index = dst_device.is_cuda() ? dst_device.index : src_device.index;
  DeviceGuard guard(index);
  check_cuda(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault), "cudaMemcpy");
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
void release(void*, int) noexcept {}
void copy(void*, Device, const void*, Device, size_t) { no_cuda("copy to or from a CUDA device"); }
}  // namespace cuda_memory

#endif

}  // namespace octet
