#include "distributed/launch.h"

#include <mpi.h>

#include <cstdlib>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "distributed/mpi_process_group.h"
#if OCTET_HAS_CUDA
#include "distributed/nccl_process_group.h"
#endif

namespace octet::distributed {
namespace {

std::optional<int> env_int(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  if (*end != '\0') return std::nullopt;
  return static_cast<int>(parsed);
}

// The first of `names` that is set.
std::optional<int> first_env_int(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (auto v = env_int(name)) return v;
  }
  return std::nullopt;
}

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::vector<std::weak_ptr<ProcessGroup>>& registry() {
  static std::vector<std::weak_ptr<ProcessGroup>> groups;
  return groups;
}

void finalize_mpi_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// MPI_THREAD_MULTIPLE: the MPI group's communication thread makes MPI calls while the training
// thread may make its own (init, abort).
void ensure_mpi_initialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  OCTET_CHECK(provided >= MPI_THREAD_MULTIPLE, "MPI provides thread level ", provided,
              " but Octet needs MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE,
              "); use OpenMPI (Debian's openmpi-bin), which provides it");
  // Errors end the job with a message instead of returning codes nobody checks.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  std::atexit(finalize_mpi_at_exit);
}

// Rank and world size the way MPI sees them, once initialised; the environment's otherwise.
void fill_from_mpi(LaunchInfo& info) {
  MPI_Comm_rank(MPI_COMM_WORLD, &info.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &info.world_size);
  // The ranks sharing this node's memory are the ranks on this node.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, info.rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &info.local_rank);
  MPI_Comm_size(node, &info.local_world_size);
  MPI_Comm_free(&node);
}

}  // namespace

LaunchInfo launch_info() {
  LaunchInfo info;
  // OpenMPI's mpirun, then PMI/PMIx launchers (MPICH's Hydra, Slurm's srun).
  const std::optional<int> world = first_env_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"});
  const std::optional<int> rank = first_env_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"});
  if (!world || !rank) return info;
  info.under_mpirun = true;
  info.world_size = *world;
  info.rank = *rank;
  info.local_rank = first_env_int({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}).value_or(0);
  info.local_world_size =
      first_env_int({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}).value_or(1);
  return info;
}

Backend parse_backend(const std::string& name) {
  if (name == "auto") return Backend::Auto;
  if (name == "nccl") return Backend::Nccl;
  if (name == "mpi") return Backend::Mpi;
  OCTET_FAIL("unknown distributed backend '", name, "'; use auto, nccl or mpi");
}

bool mpi_initialized() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

void register_group(const std::shared_ptr<ProcessGroup>& group) {
  std::lock_guard lock(registry_mutex());
  auto& groups = registry();
  std::erase_if(groups, [](const std::weak_ptr<ProcessGroup>& g) { return g.expired(); });
  groups.push_back(group);
}

std::shared_ptr<ProcessGroup> init_process_group(Device device, Backend backend, ProcessGroupOptions options) {
  LaunchInfo info = launch_info();
  if (info.under_mpirun) {
    ensure_mpi_initialized();
    fill_from_mpi(info);
  }
  if (backend == Backend::Auto) backend = device.is_cuda() ? Backend::Nccl : Backend::Mpi;

  std::shared_ptr<ProcessGroup> group;
  if (backend == Backend::Nccl) {
#if OCTET_HAS_CUDA
    OCTET_CHECK(device.is_cuda(), "the NCCL backend needs a CUDA device, not ", device.str(),
                "; use the MPI backend on the CPU");
    // Any device: ranks that share one are checked against what the NCCL loaded allows, on every
    // rank alike, by NcclProcessGroup (distributed/nccl_shared_device.h).
    group = std::make_shared<NcclProcessGroup>(device, options);
#else
    OCTET_FAIL("the NCCL backend needs a CUDA build of Octet (this one has OCTET_CUDA=OFF); use the MPI backend");
#endif
  } else if (mpi_initialized()) {
    group = std::make_shared<MpiProcessGroup>(device, options);
  } else {
    group = std::make_shared<LocalProcessGroup>(device, options);
  }
  logging::set_rank(group->rank(), group->size());
  register_group(group);
  return group;
}

void abort_job(const std::string& reason, int exit_code) {
  const LaunchInfo info = launch_info();
  int rank = info.rank, world = info.world_size;
  if (mpi_initialized()) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
  }
  logging::error("rank {} of {} failed: {}; ending the job", rank, world, reason);
  logging::logger().flush();
  std::vector<std::shared_ptr<ProcessGroup>> live;
  {
    std::lock_guard lock(registry_mutex());
    for (const auto& weak : registry()) {
      if (auto group = weak.lock()) live.push_back(std::move(group));
    }
  }
  // ncclCommAbort first: a rank blocked inside NCCL would otherwise keep its GPU work running.
  for (const auto& group : live) {
    try {
      group->abort();
    } catch (const std::exception& e) {
      logging::error("rank {}: aborting the {} group failed too: {}", rank, group->backend(), e.what());
    }
  }
  logging::logger().flush();
  // mpirun sees a rank call MPI_Abort and kills every other rank of the job.
  if (mpi_initialized()) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

int run_rank_main(const std::function<int()>& body) {
  std::string failure;
  try {
    return body();
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "an exception that is not a std::exception";
  }
  // Alone (no MPI) there is nobody to stop: report and return, so destructors still run.
  if (!mpi_initialized()) {
    logging::error("{}", failure);
    return 1;
  }
  abort_job(failure);
}

}  // namespace octet::distributed
