#pragma once
// The NCCL communicator behind an NcclProcessGroup, with its stream, and how it ends: destroyed when
// every holder is done with it, aborted when a rank fails. Internal to the NCCL backend
// (distributed/nccl_process_group.cpp); built only with CUDA.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <exception>
#include <mutex>
#include <string>

namespace octet::distributed {

// How long ncclCommAbort may take before Communicator::abort goes on without it.
inline constexpr std::chrono::seconds kAbortGrace{15};

// The communicator and its stream. The group and every Work it returned share it, and the last of
// them destroys it: a Work synchronised after its group is gone still asks the communicator for
// errors, and its collective may still be running on the stream.
struct Communicator {
  Communicator(int device_index, int rank, std::chrono::seconds timeout)
      : device_index(device_index), rank(rank), timeout(timeout), uncaught_at_creation(std::uncaught_exceptions()) {}
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // ncclCommDestroy is an intra-node collective: it returns only when every rank of the node that
  // shares the communicator destroys it too, and after the collectives queued on it have finished.
  // A rank whose exception unwinds past its group (a failing rank, on its way to run_rank_main's
  // abort_job) must not make that call: its peers are blocked in a collective it will never join,
  // so it would wait for them forever and never reach MPI_Abort (the 2026-11-28 GPU run: all three
  // fault_test.sh cases over NCCL hung until the 120 s timeout, the failing rank silent). It aborts
  // the communicator instead.
  ~Communicator();

  // ncclCommAbort: NCCL's kernels stop waiting for peers and return, so nothing stays blocked in
  // this communicator. Idempotent; never throws (abort_job calls it on its way out). It can wait
  // too (see the definition): past kAbortGrace it is left running and this returns.
  void abort() noexcept;

  bool is_aborted();

  // An error NCCL found while collectives ran (a peer died, the network failed), or "" if none.
  // The communicator cannot be used after one, so it is aborted here.
  std::string async_error();

  const int device_index, rank;
  const std::chrono::seconds timeout;
  const int uncaught_at_creation;  // std::uncaught_exceptions() when made: more at destruction = unwinding
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;

 private:
  // Guards `aborted` and the quick queries (ncclCommGetAsyncError, ncclGetLastError) against
  // abort(), which frees the communicator. Collectives are not issued under it: abort() must be
  // able to run while another thread is inside an NCCL call that waits for a peer.
  std::mutex lifetime_mutex;
  bool aborted = false;
};

}  // namespace octet::distributed
