#pragma once
// A process-wide count of the host's reads of tensor values and of its waits for a GPU: the host
// syncs that a training step must not make outside its log steps (apps/train_step.cpp lists the
// ones left). Tests read the counts around a step and compare them.
//
// What is counted, once per call; a counted call made inside another one belongs to the outer call
// (item() of a GPU tensor is one `item`, not also a copy and a stream sync):
//   item            Tensor::item()
//   to_vector       Tensor::to_vector()
//   device_to_host  a copy from a GPU into host memory (Tensor::to(cpu), copy_ into a host tensor),
//                   which the host waits for
//   host_to_device  a copy from host memory into a GPU, which the host waits for too (the source may
//                   be pageable memory that its caller reuses next; core/cuda_memory.h)
//   synchronize     cuda::synchronize, cuda::Event::synchronize, a cudaFree or cudaFreeHost (both
//                   wait for the device), and an NCCL collective waited for on the host
//                   (Work::synchronize; an MPI collective on CPU tensors waits for the other ranks,
//                   not for a GPU, and is not counted)
//
// item() and to_vector() also count on CPU tensors, where they wait for nothing: they are the calls
// that read a GPU when the same code runs there, so running a step on the CPU counts the reads its
// GPU run would wait for. CI has no GPU; this proxy checks the property there.
//
// Two kinds of thread activity are left out, so that the count means "the thread issuing the work
// waited":
//   - reads of CPU tensors inside a CpuKernelScope: a CPU kernel reading its own operand (the CPU
//     cross_entropy_backward reads the loss gradient with item(); its CUDA kernel reads it on the
//     device). The autograd engine runs each backward closure in one. A GPU tensor's read counts
//     everywhere.
//   - everything on a thread inside a HelperThreadScope (the device prefetcher's worker): its waits
//     hold up no step.
#include <array>
#include <cstdint>
#include <string>

namespace octet::host_sync {

enum class Kind { item, to_vector, device_to_host, host_to_device, synchronize };
inline constexpr int kNumKinds = 5;
const char* kind_name(Kind kind);

// Counts since the process started, per kind.
struct Counts {
  std::array<int64_t, kNumKinds> by_kind{};

  int64_t of(Kind kind) const { return by_kind[static_cast<size_t>(kind)]; }
  int64_t total() const;
  // Counts since `before`: counts() - before.
  Counts operator-(const Counts& before) const;
  // "2 item, 1 device_to_host", or "none".
  std::string describe() const;
};
Counts counts();

// Marks one counted call for its duration: counts it (unless the thread is already inside a counted
// call, or exempt) when constructed. `cpu_tensor`: the call reads a CPU tensor, which a
// CpuKernelScope exempts.
class Scope {
 public:
  explicit Scope(Kind kind, bool cpu_tensor = false) noexcept;
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

// The calling thread runs kernels until the scope ends: its reads of CPU tensors are not counted.
class CpuKernelScope {
 public:
  CpuKernelScope() noexcept;
  ~CpuKernelScope();
  CpuKernelScope(const CpuKernelScope&) = delete;
  CpuKernelScope& operator=(const CpuKernelScope&) = delete;
};

// The calling thread helps the step without holding it up (a prefetch worker) until the scope ends:
// nothing it does is counted.
class HelperThreadScope {
 public:
  HelperThreadScope() noexcept;
  ~HelperThreadScope();
  HelperThreadScope(const HelperThreadScope&) = delete;
  HelperThreadScope& operator=(const HelperThreadScope&) = delete;
};

}  // namespace octet::host_sync
