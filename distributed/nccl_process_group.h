#pragma once
// Collectives on CUDA tensors with NCCL (CUDA builds only): one GPU per rank, or several ranks on
// one GPU where the NCCL loaded allows it.
//
// Rank 0 makes the ncclUniqueId and MPI_Bcast sends it to every rank; each then joins with
// ncclCommInitRank on its device, under a deadline of the group's timeout (a rank that never joins
// ends the job, naming the call). At world size 1 (no mpirun) the id is made locally and no MPI is
// involved.
//
// Several ranks on one GPU (every rank given cuda:0, say): the ranks first exchange their hosts and
// GPU UUIDs over MPI. If some share a GPU, NCCL 2.30 or newer with NCCL_MULTI_RANK_GPU_ENABLE=1 is
// needed (an experimental NCCL feature); otherwise every rank throws the same error naming the
// fixes (that variable, a newer NCCL, or the MPI backend), before NCCL is asked. Octet never sets
// the variable itself. Rank 0 logs which ranks share a GPU. distributed/nccl_shared_device.h.
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
#include <string>

#include "distributed/process_group.h"

struct ncclComm;  // nccl.h's ncclComm_t is ncclComm*

namespace octet::distributed {

// Which ranks of the job share a GPU, and whether the NCCL library loaded accepts that
// (distributed/nccl_shared_device.h): `who` is "" when no two ranks share one ("ranks 0-3 share
// one GPU (cuda:0 of rank 0)" otherwise), `refusal` "" when NCCL will accept, else the error with
// its fixes. A collective over MPI_COMM_WORLD when MPI runs (every rank calls it, with its own
// device); nothing to check at world size 1. NcclProcessGroup runs it first; a test may run it to
// skip, saying why, where the group would refuse.
struct SharedGpuCheck {
  std::string who, refusal;
  int nccl_version = 0;  // the loaded library's, as ncclGetVersion gives it
};
SharedGpuCheck check_shared_gpu(Device device);

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
