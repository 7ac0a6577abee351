#pragma once
// Starting a distributed job from mpirun, and ending one that failed.
//
//   mpirun -np 4 build/bin/train_vit --parallel ddp ...
//
// Each process reads its rank, the world size and its local rank (its index among the ranks on its
// node, which picks its GPU) from the variables mpirun sets. A program started without mpirun is
// world size 1: it never initialises MPI, so it needs no MPI at run time.
#include <functional>
#include <memory>
#include <string>

#include "core/device.h"
#include "distributed/process_group.h"

namespace octet::distributed {

struct LaunchInfo {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;  // among the ranks on this node
  bool under_mpirun = false;
};

// From the environment alone (OMPI_COMM_WORLD_* from OpenMPI, PMI_*/PMIX_* from other launchers),
// without initialising MPI: safe to call before anything else, to pick threads or a device.
LaunchInfo launch_info();

enum class Backend { Auto, Nccl, Mpi };
// "auto", "nccl", "mpi"; throws naming the valid values.
Backend parse_backend(const std::string& name);

// The job's process group for `device`:
//   - under mpirun: initialises MPI (MPI_THREAD_MULTIPLE; finalised at exit), then Auto means NCCL
//     for a CUDA device and MPI for the CPU. Under NCCL a rank usually takes its local rank's GPU
//     (cuda:<local_rank>, what train_vit's --device auto picks); ranks given the same GPU need
//     NCCL 2.30 or newer with NCCL_MULTI_RANK_GPU_ENABLE=1, and are refused with the fixes
//     otherwise (nccl_process_group.h). The MPI backend also takes CUDA tensors, staging them
//     through host memory, so any number of ranks may share one GPU with it.
//   - without mpirun: world size 1. NCCL still works there (a one-rank communicator); Mpi and
//     Auto on the CPU give a LocalProcessGroup.
// Also sets the log prefix to "[rank r/w]" and registers the group with abort_job.
std::shared_ptr<ProcessGroup> init_process_group(Device device, Backend backend = Backend::Auto,
                                                 ProcessGroupOptions options = {});

// True once MPI_Init has run in this process (and MPI_Finalize has not).
bool mpi_initialized();

// Ends the whole job from this rank: logs `reason` naming this rank, aborts every live group's
// communicator (ncclCommAbort), then MPI_Abort(MPI_COMM_WORLD, exit_code), which makes mpirun kill
// every other rank. Without MPI it exits this process. Never returns.
[[noreturn]] void abort_job(const std::string& reason, int exit_code = 1);

// Runs `body` as a rank's main: an exception escaping it ends the whole job through abort_job with
// a message naming this rank and the exception, so no other rank waits forever in a collective.
// Returns body's exit code.
int run_rank_main(const std::function<int()>& body);

// Called by init_process_group and ProcessGroup::split (and by nothing else).
void register_group(const std::shared_ptr<ProcessGroup>& group);

}  // namespace octet::distributed
