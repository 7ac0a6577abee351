#pragma once
// Device memory for Storage. With CUDA, blocks come from cudaMallocAsync on the device's pool,
// so freeing is stream-ordered and cheap. In a CPU-only build each call throws an Error that
// says how to get a CUDA build.
#include <cstddef>

#include "core/device.h"

namespace octet::cuda_memory {

void* allocate(size_t nbytes, int device_index);
void release(void* ptr, int device_index) noexcept;
// Copies between host and device or device and device, and waits for the copy to finish.
void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);

}  // namespace octet::cuda_memory
