#pragma once
// A block of bytes on one device, shared by every tensor that views it. Host blocks are 64-byte
// aligned (a cache line, and enough for any SIMD load); CUDA blocks come from the stream-ordered
// allocator (core/cuda_memory.h).
#include <cstddef>
#include <functional>
#include <memory>

#include "core/device.h"

namespace octet {

class Storage {
 public:
  static constexpr size_t kHostAlignment = 64;

  Storage(size_t nbytes, Device device);
  // Wraps memory Octet did not allocate; `deleter` runs when the last tensor lets go.
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);
  // Page-locked host memory (core/cuda_memory.h), for copies that overlap compute. CUDA builds only.
  static std::shared_ptr<Storage> pinned(size_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  // Frees the bytes but keeps this Storage, so every tensor viewing it stays a valid handle whose
  // data is absent until reallocate() gives it fresh bytes of the same size (contents undefined).
  // FSDP frees a gathered unit between forward and backward this way while the autograd graph
  // still holds views of it, then gathers into the same storage again (PyTorch resizes the storage
  // to 0 for the same reason). Only for storages Octet allocated.
  void release();
  void reallocate();
  bool allocated() const { return data_ != nullptr; }

 private:
  void allocate();

  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  std::function<void(void*)> deleter_;
  bool owned_ = true;  // allocated here (not wrapped), so release/reallocate may manage it
};

// Host blocks of kHostCacheMinBytes or more are not returned to the C library when their last tensor
// lets go: they wait in a cache, by size class, for the next request of that class. A training step
// allocates the same activation sizes every time, and a fresh multi-megabyte block costs the kernel a
// page fault and a page clear per 4 KiB on first touch (about 6% of a CPU ViT step). At most
// kHostCacheMaxBytes wait; builds with AddressSanitizer skip the cache so it still sees every free.
inline constexpr size_t kHostCacheMinBytes = size_t{1} << 17;
inline constexpr size_t kHostCacheMaxBytes = size_t{2} << 30;
// Frees every cached host block (the memory in use is untouched). Also done by itself when an
// allocation fails, before reporting out of memory.
void release_host_cache();
// Bytes of host memory waiting in the cache.
size_t host_cache_bytes();

// Copies bytes between any two devices (host<->host, host<->cuda, cuda<->cuda).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);

}  // namespace octet
