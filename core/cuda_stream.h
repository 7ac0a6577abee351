#pragma once
// Streams and events for CUDA code (only in CUDA builds: this header includes the CUDA runtime).
//
// Every device has one compute stream, created on first use with cudaStreamNonBlocking so that it
// never serialises against the legacy default stream. Kernels, cuBLASLt, cuDNN, allocations,
// frees and copies of tensors on that device all go on current_stream(device); a thread can point
// current_stream at another stream for a scope with StreamGuard (a loader's copy stream, or a
// communication stream later). One stream per device keeps every tensor's lifetime ordered
// without record_stream-style bookkeeping.
#include <cuda_runtime_api.h>

namespace octet::cuda {

// Throws an octet::Error naming `what` and the CUDA error when status is not cudaSuccess.
void check(cudaError_t status, const char* what);

// The stream work on `device_index` goes to from the calling thread.
cudaStream_t current_stream(int device_index);
// The device's compute stream, whatever the calling thread's current stream is.
cudaStream_t compute_stream(int device_index);
// For a kernel launch: makes `device_index` the calling thread's current device and returns its
// current stream. CUDA refuses a launch on a stream of a device other than the current one, and
// an allocation or handle made next would land on the wrong device. The device stays current
// after the call, as cudaSetDevice leaves it, so every launch of an op goes to its tensors' device;
// code that must give the previous device back holds a DeviceGuard around the op.
cudaStream_t launch_stream(int device_index);
// Waits until everything queued on the device's current stream has run (a host sync, counted by
// core/host_sync.h, as Event::synchronize is).
void synchronize(int device_index);

// Makes `stream` the current stream of `device_index` for this thread until the guard ends.
class StreamGuard {
 public:
  StreamGuard(int device_index, cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_index_;
  cudaStream_t previous_;
};

// Switches the calling thread to `device_index` until the guard ends.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device_index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// A CUDA event that owns its handle. timing=true allows elapsed_ms (and costs a little).
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t stream);
  void wait_on(cudaStream_t stream) const;  // `stream` waits for this event; the host does not
  void synchronize() const;                 // the host waits
  bool query() const;                       // true once the recorded work has run
  float elapsed_ms(const Event& since) const;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace octet::cuda
