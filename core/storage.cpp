#include "core/storage.h"

#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "core/cuda_memory.h"
#include "core/error.h"

namespace octet {

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUseHostCache = false;
#else
constexpr bool kUseHostCache = true;
#endif

// Cached blocks by size class. Classes are 8 steps per power of two, so a block is at most 12.5%
// larger than asked for, and sizes that differ slightly (a last partial batch) still share blocks.
class HostCache {
 public:
  static size_t size_class(size_t nbytes) {
    const size_t step = std::bit_floor(nbytes) / 8;
    return (nbytes + step - 1) / step * step;
  }

  // A cached block of exactly `bytes` (a size class), or null.
  void* take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(bytes);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();  // last in, first out: the block most likely still in cache
    it->second.pop_back();
    cached_ -= bytes;
    return p;
  }

  // Keeps the block for reuse, or frees it when the cache is full.
  void give(void* p, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cached_ + bytes <= kHostCacheMaxBytes) {
        free_[bytes].push_back(p);
        cached_ += bytes;
        return;
      }
    }
    std::free(p);
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [bytes, blocks] : free_) {
      for (void* p : blocks) std::free(p);
    }
    free_.clear();
    cached_ = 0;
  }

  size_t bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
};

// Never destroyed: tensors held by other static objects may be freed after main returns.
HostCache& host_cache() {
  static HostCache* cache = new HostCache();
  return *cache;
}

std::atomic<size_t> host_in_use{0};  // bytes of the live host storages Octet allocated

void* host_allocate(size_t bytes) {
  void* p = std::aligned_alloc(Storage::kHostAlignment, bytes);
  if (p == nullptr && kUseHostCache) {
    host_cache().release();
    p = std::aligned_alloc(Storage::kHostAlignment, bytes);
  }
  OCTET_CHECK(p != nullptr, "Storage: out of host memory allocating ", bytes, " bytes");
  return p;
}

}  // namespace

void release_host_cache() { host_cache().release(); }
size_t host_cache_bytes() { return host_cache().bytes(); }

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) { allocate(); }

void Storage::allocate() {
  const size_t nbytes = nbytes_;
  const Device device = device_;
  if (device.is_cpu()) {
    // aligned_alloc wants a size that is a multiple of the alignment, and a non-null block for 0.
    const size_t rounded = (nbytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    if (kUseHostCache && rounded >= kHostCacheMinBytes) {
      const size_t bytes = HostCache::size_class(rounded);
      data_ = host_cache().take(bytes);
      if (data_ == nullptr) data_ = host_allocate(bytes);
      deleter_ = [bytes, nbytes](void* p) {
        host_in_use.fetch_sub(nbytes, std::memory_order_relaxed);
        host_cache().give(p, bytes);
      };
    } else {
      data_ = host_allocate(rounded == 0 ? kHostAlignment : rounded);
      deleter_ = [nbytes](void* p) {
        host_in_use.fetch_sub(nbytes, std::memory_order_relaxed);
        std::free(p);
      };
    }
    host_in_use.fetch_add(nbytes, std::memory_order_relaxed);
  } else {
    data_ = cuda_memory::allocate(nbytes, device.index);
    const int index = device.index;
    deleter_ = [index, nbytes](void* p) { cuda_memory::release(p, nbytes, index); };
  }
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)), owned_(false) {}

std::shared_ptr<Storage> Storage::pinned(size_t nbytes) {
  void* data = cuda_memory::allocate_pinned(nbytes);
  return std::make_shared<Storage>(data, nbytes, Device::cpu(), [](void* p) { cuda_memory::release_pinned(p); });
}

Storage::~Storage() {
  if (deleter_ && data_) deleter_(data_);
}

void Storage::release() {
  OCTET_CHECK(owned_, "Storage::release: this storage wraps memory Octet did not allocate; only Octet's own "
              "storages can be released and reallocated");
  if (data_ != nullptr) deleter_(data_);
  data_ = nullptr;
}

void Storage::reallocate() {
  OCTET_CHECK(owned_, "Storage::reallocate: this storage wraps memory Octet did not allocate");
  if (data_ != nullptr) return;
  allocate();
  bump_version();
}

size_t memory_in_use(Device device) {
  return device.is_cpu() ? host_in_use.load(std::memory_order_relaxed) : cuda_memory::memory_in_use(device.index);
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  cuda_memory::copy(dst, dst_device, src, src_device, nbytes);
}

}  // namespace octet
