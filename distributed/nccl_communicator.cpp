// The NCCL communicator's end (distributed/nccl_communicator.h).
#include "distributed/nccl_communicator.h"

#include <fmt/format.h>

#include <future>
#include <memory>
#include <thread>

#include "core/cuda_stream.h"
#include "core/log.h"

namespace octet::distributed {

Communicator::~Communicator() {
  if (std::uncaught_exceptions() > uncaught_at_creation) {
    abort();
    if (stream != nullptr) cudaStreamDestroy(stream);
    return;
  }
  try {
    cuda::DeviceGuard device(device_index);
    if (comm != nullptr && !aborted) {
      const ncclResult_t result = ncclCommDestroy(comm);
      if (result != ncclSuccess) {
        logging::warn("rank {}: ncclCommDestroy failed: {}", rank, ncclGetErrorString(result));
      }
    }
    // Returns at once; CUDA releases the stream when the work queued on it has run.
    if (stream != nullptr) cudaStreamDestroy(stream);
  } catch (const std::exception& e) {
    logging::warn("rank {}: releasing the NCCL communicator failed: {}", rank, e.what());
  }
}

void Communicator::abort() noexcept {
  std::lock_guard lock(lifetime_mutex);
  if (aborted || comm == nullptr) return;
  aborted = true;
  // ncclCommAbort can wait too: it joins NCCL's proxy thread, which waits for the peers to close
  // their connections to it unless cuMem host memory is on (a driver of CUDA 12.6 or later, NUMA
  // host allocations allowed, NCCL_CUMEM_HOST_ENABLE not 0). So it runs on a thread of its own,
  // waited for at most kAbortGrace; past that it is left running and this returns, so that a
  // failing rank still reaches abort_job and says why the job ends (its MPI_Abort ends the process,
  // the stuck call with it).
  auto finished = std::make_shared<std::promise<void>>();
  std::future<void> done = finished->get_future();
  auto call = [comm = comm, device_index = device_index, rank = rank, finished] {
    try {
      cuda::DeviceGuard device(device_index);
      const ncclResult_t result = ncclCommAbort(comm);
      if (result != ncclSuccess) {
        logging::warn("rank {}: ncclCommAbort failed: {}", rank, ncclGetErrorString(result));
      }
    } catch (const std::exception& e) {
      logging::warn("rank {}: ncclCommAbort failed: {}", rank, e.what());
    }
    finished->set_value();
  };
  try {
    std::thread(call).detach();
  } catch (const std::exception&) {  // no thread for it: the abort runs here, unguarded
    call();
  }
  if (done.wait_for(kAbortGrace) == std::future_status::timeout) {
    logging::error("rank {}: ncclCommAbort has not returned after {} s (NCCL waits there for its peers when its "
                   "cuMem host memory is off); going on without it",
                   rank, kAbortGrace.count());
  }
}

bool Communicator::is_aborted() {
  std::lock_guard lock(lifetime_mutex);
  return aborted;
}

std::string Communicator::async_error() {
  std::string message;
  {
    std::lock_guard lock(lifetime_mutex);
    if (aborted || comm == nullptr) return "";
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
    if (result != ncclSuccess) state = result;
    if (state == ncclSuccess || state == ncclInProgress) return "";
    const char* last = ncclGetLastError(comm);
    message = fmt::format("NCCL reported an error on rank {}: {}{}", rank, ncclGetErrorString(state),
                          last != nullptr && *last != '\0' ? fmt::format(" ({})", last) : std::string());
  }
  abort();
  return message;
}

}  // namespace octet::distributed
