#include "core/cuda_stream.h"

#include <array>
#include <mutex>

#include "core/error.h"
#include "core/host_sync.h"

namespace octet::cuda {

namespace {
constexpr int kMaxDevices = 64;

// Per-thread overrides set by StreamGuard; nullptr means "the device's compute stream".
thread_local std::array<cudaStream_t, kMaxDevices> current_override{};

void check_index(int device_index) {
  OCTET_CHECK(device_index >= 0 && device_index < kMaxDevices, "CUDA device index ", device_index,
              " is out of range [0, ", kMaxDevices, ")");
}
}  // namespace

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  OCTET_FAIL(what, ": ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
}

cudaStream_t compute_stream(int device_index) {
  check_index(device_index);
  static std::array<cudaStream_t, kMaxDevices> streams{};
  static std::array<std::once_flag, kMaxDevices> created;
  std::call_once(created[device_index], [&] {
    DeviceGuard guard(device_index);
    check(cudaStreamCreateWithFlags(&streams[device_index], cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  });
  return streams[device_index];
}

cudaStream_t current_stream(int device_index) {
  check_index(device_index);
  cudaStream_t s = current_override[device_index];
  return s != nullptr ? s : compute_stream(device_index);
}

cudaStream_t launch_stream(int device_index) {
  check_index(device_index);
  int current = -1;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device_index) check(cudaSetDevice(device_index), "cudaSetDevice");
  return current_stream(device_index);
}

void synchronize(int device_index) {
  const host_sync::Scope counted(host_sync::Kind::synchronize);
  check(cudaStreamSynchronize(current_stream(device_index)), "cudaStreamSynchronize");
}

StreamGuard::StreamGuard(int device_index, cudaStream_t stream) : device_index_(device_index) {
  check_index(device_index);
  previous_ = current_override[device_index];
  current_override[device_index] = stream;
}

StreamGuard::~StreamGuard() { current_override[device_index_] = previous_; }

DeviceGuard::DeviceGuard(int device_index) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device_index) check(cudaSetDevice(device_index), "cudaSetDevice");
}

DeviceGuard::~DeviceGuard() { cudaSetDevice(previous_); }

Event::Event(bool timing) {
  check(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming), "cudaEventCreate");
}

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

void Event::record(cudaStream_t stream) { check(cudaEventRecord(event_, stream), "cudaEventRecord"); }

void Event::wait_on(cudaStream_t stream) const {
  check(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent");
}

void Event::synchronize() const {
  const host_sync::Scope counted(host_sync::Kind::synchronize);
  check(cudaEventSynchronize(event_), "cudaEventSynchronize");
}

bool Event::query() const {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return false;
  check(status, "cudaEventQuery");
  return true;
}

float Event::elapsed_ms(const Event& since) const {
  float ms = 0.f;
  check(cudaEventElapsedTime(&ms, since.event_, event_), "cudaEventElapsedTime");
  return ms;
}

}  // namespace octet::cuda
