#pragma once
// Where a tensor's bytes live: host memory, or the memory of CUDA device N.
#include <iosfwd>
#include <string>
#include <cstdint>
#include <string_view>

namespace octet {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // CUDA ordinal; always 0 for the CPU

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::CUDA, index}; }
  static Device parse(std::string_view text);  // "cpu", "cuda", "cuda:1"

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  bool operator==(const Device&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Device& device);

namespace cuda {
// False in a CPU-only build and on machines without a usable GPU; never throws.
bool is_available();
int device_count();
}  // namespace cuda

}  // namespace octet
