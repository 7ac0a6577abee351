// NcclProcessGroup: collectives on CUDA tensors with NCCL (the contract is in the header).
//
// Each collective goes through State::launch:
//   1. an event recorded on the caller's current stream; the communication stream waits on it, so
//      NCCL reads the inputs only after the kernels that wrote them;
//   2. the NCCL call, queued on the communication stream (high priority, so that communication
//      kernels are scheduled ahead of compute kernels queued at the same time and overlap them);
//   3. a "done" event on the communication stream, which Work::wait() makes the caller's stream
//      wait on (the host does not block) and Work::synchronize() polls from the host.
// A watchdog thread watches every done event: Work::wait() never blocks the host, so without it a
// rank whose peer hangs would block forever at its next host sync with no message.
#include "distributed/nccl_process_group.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda_stream.h"
#include "core/error.h"
#include "core/host_sync.h"
#include "core/log.h"
#include "core/trace.h"
#include "distributed/launch.h"
#include "distributed/nccl_communicator.h"
#include "distributed/nccl_reduction.h"
#include "distributed/nccl_shared_device.h"
#include "kernels/cuda/elementwise_cuda.h"

namespace octet::distributed {
namespace {

using Clock = std::chrono::steady_clock;

// How often the watchdog looks at the collectives in flight. Short enough that a timeout or a
// network error ends the job promptly, long enough to cost nothing.
constexpr std::chrono::milliseconds kWatchdogPeriod{200};
// How long a trace's GPU-to-host clock anchor is trusted before a new one is taken: the GPU's timer
// and the host's steady clock drift apart slowly, by far less than a microsecond in this time.
constexpr std::chrono::seconds kClockAnchorLifetime{10};

// Throws an octet::Error naming the NCCL call, the rank and NCCL's reason, and what to try (`hint`
// when given, else one chosen from the result).
void check_nccl(ncclResult_t result, const char* call, ncclComm_t comm, int rank, const std::string& hint = "") {
  if (result == ncclSuccess) return;
  std::string detail;
  // NCCL's last-error text is specific for these (which peer, which socket or CUDA call), and for any
  // failure to make a communicator (no communicator yet: the call that just failed set it, e.g.
  // "Multiple Ranks are using the same GPU/Partition. ..."); for the others ncclGetErrorString says
  // it all, and the last error may belong to an earlier call.
  if (comm == nullptr || result == ncclSystemError || result == ncclRemoteError || result == ncclInternalError) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') detail = fmt::format(" (NCCL: {})", last);
  }
  const std::string chosen =
      !hint.empty() ? hint
      : result == ncclRemoteError || result == ncclSystemError
          ? "a peer rank may have died or the network failed; run with NCCL_DEBUG=WARN for details"
      : result == ncclInvalidUsage && comm != nullptr
          ? "every rank must issue the same collectives in the same order with the same sizes; "
            "run with NCCL_DEBUG=WARN for details"
          : "run with NCCL_DEBUG=WARN for NCCL's own log";
  OCTET_FAIL("NcclProcessGroup (rank ", rank, "): ", call, " failed: ", ncclGetErrorString(result), detail, "; ",
             chosen);
}

// Rank and size of the job when MPI runs (mpirun), else a world of one. Free functions because the
// ProcessGroup base, which takes them, is constructed before any member.
int world_rank() {
  int rank = 0;
  if (mpi_initialized()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 1;
  if (mpi_initialized()) MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

std::string bytes_of(const Tensor& t) { return format_bytes(static_cast<double>(t.nbytes())); }

std::string timeout_message(const std::string& what, const Communicator& comm, Clock::duration elapsed) {
  const double seconds = std::chrono::duration<double>(elapsed).count();
  return fmt::format("{} has not finished on rank {} after {:.1f} s (the group's timeout is {} s): a rank died, "
                     "hangs, or issued its collectives in a different order",
                     what, comm.rank, seconds, comm.timeout.count());
}

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<Communicator> comm, std::string what, std::vector<Tensor> tensors,
           std::shared_ptr<cuda::Event> done, bool host_waits)
      : comm_(std::move(comm)),
        what_(std::move(what)),
        tensors_(std::move(tensors)),
        done_(std::move(done)),
        host_waits_(host_waits),
        issued_(Clock::now()) {}

  // Device memory is freed in compute-stream order (core/cuda_memory.h). Unless the compute stream
  // was made to wait for this collective, a tensor released now (ours, or the caller's later)
  // could be handed to a new allocation while NCCL still reads or writes it: order the compute
  // stream after the collective first. No host block; a no-op once the collective is done.
  ~NcclWork() override {
    if (compute_stream_waited_ || synchronized_) return;
    try {
      if (!done_->query()) done_->wait_on(cuda::compute_stream(comm_->device_index));
    } catch (const std::exception& e) {
      logging::warn("rank {}: ordering the compute stream after {} failed: {}", comm_->rank, what_, e.what());
    }
  }

  // The caller's current stream waits for the collective; the host returns at once. A barrier
  // blocks the host instead, as torch.distributed.barrier does.
  void wait() override {
    if (host_waits_) {
      synchronize();
      return;
    }
    const cudaStream_t caller = cuda::current_stream(comm_->device_index);
    done_->wait_on(caller);
    if (caller == cuda::compute_stream(comm_->device_index)) compute_stream_waited_ = true;
  }

  // Polls rather than cudaEventSynchronize so that a collective that never finishes (a dead or
  // hung peer) or an error NCCL reports ends the job with a message instead of blocking forever.
  void synchronize() override {
    const host_sync::Scope counted(host_sync::Kind::synchronize);  // the host waits (core/host_sync.h)
    auto pause = std::chrono::microseconds(5);
    while (!done_->query()) {
      if (const std::string error = comm_->async_error(); !error.empty()) {
        OCTET_FAIL(what_, ": ", error);
      }
      const Clock::duration elapsed = Clock::now() - issued_;
      if (elapsed > comm_->timeout) abort_job(timeout_message(what_, *comm_, elapsed));
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    synchronized_ = true;
  }

  bool is_completed() override { return done_->query(); }
  std::string describe() const override { return what_; }

 private:
  std::shared_ptr<Communicator> comm_;
  std::string what_;
  std::vector<Tensor> tensors_;  // held so their memory stays theirs while NCCL works on it
  std::shared_ptr<cuda::Event> done_;
  bool host_waits_;
  Clock::time_point issued_;
  bool compute_stream_waited_ = false, synchronized_ = false;
};

// Ends the job when a collective outlives the group's timeout, or NCCL reports an error, while no
// host thread is waiting on it.
class Watchdog {
 public:
  explicit Watchdog(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)), thread_([this] { run(); }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void watch(std::shared_ptr<cuda::Event> done, std::string what) {
    std::lock_guard lock(mutex_);
    pending_.push_back({std::move(done), std::move(what), Clock::now()});
  }

 private:
  struct Entry {
    std::shared_ptr<cuda::Event> done;
    std::string what;
    Clock::time_point issued;
  };

  void run() {
    // This thread's CUDA calls must go to the group's device: the first CUDA call of a thread
    // with no device set would create a context (and take memory) on device 0.
    if (cudaSetDevice(comm_->device_index) != cudaSuccess) {
      logging::warn("rank {}: the NCCL watchdog cannot use cuda:{}; collectives are not watched", comm_->rank,
                    comm_->device_index);
      return;
    }
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      wake_.wait_for(lock, kWatchdogPeriod, [this] { return stopping_; });
      if (stopping_) break;
      std::vector<Entry> checking;
      checking.swap(pending_);
      lock.unlock();
      const std::string failure = check(checking);
      if (!failure.empty()) abort_job(failure);
      lock.lock();
      // Unfinished entries go back beside those watch() added meanwhile.
      pending_.insert(pending_.end(), std::make_move_iterator(checking.begin()),
                      std::make_move_iterator(checking.end()));
    }
  }

  // Drops the finished entries; returns why the job must end, or "".
  std::string check(std::vector<Entry>& entries) {
    try {
      std::erase_if(entries, [](const Entry& e) { return e.done->query(); });
    } catch (const std::exception& e) {
      return fmt::format("the NCCL watchdog on rank {} cannot query the device: {}", comm_->rank, e.what());
    }
    if (entries.empty()) return "";
    if (std::string error = comm_->async_error(); !error.empty()) {
      return fmt::format("{} (while {} was in flight)", error, entries.front().what);
    }
    const Clock::time_point now = Clock::now();
    for (const Entry& e : entries) {
      if (now - e.issued > comm_->timeout) return timeout_message(e.what, *comm_, now - e.issued);
    }
    return "";
  }

  std::shared_ptr<Communicator> comm_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<Entry> pending_;
  std::thread thread_;  // last: started once the members above exist
};

// Ends the job (abort_job) with `message` unless destroyed within `timeout`: for a host call that
// blocks until every rank has joined it (ncclCommSplit), where no watchdog sees a missing rank.
class Deadline {
 public:
  Deadline(std::chrono::seconds timeout, std::string message)
      : thread_([this, timeout, message = std::move(message)] {
          std::unique_lock lock(mutex_);
          if (wake_.wait_for(lock, timeout, [this] { return done_; })) return;
          lock.unlock();
          abort_job(message);
        }) {}
  ~Deadline() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;  // last: started once the members above exist
};

// A GPU timestamp (an event) and trace::now_us() at the same moment, so that the times of CUDA
// events can be drawn on the trace's host clock.
struct ClockAnchor {
  std::shared_ptr<cuda::Event> event;
  int64_t host_us = 0;
  Clock::time_point taken;
};

}  // namespace

// Every rank of the job learns every rank's host and GPU over MPI; all of them run this at the same
// point (the job's ranks make the world group together), so all reach the same verdict.
SharedGpuCheck check_shared_gpu(Device device) {
  SharedGpuCheck check;
  const int rank = world_rank(), size = world_size();
  check_nccl(ncclGetVersion(&check.nccl_version), "ncclGetVersion", nullptr, rank);
  if (size == 1) return check;
  RankDevice mine;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  mine.host = std::hash<std::string>{}(host);
  cudaDeviceProp properties{};
  cuda::check(cudaGetDeviceProperties(&properties, device.index), "cudaGetDeviceProperties");
  std::copy(std::begin(properties.uuid.bytes), std::end(properties.uuid.bytes), mine.uuid.begin());
  mine.index = device.index;
  std::vector<RankDevice> all(static_cast<size_t>(size));
  OCTET_CHECK(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, MPI_COMM_WORLD) ==
                  MPI_SUCCESS,
              "NcclProcessGroup (rank ", rank, "): MPI_Allgather of the ranks' GPUs failed");
  const std::vector<int> sharing = largest_device_sharing(all);
  if (sharing.size() < 2) return check;
  check.who = fmt::format("{} share one GPU (cuda:{} of rank {})", describe_ranks(sharing),
                          all[static_cast<size_t>(sharing.front())].index, sharing.front());
  check.refusal = nccl_shared_device_refusal(check.nccl_version, std::getenv(kNcclMultiRankGpuVariable), check.who);
  return check;
}

struct NcclProcessGroup::State {
  std::shared_ptr<Communicator> comm;
  // Recorded on the caller's stream before each collective; one event serves them all because the
  // comm stream's cudaStreamWaitEvent takes the event's state at the moment it is called.
  std::unique_ptr<cuda::Event> inputs_ready;
  // The barrier all-reduces this one zero.
  Tensor barrier_buffer;
  // Serialises issuing: an NCCL communicator takes one call at a time, and inputs_ready is shared.
  std::mutex issue_mutex;
  // Traces only: an idle stream to take clock anchors on, and the latest anchor.
  cudaStream_t anchor_stream = nullptr;
  std::shared_ptr<const ClockAnchor> anchor;
  std::unique_ptr<Watchdog> watchdog;

  ~State() {
    watchdog.reset();  // stop watching before the communicator may go
    if (anchor_stream != nullptr) cudaStreamDestroy(anchor_stream);
  }

  using NcclCall = std::function<ncclResult_t(ncclComm_t, cudaStream_t)>;
  // Work queued on the communication stream right after the NCCL call, inside the collective's
  // events (the division of a bf16/f16 average).
  using Epilogue = std::function<void(cudaStream_t)>;

  // Queues `call` (then `epilogue`, if any) on the communication stream after the caller's queued
  // work (see the top of the file). `tensors` stay alive as long as the Work; `host_waits` makes
  // Work::wait() block the host.
  WorkHandle launch(std::string what, const char* call_name, std::vector<Tensor> tensors, bool host_waits,
                    const NcclCall& call, const Epilogue& epilogue = nullptr) {
    std::lock_guard lock(issue_mutex);
    OCTET_CHECK(!comm->is_aborted(), what, " on rank ", comm->rank,
                ": this NCCL process group was aborted (abort(), an NCCL error or a timeout) and runs no more "
                "collectives; make a new process group");
    cuda::DeviceGuard device(comm->device_index);
    const bool tracing = trace::enabled();
    // Events first: nothing may fail between queueing the collective and recording its end.
    auto done = std::make_shared<cuda::Event>(/*timing=*/tracing);
    std::shared_ptr<cuda::Event> started;
    std::shared_ptr<const ClockAnchor> clock;
    if (tracing) {
      started = std::make_shared<cuda::Event>(/*timing=*/true);
      clock = clock_anchor();
    }

    inputs_ready->record(cuda::current_stream(comm->device_index));
    inputs_ready->wait_on(comm->stream);
    if (started) started->record(comm->stream);
    check_nccl(call(comm->comm, comm->stream), call_name, comm->comm, comm->rank);
    // The collective is queued: its end is recorded and its tensors held even if the epilogue
    // fails (then the Work, dropped as the error leaves, orders the compute stream after it).
    std::exception_ptr epilogue_failed;
    if (epilogue) {
      try {
        epilogue(comm->stream);
      } catch (...) {
        epilogue_failed = std::current_exception();
      }
    }
    done->record(comm->stream);

    if (tracing) defer_trace_span(what, std::move(clock), std::move(started), done);
    watchdog->watch(done, what);
    auto work = std::make_shared<NcclWork>(comm, std::move(what), std::move(tensors), std::move(done), host_waits);
    if (epilogue_failed) std::rethrow_exception(epilogue_failed);
    return work;
  }

  // The current clock anchor, taking a new one when there is none or it has grown old. The event
  // goes on an idle stream of its own, so it runs at once and the host's wait for it is short (it
  // would wait behind queued collectives on the comm stream); the host time is the midpoint of
  // the record-to-completion window.
  std::shared_ptr<const ClockAnchor> clock_anchor() {
    if (anchor != nullptr && Clock::now() - anchor->taken < kClockAnchorLifetime) return anchor;
    if (anchor_stream == nullptr) {
      cuda::check(cudaStreamCreateWithFlags(&anchor_stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    }
    auto fresh = std::make_shared<ClockAnchor>();
    fresh->event = std::make_shared<cuda::Event>(/*timing=*/true);
    const int64_t before_us = trace::now_us();
    fresh->event->record(anchor_stream);
    fresh->event->synchronize();
    fresh->host_us = (before_us + trace::now_us()) / 2;
    fresh->taken = Clock::now();
    anchor = fresh;
    return anchor;
  }

  // A span on the "gpu comm" track from `started` to `done`, resolved when the trace is written.
  static void defer_trace_span(const std::string& what, std::shared_ptr<const ClockAnchor> clock,
                               std::shared_ptr<cuda::Event> started, std::shared_ptr<cuda::Event> done) {
    trace::defer([what, clock = std::move(clock), started = std::move(started),
                  done = std::move(done)]() -> std::vector<trace::Span> {
      try {
        // A collective still running when the trace is written has no end to draw; the writer
        // must not wait on it (it may never finish).
        if (!done->query()) return {};
        const auto on_host_clock = [&](const cuda::Event& e) {
          return clock->host_us + std::llround(1000.0 * e.elapsed_ms(*clock->event));
        };
        return {trace::Span{what, "comm", "gpu comm", on_host_clock(*started), on_host_clock(*done)}};
      } catch (const std::exception&) {
        return {};  // a device in error: the trace goes without this span
      }
    });
  }
};

NcclProcessGroup::NcclProcessGroup(Device device, ProcessGroupOptions options)
    : ProcessGroup(world_rank(), world_size(), options), device_(device), state_(std::make_unique<State>()) {
  OCTET_CHECK(device.is_cuda(), "NcclProcessGroup: NCCL runs on CUDA devices, not ", device.str(),
              "; pass Device::cuda(local_rank), or use the MPI backend for CPU tensors");
  OCTET_CHECK(cuda::is_available() && device.index < cuda::device_count(), "NcclProcessGroup: ", device.str(),
              " does not exist on this machine (", cuda::device_count(), " CUDA devices visible)",
              "; pass a device below that count, or check CUDA_VISIBLE_DEVICES");
  cuda::DeviceGuard guard(device.index);

  // Ranks sharing a GPU: refused here, on every rank alike, when the NCCL loaded will refuse them,
  // with the fixes in the message (distributed/nccl_shared_device.h); rank 0 logs who shares.
  const SharedGpuCheck shared = check_shared_gpu(device);
  OCTET_CHECK(shared.refusal.empty(), "NcclProcessGroup (rank ", rank(), "): ", shared.refusal);
  const std::string& sharing = shared.who;
  if (!sharing.empty() && rank() == 0) {
    const char* max_ctas = std::getenv("NCCL_MAX_CTAS");
    logging::info("NCCL {}: {}, with {}={} (an experimental NCCL feature: NVIDIA supports up to 2 ranks per GPU "
                  "with its default settings; {})",
                  nccl_version_string(shared.nccl_version), sharing, kNcclMultiRankGpuVariable,
                  std::getenv(kNcclMultiRankGpuVariable),
                  max_ctas ? fmt::format("NCCL_MAX_CTAS={} here", max_ctas)
                           : std::string("more may need NCCL_MAX_CTAS lowered"));
  }

  // Rank 0 makes the id that names this communicator; every other rank gets its bytes over MPI.
  ncclUniqueId id{};
  if (rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", nullptr, rank());
  if (size() > 1) {
    OCTET_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD) == MPI_SUCCESS, "NcclProcessGroup (rank ",
                rank(), "): MPI_Bcast of the ncclUniqueId failed");
  }
  ncclComm_t comm = nullptr;
  {
    // ncclCommInitRank returns once every rank has joined: a rank that died or never calls it would
    // leave the others here, where no watchdog looks.
    const Deadline deadline(
        options.timeout,
        fmt::format("ncclCommInitRank of {} ranks has not finished on rank {} after {} s: a rank died or hangs{}",
                    size(), rank(), options.timeout.count(),
                    sharing.empty() ? "" : fmt::format(" ({}: NVIDIA's note for more than 2 ranks on one GPU is to "
                                                       "lower NCCL_MAX_CTAS)", sharing)));
    check_nccl(ncclCommInitRank(&comm, size(), id, rank()), "ncclCommInitRank", nullptr, rank(),
               sharing.empty() ? ""
                               : sharing + ", NCCL_MULTI_RANK_GPU_ENABLE is set, and NCCL refused all the same "
                                           "(its words are in the parentheses); --dist-backend mpi shares a GPU "
                                           "without NCCL");
  }
  start(comm);
}

NcclProcessGroup::NcclProcessGroup(Device device, ProcessGroupOptions options, ncclComm* comm, int rank, int size)
    : ProcessGroup(rank, size, options), device_(device), state_(std::make_unique<State>()) {
  start(comm);
}

void NcclProcessGroup::start(ncclComm* nccl_comm) {
  // Owned from here on (destroyed with the last holder). Messages name the rank in the job, as the
  // log prefix does, also for a subgroup.
  auto comm = std::make_shared<Communicator>(device_.index, world_rank(), options().timeout);
  comm->comm = nccl_comm;
  cuda::DeviceGuard guard(device_.index);
  // The highest priority the device offers (the numerically lowest value): communication kernels
  // are then scheduled ahead of compute kernels that are ready at the same time, so a bucket's
  // all-reduce starts as soon as its gradients are, instead of queueing behind the backward pass.
  int least_priority = 0, greatest_priority = 0;
  cuda::check(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority),
              "cudaDeviceGetStreamPriorityRange");
  cuda::check(cudaStreamCreateWithPriority(&comm->stream, cudaStreamNonBlocking, greatest_priority),
              "cudaStreamCreateWithPriority");

  state_->comm = comm;
  state_->inputs_ready = std::make_unique<cuda::Event>();
  state_->barrier_buffer = zeros({1}, DType::f32, device_);
  state_->watchdog = std::make_unique<Watchdog>(comm);
}

// ncclCommSplit returns once every rank of this group has called it. Issued under the issue mutex,
// like a collective, so no other NCCL call on the communicator runs beside it.
std::shared_ptr<ProcessGroup> NcclProcessGroup::do_split(int color, int key) {
  Communicator& parent = *state_->comm;
  const std::string what = fmt::format("split(color {}, key {}) of an NCCL group of {} ranks", color, key, size());
  ncclComm_t child = nullptr;
  {
    std::lock_guard lock(state_->issue_mutex);
    OCTET_CHECK(!parent.is_aborted(), what, " on rank ", parent.rank, ": this NCCL process group was aborted (abort(), "
                "an NCCL error or a timeout) and runs no more collectives; make a new process group");
    cuda::DeviceGuard device(device_.index);
    const Deadline deadline(options().timeout, fmt::format("{} has not finished on rank {} after {} s: a rank died, "
                                                           "hangs, or issued its collectives in a different order",
                                                           what, parent.rank, options().timeout.count()));
    // A null config: the subgroup inherits this communicator's (blocking, as ncclCommInitRank made it).
    check_nccl(ncclCommSplit(parent.comm, nccl_split_color(color), key, &child, nullptr), "ncclCommSplit", parent.comm,
               parent.rank);
  }
  if (child == nullptr) return nullptr;  // NCCL_SPLIT_NOCOLOR
  int rank = 0, size = 0;
  const ncclResult_t ranked = ncclCommUserRank(child, &rank);
  const ncclResult_t counted = ranked == ncclSuccess ? ncclCommCount(child, &size) : ranked;
  if (counted != ncclSuccess) ncclCommDestroy(child);
  check_nccl(counted, "ncclCommUserRank/ncclCommCount", nullptr, parent.rank);
  return std::shared_ptr<NcclProcessGroup>(new NcclProcessGroup(device_, options(), child, rank, size));
}

NcclProcessGroup::~NcclProcessGroup() = default;

void NcclProcessGroup::abort() { state_->comm->abort(); }

namespace {

// The average's division after NCCL's sum (distributed/nccl_reduction.h): `t` /= the world size on
// the communication stream, in f32 with one rounding; null when NCCL computes the whole reduction.
NcclProcessGroup::State::Epilogue division_after_sum(const NcclReduction& reduction, const Tensor& t, int world) {
  if (!reduction.divide_by_world_size) return nullptr;
  return [t, world](cudaStream_t stream) {
    cuda::StreamGuard on_comm_stream(t.device().index, stream);
    kernels::cuda::div_scalar_(t, static_cast<double>(world));
  };
}

}  // namespace

WorkHandle NcclProcessGroup::do_all_reduce(const Tensor& tensor, ReduceOp op) {
  const NcclReduction reduction = nccl_reduction(op, tensor.dtype(), size(), "all_reduce");
  void* data = tensor.data_ptr();
  const size_t count = static_cast<size_t>(tensor.numel());
  return state_->launch(
      fmt::format("all_reduce({}) of {}", reduce_op_name(op), bytes_of(tensor)), "ncclAllReduce", {tensor},
      /*host_waits=*/false,
      [&](ncclComm_t comm, cudaStream_t stream) {
        return ncclAllReduce(data, data, count, reduction.type, reduction.op, comm, stream);
      },
      division_after_sum(reduction, tensor, size()));
}

WorkHandle NcclProcessGroup::do_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) {
  const NcclReduction reduction = nccl_reduction(op, input.dtype(), size(), "reduce_scatter");
  const void* send = input.data_ptr();
  void* receive = output.data_ptr();
  const size_t receive_count = static_cast<size_t>(output.numel());
  return state_->launch(
      fmt::format("reduce_scatter({}) of {}", reduce_op_name(op), bytes_of(input)), "ncclReduceScatter",
      {output, input}, /*host_waits=*/false,
      [&](ncclComm_t comm, cudaStream_t stream) {
        return ncclReduceScatter(send, receive, receive_count, reduction.type, reduction.op, comm, stream);
      },
      division_after_sum(reduction, output, size()));
}

// Gathers and broadcasts combine nothing, so they move raw bytes (ncclUint8, count in bytes): one
// path for every dtype, FP8 included, at the same speed as a typed call.
WorkHandle NcclProcessGroup::do_all_gather(const Tensor& output, const Tensor& input) {
  const void* send = input.data_ptr();
  void* receive = output.data_ptr();
  const size_t send_bytes = input.nbytes();
  return state_->launch(fmt::format("all_gather of {}", bytes_of(output)), "ncclAllGather", {output, input},
                        /*host_waits=*/false, [&](ncclComm_t comm, cudaStream_t stream) {
                          return ncclAllGather(send, receive, send_bytes, ncclUint8, comm, stream);
                        });
}

WorkHandle NcclProcessGroup::do_broadcast(const Tensor& tensor, int root) {
  void* data = tensor.data_ptr();
  const size_t bytes = tensor.nbytes();
  return state_->launch(fmt::format("broadcast from {} of {}", root, bytes_of(tensor)), "ncclBroadcast", {tensor},
                        /*host_waits=*/false, [&](ncclComm_t comm, cudaStream_t stream) {
                          return ncclBroadcast(data, data, bytes, ncclUint8, root, comm, stream);
                        });
}

// A one-element all-reduce: it completes on a rank only once every rank has issued it. Its wait()
// blocks the host, as torch.distributed.barrier does.
WorkHandle NcclProcessGroup::do_barrier() {
  void* data = state_->barrier_buffer.data_ptr();
  return state_->launch("barrier", "ncclAllReduce", {state_->barrier_buffer}, /*host_waits=*/true,
                        [&](ncclComm_t comm, cudaStream_t stream) {
                          return ncclAllReduce(data, data, 1, ncclFloat32, ncclSum, comm, stream);
                        });
}

}  // namespace octet::distributed
