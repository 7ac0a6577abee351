#pragma once
// A block of bytes on one device, shared by every tensor that views it. Host blocks are 64-byte
// aligned (a cache line, and enough for any SIMD load); CUDA blocks come from the stream-ordered
// allocator (core/cuda_memory.h).
#include <cstddef>
#include <functional>

#include "core/device.h"

namespace octet {

class Storage {
 public:
  static constexpr size_t kHostAlignment = 64;

  Storage(size_t nbytes, Device device);
  // Wraps memory Octet did not allocate; `deleter` runs when the last tensor lets go.
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  std::function<void(void*)> deleter_;
};

// Copies bytes between any two devices (host<->host, host<->cuda, cuda<->cuda).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);

}  // namespace octet
