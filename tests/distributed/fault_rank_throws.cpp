// The program behind fault_test.sh: one rank throws while the others wait in a collective that can
// never finish without it. run_rank_main must end the whole job (MPI_Abort), naming the rank and the
// exception, long before the group's collective timeout (300 s by default) would.
//
//   mpirun -np 4 fault_rank_throws FAILING_RANK all_reduce|barrier|broadcast|in_flight|subgroup [mpi|nccl]
//
// mpi (the default): the MPI backend on the CPU. nccl: the NCCL backend with every rank on GPU 0, the
// case of tools/gpu_check.sh's nccl_ranks stage (NCCL 2.30 or newer with
// NCCL_MULTI_RANK_GPU_ENABLE=1); the others then wait inside NCCL kernels on the GPU.
// broadcast uses the failing rank as its root, so the others wait on the rank that died.
// in_flight: the failing rank throws with an all_reduce issued but not waited on (a DDP bucket in
// flight during backward), which the others join only 2 s later; its group is destroyed while the
// exception unwinds, and that must not keep the job from ending.
// subgroup: the ranks split into pairs (ProcessGroup::split); the failing rank's partner waits in an
// all_reduce of their pair, the other ranks in a world barrier.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include "core/tensor.h"
#include "distributed/launch.h"
#include "distributed/process_group.h"

namespace {

using namespace octet;
using namespace octet::distributed;

int usage(const char* program) {
  std::fprintf(stderr, "usage: %s FAILING_RANK all_reduce|barrier|broadcast|in_flight|subgroup [mpi|nccl]\n",
               program);
  return 2;
}

int run(int failing_rank, const std::string& stuck_in, bool nccl) {
  // The default options on purpose: their timeout is far beyond the 60 s the job has to end in,
  // so only the failing rank's abort can end it in time.
  const Device device = nccl ? Device::cuda(0) : Device::cpu();
  const std::shared_ptr<ProcessGroup> group = init_process_group(device, nccl ? Backend::Nccl : Backend::Mpi);
  const int rank = group->rank(), n = group->size();
  if (failing_rank < 0 || failing_rank >= n) {
    throw std::invalid_argument("FAILING_RANK " + std::to_string(failing_rank) + " is not a rank of " +
                                std::to_string(n));
  }

  // A few healthy steps first, so the failure comes in the middle of a working job.
  for (int step = 0; step < 3; ++step) {
    const Tensor t = full({1001}, rank + 1.0, DType::f32, device);
    group->all_reduce(t, ReduceOp::Sum)->wait();
    const double expected = n * (n + 1) / 2.0;
    for (double v : t.to_vector<double>()) {
      if (v != expected) throw std::runtime_error("a healthy all_reduce gave " + std::to_string(v));
    }
  }

  // The collectives that cannot finish are synchronize()d: over NCCL, wait() only makes the compute
  // stream wait and returns at once, so the rank would go on (and print that the collective
  // finished) while its GPU waits; synchronize() blocks the host, as a loss.item() after the step would.
  const Tensor t = full({1001}, rank + 1.0, DType::f32, device);
  if (stuck_in == "subgroup") {
    const std::shared_ptr<ProcessGroup> pair = group->split(rank / 2, rank);
    pair->all_reduce(t)->wait();  // a healthy one first
    if (rank == failing_rank) throw std::runtime_error("injected failure");
    if (rank / 2 == failing_rank / 2) {
      pair->all_reduce(t)->synchronize();
    } else {
      group->barrier()->synchronize();
    }
  } else if (stuck_in == "in_flight") {
    if (rank == failing_rank) {
      const WorkHandle in_flight = group->all_reduce(t);
      throw std::runtime_error("injected failure");
    }
    std::this_thread::sleep_for(std::chrono::seconds(2));
    group->all_reduce(t)->synchronize();
    group->barrier()->synchronize();  // never completes: the failing rank is gone
  } else if (rank == failing_rank) {
    throw std::runtime_error("injected failure");
  } else if (stuck_in == "all_reduce") {
    group->all_reduce(t)->synchronize();
  } else if (stuck_in == "broadcast") {
    group->broadcast(t, failing_rank)->synchronize();
  } else {
    group->barrier()->synchronize();
  }
  std::fprintf(stderr, "rank %d: the %s finished without rank %d: the fault was not handled\n", rank,
               stuck_in.c_str(), failing_rank);
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) return usage(argv[0]);
  const std::string stuck_in = argv[2], backend = argc == 4 ? argv[3] : "mpi";
  if ((stuck_in != "all_reduce" && stuck_in != "barrier" && stuck_in != "broadcast" && stuck_in != "in_flight" &&
       stuck_in != "subgroup") ||
      (backend != "mpi" && backend != "nccl")) {
    return usage(argv[0]);
  }
  const int failing_rank = std::atoi(argv[1]);
  return run_rank_main([&] { return run(failing_rank, stuck_in, backend == "nccl"); });
}
