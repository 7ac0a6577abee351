#include "core/host_sync.h"

#include <atomic>

namespace octet::host_sync {

namespace {

std::array<std::atomic<int64_t>, kNumKinds> counters{};

// Per thread: how deep inside counted calls, kernel scopes and helper scopes it is.
thread_local int call_depth = 0;
thread_local int kernel_depth = 0;
thread_local int helper_depth = 0;

}  // namespace

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::item: return "item";
    case Kind::to_vector: return "to_vector";
    case Kind::device_to_host: return "device_to_host";
    case Kind::host_to_device: return "host_to_device";
    case Kind::synchronize: return "synchronize";
  }
  return "?";
}

int64_t Counts::total() const {
  int64_t sum = 0;
  for (int64_t n : by_kind) sum += n;
  return sum;
}

Counts Counts::operator-(const Counts& before) const {
  Counts d;
  for (size_t i = 0; i < by_kind.size(); ++i) d.by_kind[i] = by_kind[i] - before.by_kind[i];
  return d;
}

std::string Counts::describe() const {
  std::string s;
  for (int i = 0; i < kNumKinds; ++i) {
    if (by_kind[static_cast<size_t>(i)] == 0) continue;
    if (!s.empty()) s += ", ";
    s += std::to_string(by_kind[static_cast<size_t>(i)]) + " " + kind_name(static_cast<Kind>(i));
  }
  return s.empty() ? "none" : s;
}

Counts counts() {
  Counts c;
  for (size_t i = 0; i < counters.size(); ++i) c.by_kind[i] = counters[i].load(std::memory_order_relaxed);
  return c;
}

Scope::Scope(Kind kind, bool cpu_tensor) noexcept {
  const bool exempt = helper_depth > 0 || (cpu_tensor && kernel_depth > 0);
  if (call_depth++ == 0 && !exempt) counters[static_cast<size_t>(kind)].fetch_add(1, std::memory_order_relaxed);
}

Scope::~Scope() { --call_depth; }

CpuKernelScope::CpuKernelScope() noexcept { ++kernel_depth; }
CpuKernelScope::~CpuKernelScope() { --kernel_depth; }

HelperThreadScope::HelperThreadScope() noexcept { ++helper_depth; }
HelperThreadScope::~HelperThreadScope() { --helper_depth; }

}  // namespace octet::host_sync
