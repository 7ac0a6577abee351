#pragma once
// Collectives over MPI (OpenMPI), on CPU tensors, and on CUDA tensors staged through host memory so
// that several ranks can share one GPU (tests, and GPUs without NCCL). Staging copies the tensor to
// pinned host memory when the collective is issued (which waits for the caller's stream), and its result
// back into it when waited on: simple and correct, not fast; NCCL is the GPU path for speed. The
// results reach the device in issue order, as NCCL's one stream orders collectives: waiting on a
// collective (or a barrier) copies back every earlier result too, whether or not its handle was kept,
// and a collective whose tensors overlap an earlier one's pending result first delivers that one.
//
// Like PyTorch's MPI backend, one communication thread per group runs the collectives, in the
// order they were issued, on a duplicate of MPI_COMM_WORLD (a subgroup: the communicator
// MPI_Comm_split made, split on the parent's thread in order with its collectives). So a
// collective issued during backward runs while the training thread keeps computing: that is the
// overlap DDP relies on. Work::wait() blocks the host until the thread has finished it (then, for
// a CUDA tensor, the caller's stream waits for the copy back).
//
// bf16 and f16 are reduced with user-defined MPI operations that add (or take the max) in f32 and
// round once per pairwise step, as NCCL does. Avg is a Sum followed by one division.
#include <memory>

#include "distributed/process_group.h"

namespace octet::distributed {

class MpiProcessGroup : public ProcessGroup {
 public:
  // Needs MPI initialised (init_process_group does it). `device` is where the callers' tensors
  // live: the CPU, or a CUDA device whose tensors are staged through host memory.
  explicit MpiProcessGroup(Device device = Device::cpu(), ProcessGroupOptions options = {});
  ~MpiProcessGroup() override;  // finishes the queued collectives, then stops the thread
  std::string backend() const override { return "mpi"; }
  Device device() const override { return device_; }

  struct State;  // the communicator, the queue and the thread

 protected:
  WorkHandle do_all_reduce(const Tensor& tensor, ReduceOp op) override;
  WorkHandle do_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override;
  WorkHandle do_all_gather(const Tensor& output, const Tensor& input) override;
  WorkHandle do_broadcast(const Tensor& tensor, int root) override;
  WorkHandle do_barrier() override;
  std::shared_ptr<ProcessGroup> do_split(int color, int key) override;

 private:
  // Over the communicator in `state` (which it then owns), starting the communication thread.
  MpiProcessGroup(Device device, ProcessGroupOptions options, std::unique_ptr<State> state);

  Device device_;
  std::unique_ptr<State> state_;
};

}  // namespace octet::distributed
