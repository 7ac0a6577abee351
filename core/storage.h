#pragma once
// A block of bytes on one device, shared by every tensor that views it. Host blocks are 64-byte
// aligned (a cache line, and enough for any SIMD load); CUDA blocks come from the stream-ordered
// allocator (core/cuda_memory.h).
#include <atomic>
#include <cstddef>
#include <cstdint>
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
  // reallocate() counts as a write (the bytes are new and undefined): it bumps the version.
  void release();
  void reallocate();
  bool allocated() const { return data_ != nullptr; }

  // The write version, PyTorch's VariableVersion: shared by every tensor that views this storage and
  // bumped by every in-place write made through Octet (Tensor::copy_ and fill_, the kernels' in-place
  // functions and the outputs they write into, the optimizers' steps, collectives). Something derived
  // from the bytes and cached (a Linear's FP8 weight cast, nn/fp8.h) stays good while the version it
  // was made at is the version now. Code that writes through data_ptr() itself bumps it.
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }
  // Sets the version back to `version`, an earlier version of this storage, for a writer that has just
  // written exactly the bytes the storage held at that version: FSDP gathering a unit again from
  // shards that have not changed since it recorded `version` (distributed/fsdp_gather.h), so that the
  // casts cached from the earlier gather stay good. Any other use makes caches serve stale bytes.
  void restore_version(uint64_t version) { version_.store(version, std::memory_order_relaxed); }

 private:
  void allocate();

  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  std::function<void(void*)> deleter_;
  bool owned_ = true;  // allocated here (not wrapped), so release/reallocate may manage it
  std::atomic<uint64_t> version_{0};
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

// Bytes held by live storages on `device` now: on the host those Octet allocated (not the cache's
// free blocks, not memory it wraps or pinned buffers), on a GPU the allocator's in_use
// (core/cuda_memory.h). The difference around a forward is what that forward keeps alive for its
// backward (train_vit's saved-activation figure).
size_t memory_in_use(Device device);

// Copies bytes between any two devices (host<->host, host<->cuda, cuda<->cuda).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);

}  // namespace octet
