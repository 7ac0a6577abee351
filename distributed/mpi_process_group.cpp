#include "distributed/mpi_process_group.h"

#include <mpi.h>

#include <climits>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "core/trace.h"
#include "distributed/launch.h"

namespace octet::distributed {
namespace {

// ---- bf16 and f16 reductions ---------------------------------------------------------------------
// MPI has no 16-bit floating types: they travel as MPI_UINT16_T and these operations add (or take
// the max of) each pair in f32 and round once to the format, as NCCL does.

template <DType D, bool Max>
void reduce_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  constexpr int kChunk = 1024;
  float a[kChunk], b[kChunk];
  auto* src = static_cast<uint16_t*>(in);
  auto* dst = static_cast<uint16_t*>(inout);
  for (int start = 0; start < *len; start += kChunk) {
    const int n = std::min(kChunk, *len - start);
    convert_elements(src + start, D, a, DType::f32, n);
    convert_elements(dst + start, D, b, DType::f32, n);
    for (int i = 0; i < n; ++i) b[i] = Max ? (a[i] > b[i] ? a[i] : b[i]) : a[i] + b[i];
    convert_elements(b, DType::f32, dst + start, D, n);
  }
}

struct HalfOps {
  MPI_Op bf16_sum, bf16_max, f16_sum, f16_max;
  HalfOps() {
    MPI_Op_create(&reduce_16bit<DType::bf16, false>, 1, &bf16_sum);
    MPI_Op_create(&reduce_16bit<DType::bf16, true>, 1, &bf16_max);
    MPI_Op_create(&reduce_16bit<DType::f16, false>, 1, &f16_sum);
    MPI_Op_create(&reduce_16bit<DType::f16, true>, 1, &f16_max);
  }
};

const HalfOps& half_ops() {
  static const HalfOps ops;  // after MPI_Init (the first group's constructor); MPI frees them at finalize
  return ops;
}

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::e4m3:
    case DType::e5m2:
    case DType::u8: return MPI_UINT8_T;
  }
  OCTET_FAIL("MpiProcessGroup: no MPI type for ", dtype_name(d));
}

MPI_Op mpi_op(ReduceOp op, DType d) {
  const bool max = op == ReduceOp::Max;  // Avg is a Sum, then a division
  if (d == DType::bf16) return max ? half_ops().bf16_max : half_ops().bf16_sum;
  if (d == DType::f16) return max ? half_ops().f16_max : half_ops().f16_sum;
  return max ? MPI_MAX : MPI_SUM;
}

// Divides a host buffer of `n` elements by the world size in place (the Avg after a Sum).
void divide(void* data, DType d, int64_t n, int world) {
  switch (d) {
    case DType::f32: {
      auto* p = static_cast<float*>(data);
      for (int64_t i = 0; i < n; ++i) p[i] /= static_cast<float>(world);
      return;
    }
    case DType::f64: {
      auto* p = static_cast<double*>(data);
      for (int64_t i = 0; i < n; ++i) p[i] /= static_cast<double>(world);
      return;
    }
    case DType::i64: {
      auto* p = static_cast<int64_t*>(data);
      for (int64_t i = 0; i < n; ++i) p[i] /= world;
      return;
    }
    default: {  // bf16, f16: through f32, one rounding
      std::vector<float> wide(static_cast<size_t>(n));
      convert_elements(data, d, wide.data(), DType::f32, n);
      for (float& v : wide) v /= static_cast<float>(world);
      convert_elements(wide.data(), DType::f32, data, d, n);
    }
  }
}

int checked_count(int64_t n, const char* op) {
  OCTET_CHECK(n <= INT_MAX, op, ": ", n, " elements is more than MPI's int count allows (", INT_MAX,
              "); split the call into smaller tensors");
  return static_cast<int>(n);
}

// Runs a nonblocking MPI call to completion by polling, yielding, then sleeping between polls: a
// blocking MPI collective would spin a core that backward needs while it waits for the other ranks.
void complete(MPI_Request request) {
  int done = 0;
  for (int polls = 0;; ++polls) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (polls < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

// ---- the communication thread ---------------------------------------------------------------------

struct Task {
  std::function<void()> run;  // MPI calls on host buffers
  std::string what;
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::exception_ptr error;
};

class MpiWork;

// The results of the group's collectives on CUDA tensors that are still to be copied back into device
// memory, in issue order. A staged collective's result reaches its tensor only by a copy, so the group
// delivers them the way NCCL's one communication stream orders collectives: waiting on a collective
// (or a barrier) delivers every earlier result too, and a handle the caller dropped still gets its
// result delivered by the next wait. FSDP relies on that: it keeps only the last handle of a unit's
// gathers and waits on it. Shared by the group and its works; touched by the issuing threads only.
struct StagedResults {
  std::mutex mutex;
  std::deque<std::shared_ptr<MpiWork>> pending;  // issue order; each holds a result not yet copied back
  uint64_t issued = 0;                            // sequence numbers, from 1
  // Copies back every pending result issued up to `through`, oldest first, on the caller's stream.
  void deliver_through(uint64_t through);
};

class MpiWork : public Work {
 public:
  // `device_tensor` and `host` are set when a CUDA tensor was staged: the result is copied back
  // from `host` into `device_tensor` when this work, or a later one of the group, is waited on.
  MpiWork(std::shared_ptr<Task> task, std::chrono::seconds timeout, int rank, Tensor device_tensor, Tensor host,
          std::shared_ptr<StagedResults> staged, uint64_t sequence)
      : task_(std::move(task)),
        timeout_(timeout),
        rank_(rank),
        device_tensor_(std::move(device_tensor)),
        host_(std::move(host)),
        staged_(std::move(staged)),
        sequence_(sequence) {}

  void wait() override {
    wait_for_thread();  // the thread runs collectives in issue order: every earlier one is done too
    staged_->deliver_through(sequence_);
  }
  // Whether this work's result is still to be copied back, and overlaps `t`'s bytes.
  bool pending_result_overlaps(const Tensor& t) const {
    if (!device_tensor_.defined() || copied_back_ || !t.defined() || t.storage() != device_tensor_.storage()) {
      return false;
    }
    const size_t a = device_tensor_.storage_offset(), b = t.storage_offset();
    return a < b + t.nbytes() && b < a + device_tensor_.nbytes();
  }
  bool result_pending() const { return device_tensor_.defined() && !copied_back_; }
  uint64_t sequence() const { return sequence_; }
  void synchronize() override { wait(); }
  bool is_completed() override {
    std::lock_guard lock(task_->mutex);
    return task_->done;
  }
  std::string describe() const override { return task_->what; }

  // Under StagedResults::mutex.
  void copy_back() {
    wait_for_thread();
    device_tensor_.copy_(host_);  // on the caller's current stream
    copied_back_ = true;
    host_ = Tensor();  // the pinned buffer goes back now
  }

 private:
  void wait_for_thread() {
    std::unique_lock lock(task_->mutex);
    if (!task_->finished.wait_for(lock, timeout_, [&] { return task_->done; })) {
      lock.unlock();
      abort_job(fmt::format("{} did not finish within {} s on rank {}: another rank has died, hangs, or issued "
                            "different collectives",
                            task_->what, timeout_.count(), rank_));
    }
    if (task_->error) std::rethrow_exception(task_->error);
  }

  std::shared_ptr<Task> task_;
  std::chrono::seconds timeout_;
  int rank_;
  Tensor device_tensor_, host_;
  std::shared_ptr<StagedResults> staged_;
  uint64_t sequence_;
  bool copied_back_ = false;
};

void StagedResults::deliver_through(uint64_t through) {
  std::lock_guard lock(mutex);
  while (!pending.empty() && pending.front()->sequence() <= through) {
    const std::shared_ptr<MpiWork> work = std::move(pending.front());
    pending.pop_front();
    work->copy_back();
  }
}

}  // namespace

struct MpiProcessGroup::State {
  MPI_Comm comm = MPI_COMM_NULL;
  std::mutex mutex;
  std::condition_variable has_work;
  std::deque<std::shared_ptr<Task>> queue;
  bool stopping = false;
  std::thread thread;
  std::shared_ptr<StagedResults> staged = std::make_shared<StagedResults>();

  // Staging keeps issue order on the device (see stage_after_earlier): every result still to be
  // copied back into the bytes of `tensors` is delivered now, with every result issued before it, on
  // the caller's stream, before the new collective stages its own copies.
  void settle_results_overlapping(std::initializer_list<const Tensor*> tensors) {
    uint64_t through = 0;
    {
      std::lock_guard lock(staged->mutex);
      for (const auto& work : staged->pending) {
        for (const Tensor* t : tensors) {
          if (work->pending_result_overlaps(*t)) through = work->sequence();
        }
      }
    }
    if (through > 0) staged->deliver_through(through);
  }

  void loop() {
    while (true) {
      std::shared_ptr<Task> task;
      {
        std::unique_lock lock(mutex);
        has_work.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;  // stopping, and everything issued has run
        task = std::move(queue.front());
        queue.pop_front();
      }
      const int64_t start = trace::now_us();
      std::exception_ptr error;
      try {
        task->run();
      } catch (...) {
        error = std::current_exception();
      }
      if (trace::enabled()) trace::complete(task->what, "comm", "comm", start, trace::now_us());
      {
        std::lock_guard lock(task->mutex);
        task->done = true;
        task->error = error;
      }
      task->finished.notify_all();
    }
  }
};

namespace {

int comm_rank(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

int comm_size(MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  return size;
}

// A communicator of its own for the job's group, so its messages never match another group's.
std::unique_ptr<MpiProcessGroup::State> world_state() {
  OCTET_CHECK(mpi_initialized(), "MpiProcessGroup: MPI is not initialised; make the group with "
              "distributed::init_process_group under mpirun");
  auto state = std::make_unique<MpiProcessGroup::State>();
  MPI_Comm_dup(MPI_COMM_WORLD, &state->comm);
  return state;
}

}  // namespace

MpiProcessGroup::MpiProcessGroup(Device device, ProcessGroupOptions options)
    : MpiProcessGroup(device, options, world_state()) {}

MpiProcessGroup::MpiProcessGroup(Device device, ProcessGroupOptions options, std::unique_ptr<State> state)
    : ProcessGroup(comm_rank(state->comm), comm_size(state->comm), options), device_(device), state_(std::move(state)) {
  half_ops();
  state_->thread = std::thread([s = state_.get()] { s->loop(); });
}

MpiProcessGroup::~MpiProcessGroup() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stopping = true;
  }
  state_->has_work.notify_all();
  state_->thread.join();
  // Every collective has run: the results nobody waited for reach their tensors now, and the pending
  // list, which holds its works (as they hold it), empties.
  try {
    state_->staged->deliver_through(state_->staged->issued);
  } catch (const std::exception& e) {
    logging::error("MpiProcessGroup: copying the last collectives' results back to the device failed at the "
                   "group's end: {}", e.what());
    std::lock_guard lock(state_->staged->mutex);
    state_->staged->pending.clear();
  }
  if (mpi_initialized()) MPI_Comm_free(&state_->comm);
}

namespace {

// The host buffer a collective works on: the tensor itself on the CPU; for a CUDA tensor, pinned
// host memory (for full-speed copies) holding a copy made now, on the caller's stream, so it holds
// what the caller computed before the call.
Tensor host_buffer(const Tensor& t) { return t.is_cuda() ? empty_pinned(t.shape(), t.dtype()) : t; }
Tensor host_side(const Tensor& t) {
  if (!t.is_cuda()) return t;
  Tensor host = host_buffer(t);
  host.copy_(t);
  return host;
}

// Staging a CUDA collective copies its inputs to the host when it is issued and its result back when
// it is waited on. Two collectives on one buffer, the second issued before the first is waited on
// (broadcast, then all_reduce of what it broadcast), would otherwise stage the second's input before
// the first's result is in the buffer, and copy the first's stale result over the second's at the
// end. So before staging, every earlier collective whose result overlaps the new one's tensors
// (inputs or outputs) finishes and copies back: the device sees the collectives in issue order, as
// on the CPU, where they share the host buffer itself, and on NCCL, where one stream runs them.
// Collectives on other buffers (DDP's buckets) stay in flight together.
void stage_after_earlier(MpiProcessGroup::State& state, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (t->is_cuda()) return state.settle_results_overlapping(tensors);
  }
}

}  // namespace

// Queues `run` for the communication thread. `result` is the tensor the caller reads afterwards:
// when it is on a GPU, `result_host` is copied back into it by wait().
static WorkHandle enqueue(MpiProcessGroup::State& state, std::function<void()> run, std::string what,
                          std::chrono::seconds timeout, int rank, const Tensor& result, const Tensor& result_host) {
  auto task = std::make_shared<Task>();
  task->run = std::move(run);
  task->what = std::move(what);
  const bool staged = result.defined() && result.is_cuda();
  std::shared_ptr<MpiWork> work;
  {
    // The sequence number and the pending entry go with the queue's order: one lock for both.
    std::lock_guard queue_lock(state.mutex);
    std::lock_guard staged_lock(state.staged->mutex);
    work = std::make_shared<MpiWork>(task, timeout, rank, staged ? result : Tensor(), staged ? result_host : Tensor(),
                                     state.staged, ++state.staged->issued);
    if (staged) state.staged->pending.push_back(work);
    state.queue.push_back(task);
  }
  state.has_work.notify_one();
  return work;
}

WorkHandle MpiProcessGroup::do_all_reduce(const Tensor& tensor, ReduceOp op) {
  stage_after_earlier(*state_, {&tensor});
  const Tensor host = host_side(tensor);
  const DType d = tensor.dtype();
  const int world = size();
  auto run = [host, d, op, world, comm = state_->comm] {
    // MPI counts are ints: large tensors go in slices of 2^30 elements.
    constexpr int64_t kSlice = int64_t{1} << 30;
    char* base = static_cast<char*>(host.data_ptr());
    for (int64_t start = 0; start < host.numel(); start += kSlice) {
      const int n = static_cast<int>(std::min(kSlice, host.numel() - start));
      MPI_Request request;
      MPI_Iallreduce(MPI_IN_PLACE, base + start * dtype_size(d), n, mpi_type(d), mpi_op(op, d), comm, &request);
      complete(request);
    }
    if (op == ReduceOp::Avg) divide(host.data_ptr(), d, host.numel(), world);
  };
  return enqueue(*state_, run,
                 fmt::format("all_reduce({}) of {}", reduce_op_name(op), format_bytes(double(tensor.nbytes()))),
                 options().timeout, rank(), tensor, host);
}

WorkHandle MpiProcessGroup::do_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) {
  stage_after_earlier(*state_, {&output, &input});
  const Tensor host_in = host_side(input);
  const Tensor host_out = host_buffer(output);
  const DType d = input.dtype();
  const int world = size();
  const int count = checked_count(output.numel(), "reduce_scatter");
  auto run = [host_in, host_out, d, op, world, count, comm = state_->comm] {
    MPI_Request request;
    MPI_Ireduce_scatter_block(host_in.data_ptr(), host_out.data_ptr(), count, mpi_type(d), mpi_op(op, d), comm,
                              &request);
    complete(request);
    if (op == ReduceOp::Avg) divide(host_out.data_ptr(), d, host_out.numel(), world);
  };
  return enqueue(*state_, run,
                 fmt::format("reduce_scatter({}) of {}", reduce_op_name(op), format_bytes(double(input.nbytes()))),
                 options().timeout, rank(), output, host_out);
}

WorkHandle MpiProcessGroup::do_all_gather(const Tensor& output, const Tensor& input) {
  stage_after_earlier(*state_, {&output, &input});
  const Tensor host_in = host_side(input);
  const Tensor host_out = host_buffer(output);
  const int count = checked_count(input.numel(), "all_gather");
  const MPI_Datatype type = mpi_type(input.dtype());
  auto run = [host_in, host_out, count, type, comm = state_->comm] {
    MPI_Request request;
    MPI_Iallgather(host_in.data_ptr(), count, type, host_out.data_ptr(), count, type, comm, &request);
    complete(request);
  };
  return enqueue(*state_, run, fmt::format("all_gather of {}", format_bytes(double(output.nbytes()))),
                 options().timeout, rank(), output, host_out);
}

WorkHandle MpiProcessGroup::do_broadcast(const Tensor& tensor, int root) {
  stage_after_earlier(*state_, {&tensor});
  const Tensor host = host_side(tensor);
  const int count = checked_count(tensor.numel(), "broadcast");
  const MPI_Datatype type = mpi_type(tensor.dtype());
  auto run = [host, count, type, root, comm = state_->comm] {
    MPI_Request request;
    MPI_Ibcast(host.data_ptr(), count, type, root, comm, &request);
    complete(request);
  };
  return enqueue(*state_, run,
                 fmt::format("broadcast from rank {} of {}", root, format_bytes(double(tensor.nbytes()))),
                 options().timeout, rank(), tensor, host);
}

// MPI_Comm_split is a collective on this group's communicator, so it runs on the communication
// thread, in order with the collectives issued before it: two threads must not run collectives on
// one communicator at once. A rank that never joins it ends the job at the timeout, as for any
// collective (the wait below).
std::shared_ptr<ProcessGroup> MpiProcessGroup::do_split(int color, int key) {
  auto made = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
  auto run = [made, color, key, comm = state_->comm] {
    OCTET_CHECK(MPI_Comm_split(comm, color == kNoColor ? MPI_UNDEFINED : color, key, made.get()) == MPI_SUCCESS,
                "MPI_Comm_split failed");
  };
  enqueue(*state_, run, fmt::format("split(color {}, key {})", color, key), options().timeout, rank(), Tensor(),
          Tensor())
      ->wait();
  if (*made == MPI_COMM_NULL) return nullptr;
  auto state = std::make_unique<State>();
  state->comm = *made;
  return std::shared_ptr<MpiProcessGroup>(new MpiProcessGroup(device_, options(), std::move(state)));
}

WorkHandle MpiProcessGroup::do_barrier() {
  auto run = [comm = state_->comm] {
    MPI_Request request;
    MPI_Ibarrier(comm, &request);
    complete(request);
  };
  return enqueue(*state_, run, "barrier", options().timeout, rank(), Tensor(), Tensor());
}

}  // namespace octet::distributed
