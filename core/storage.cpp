#include "core/storage.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/cuda_memory.h"
#include "core/error.h"

namespace octet {

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (device.is_cpu()) {
    // aligned_alloc wants a size that is a multiple of the alignment, and a non-null block for 0.
    const size_t rounded = (nbytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    data_ = std::aligned_alloc(kHostAlignment, rounded == 0 ? kHostAlignment : rounded);
    OCTET_CHECK(data_ != nullptr, "Storage: out of host memory allocating ", nbytes, " bytes");
    deleter_ = [](void* p) { std::free(p); };
  } else {
    data_ = cuda_memory::allocate(nbytes, device.index);
    const int index = device.index;
    deleter_ = [index](void* p) { cuda_memory::release(p, index); };
  }
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (deleter_ && data_) deleter_(data_);
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
