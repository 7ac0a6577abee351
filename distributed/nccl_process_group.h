#pragma once
// Collectives on CUDA tensors with NCCL: one GPU per rank (CUDA builds only).
//
// Rank 0 makes the ncclUniqueId and MPI_Bcast sends it to every rank; each then joins with
// ncclCommInitRank on its device. At world size 1 (no mpirun) the id is made locally and no MPI is
// involved.
//
// Streams: every collective runs on this group's communication stream. Before it starts, the comm
// stream waits for an event recorded on the caller's current stream (so the inputs are ready);
// Work::wait() makes the caller's current stream wait for an event recorded after the collective.
// The host never blocks. A Work holds its tensors, and one dropped before wait() still makes the
// compute stream wait for it: the allocator's pool is ordered on the compute stream, so memory freed
// earlier could be reused while NCCL still reads it.
//
// Reductions: what NCCL is asked for per ReduceOp and dtype is distributed/nccl_reduction.h; a bf16
// or f16 average is NCCL's sum divided by the world size on the communication stream, inside the
// collective's events.
//
// Errors: a failed NCCL call throws naming the call and ncclGetErrorString; abort() runs
// ncclCommAbort so that no rank stays blocked in a collective when the job ends.
//
// Subgroups (split): ncclCommSplit of this group's communicator, issued like a collective (one NCCL
// call at a time on it). It blocks the host until every rank of this group has called it, so a
// deadline thread ends the job (abort_job) if that takes longer than the group's timeout. The
// subgroup has a communication stream, events and a watchdog of its own.
#include <memory>

#include "distributed/process_group.h"

struct ncclComm;  // nccl.h's ncclComm_t is ncclComm*

namespace octet::distributed {

class NcclProcessGroup : public ProcessGroup {
 public:
  // `device` must be a CUDA device; rank/size from MPI when MPI is initialised, else 0/1.
  NcclProcessGroup(Device device, ProcessGroupOptions options = {});
  ~NcclProcessGroup() override;
  std::string backend() const override { return "nccl"; }
  Device device() const override { return device_; }
  void abort() override;

  struct State;  // the communicator, stream and events (CUDA types stay out of this header)

 protected:
  WorkHandle do_all_reduce(const Tensor& tensor, ReduceOp op) override;
  WorkHandle do_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override;
  WorkHandle do_all_gather(const Tensor& output, const Tensor& input) override;
  WorkHandle do_broadcast(const Tensor& tensor, int root) override;
  WorkHandle do_barrier() override;
  std::shared_ptr<ProcessGroup> do_split(int color, int key) override;

 private:
  // Over `comm`, made by ncclCommSplit: rank `rank` of `size`.
  NcclProcessGroup(Device device, ProcessGroupOptions options, ncclComm* comm, int rank, int size);
  // The communicator's stream, events and watchdog, once `comm` is initialised.
  void start(ncclComm* comm);

  Device device_;
  std::unique_ptr<State> state_;
};

}  // namespace octet::distributed
