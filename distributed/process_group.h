#pragma once
// Collective communication between the ranks of a job, as PyTorch's c10d ProcessGroup.
//
// Every collective is in place on contiguous tensors, is issued in the same order on every rank
// (the caller's duty, as with MPI and NCCL), and returns a Work handle at once:
//
//   group->all_reduce(grads, ReduceOp::Avg)->wait();
//
// Backends (one code path above this interface):
//   NcclProcessGroup (distributed/nccl_process_group.h)  CUDA tensors, one GPU per rank (or shared: NCCL ≥ 2.30)
//   MpiProcessGroup  (distributed/mpi_process_group.h)   CPU tensors; CUDA tensors staged through
//                                                        pinned host memory (several ranks per GPU)
//   LocalProcessGroup (below)                            world size 1 without MPI: a program started
//                                                        without mpirun
// init_process_group (distributed/launch.h) picks one from the environment.
//
// Each group counts the bytes its collectives move, per collective type, so that tests and
// benchmarks compare communication volume with theory.
//
// Groups over subsets of the ranks, as MPI_Comm_split (what FSDP's hybrid sharding runs on):
//
//   auto node = world->split(world->rank() / 8, world->rank());   // the 8 ranks of each node
//   auto peers = world->split(world->rank() % 8, world->rank());  // one rank of every node
//
// split(color, key) is a collective over the group it is called on: every rank calls it, in the
// same order as that group's other collectives. The ranks that pass the same color form one new
// group, ranked by key (ties by their rank in the parent); a rank that passes kNoColor joins none
// and gets nullptr. A subgroup has its parent's backend, device and options (the timeout), a
// communicator of its own (NCCL: ncclCommSplit; MPI: MPI_Comm_split, with a communication thread of
// its own; local: another LocalProcessGroup), counters of its own (counters().world_size is the
// subgroup's size), and is registered with abort_job like the job's group, so a failing rank still
// ends the whole job. Its collectives are independent of the parent's: issue each group's in the
// same order on its ranks, with no order needed between groups. split itself is not counted.
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace octet::distributed {

enum class ReduceOp { Sum, Avg, Max };
const char* reduce_op_name(ReduceOp op);

enum class Collective { AllReduce, ReduceScatter, AllGather, Broadcast, Barrier };
inline constexpr int kNumCollectives = 5;
const char* collective_name(Collective c);

// What one rank's collectives have moved since the group was made (or reset_counters()).
//   payload_bytes: the bytes of the full-size buffer of each call: all_reduce and broadcast the
//     tensor, all_gather the gathered output (N × the input), reduce_scatter the input (N × the
//     output). Barrier: 0.
//   bus_bytes(c): what a ring algorithm sends per rank for that payload (NCCL's "bus bandwidth"
//     convention): all_reduce 2(N−1)/N, all_gather and reduce_scatter (N−1)/N, broadcast 1 × payload.
struct CommCounters {
  int world_size = 1;
  std::array<int64_t, kNumCollectives> calls{};
  std::array<int64_t, kNumCollectives> payload_bytes{};

  int64_t calls_of(Collective c) const { return calls[static_cast<size_t>(c)]; }
  int64_t payload_of(Collective c) const { return payload_bytes[static_cast<size_t>(c)]; }
  double bus_bytes(Collective c) const;
};

// A collective in flight. Handles are shared: hold one as long as the work may be waited on.
class Work {
 public:
  virtual ~Work() = default;
  // The caller may use the result after this. On a GPU the caller's current stream waits for the
  // collective and the host returns at once (no host sync); otherwise the host blocks until done.
  // A collective still unfinished after the group's timeout ends the job (abort_job), naming it.
  virtual void wait() = 0;
  // Blocks the host until the collective has finished, on every backend.
  virtual void synchronize() = 0;
  // True once the collective has finished (never blocks).
  virtual bool is_completed() = 0;
  // "all_reduce(avg) of 4.00 MB" — for errors and traces.
  virtual std::string describe() const = 0;
};
using WorkHandle = std::shared_ptr<Work>;

// work.synchronize() for a destructor, which must not throw (a throw there ends the process without
// a message, std::terminate). What it throws (an error NCCL found in the collective) ends the job
// with that message, naming `owner` (abort_job); while an exception unwinds, which is on its way to
// end the job with its own message, it is logged as a warning and the destructor goes on.
void synchronize_in_destructor(Work& work, const char* owner) noexcept;

struct ProcessGroupOptions {
  // How long wait() lets a collective run before it ends the job (a rank that died or never
  // arrived). PyTorch's default for NCCL is 10 minutes; training steps here are far shorter.
  std::chrono::seconds timeout{300};
};

class ProcessGroup {
 public:
  ProcessGroup(int rank, int size, ProcessGroupOptions options);
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const ProcessGroupOptions& options() const { return options_; }
  virtual std::string backend() const = 0;  // "nccl", "mpi" or "local"
  // Where this group's collectives run: a CUDA device for NCCL, the CPU otherwise.
  virtual Device device() const = 0;

  // In place: every rank ends with op over all ranks' `tensor`. Avg divides the sum by size() and
  // takes floating dtypes only; Sum and Max take f32, bf16, f16, f64 and i64.
  WorkHandle all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  // `input` holds size() equal chunks; rank r's `output` gets op over every rank's chunk r.
  // output.numel() × size() == input.numel(), same dtype and device.
  WorkHandle reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::Sum);
  // Rank r's `input` lands in chunk r of every rank's `output` (output.numel() == size() × input.numel()).
  WorkHandle all_gather(const Tensor& output, const Tensor& input);
  // The same, into a list: outputs[r] receives rank r's input (outputs.size() == size(), each input-shaped).
  WorkHandle all_gather(const std::vector<Tensor>& outputs, const Tensor& input);
  // Every rank's `tensor` becomes root's.
  WorkHandle broadcast(const Tensor& tensor, int root = 0);
  WorkHandle barrier();

  CommCounters counters() const { return counters_; }
  void reset_counters();

  // A group over the ranks that pass the same `color` (>= 0), ranked by `key`; nullptr for a rank
  // that passes kNoColor. A collective: see the top of this file.
  static constexpr int kNoColor = -1;
  std::shared_ptr<ProcessGroup> split(int color, int key);

  // Ends a job that cannot go on: aborts this group's communicator (ncclCommAbort for NCCL) so no
  // rank stays blocked in it. abort_job (launch.h) calls it on every live group.
  virtual void abort() {}

 protected:
  // The backends implement these after the checks and the counting above have run.
  virtual WorkHandle do_all_reduce(const Tensor& tensor, ReduceOp op) = 0;
  virtual WorkHandle do_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) = 0;
  virtual WorkHandle do_all_gather(const Tensor& output, const Tensor& input) = 0;
  virtual WorkHandle do_broadcast(const Tensor& tensor, int root) = 0;
  virtual WorkHandle do_barrier() = 0;
  // The new group (unregistered), or nullptr for kNoColor; `color` is checked.
  virtual std::shared_ptr<ProcessGroup> do_split(int color, int key) = 0;

 private:
  void count(Collective c, int64_t payload_bytes);
  void check_tensor(const char* op, const Tensor& t) const;

  int rank_, size_;
  ProcessGroupOptions options_;
  CommCounters counters_;
};

// Work that has already finished when it is returned (the local group, and errors).
class CompletedWork : public Work {
 public:
  explicit CompletedWork(std::string what) : what_(std::move(what)) {}
  void wait() override {}
  void synchronize() override {}
  bool is_completed() override { return true; }
  std::string describe() const override { return what_; }

 private:
  std::string what_;
};

// World size 1, no MPI and no NCCL: every collective is the identity (a copy for all_gather), so
// a program that uses a ProcessGroup runs unchanged without mpirun.
class LocalProcessGroup : public ProcessGroup {
 public:
  explicit LocalProcessGroup(Device device = Device::cpu(), ProcessGroupOptions options = {});
  std::string backend() const override { return "local"; }
  Device device() const override { return device_; }

 protected:
  WorkHandle do_all_reduce(const Tensor& tensor, ReduceOp op) override;
  WorkHandle do_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override;
  WorkHandle do_all_gather(const Tensor& output, const Tensor& input) override;
  WorkHandle do_broadcast(const Tensor& tensor, int root) override;
  WorkHandle do_barrier() override;
  std::shared_ptr<ProcessGroup> do_split(int color, int key) override;

 private:
  Device device_;
};

// "4.00 MB", "512 B": for describe() strings and logs.
std::string format_bytes(double bytes);

}  // namespace octet::distributed
