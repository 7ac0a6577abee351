#pragma once
// Device memory for Storage, and pinned host memory for fast host-to-device copies.
//
// With CUDA, device blocks come from cudaMallocAsync on the device's default memory pool, ordered
// on the device's compute stream (core/cuda_stream.h), so a free is stream-ordered and cheap and
// a block freed by one step is handed straight back to the next. The pool's release threshold is
// set to "never", so memory stays reserved between steps instead of going back to the driver at
// every synchronisation. A device without memory pools (cudaDevAttrMemoryPoolsSupported is 0), or
// any device when the environment sets OCTET_NO_CUDA_MEMORY_POOL=1, uses cudaMalloc and cudaFree
// instead: no caching, and each free waits for the device (the statistics still hold, with
// reserved = in use). In a CPU-only build each call throws an Error that says how to get a CUDA
// build; the statistics are all zero.
#include <cstddef>
#include "core/device.h"

namespace octet::cuda_memory {

void* allocate(size_t nbytes, int device_index);
// Never throws (it runs in destructors): a block the driver refuses to free is logged and left.
void release(void* ptr, size_t nbytes, int device_index) noexcept;
// Copies between host and device or device and device on the device's current stream. A copy
// with a host side waits for the copy to finish (the host side may be pageable memory that the
// caller frees next); device to device does not wait. Copies with a host side count as host syncs
// (core/host_sync.h).
void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);

// Page-locked host memory: the DMA engines read it directly, so a copy from it can run
// asynchronously beside compute. Expensive to allocate: keep and reuse such buffers.
void* allocate_pinned(size_t nbytes);
void release_pinned(void* ptr) noexcept;

struct MemoryStats {
  size_t in_use = 0;    // bytes in live tensors on the device
  size_t peak = 0;      // the most in_use has been since the start or the last reset_peak
  size_t reserved = 0;  // bytes the pool holds from the driver (in use + cached for reuse)
  size_t reserved_peak = 0;
};
MemoryStats memory_stats(int device_index);
// memory_stats(device_index).in_use alone: a counter read, no CUDA call (what a step may read twice).
size_t memory_in_use(int device_index);
void reset_peak_memory_stats(int device_index);

}  // namespace octet::cuda_memory
