// NcclProcessGroup at world size 1 (no mpirun): every collective's values, the counters, abort, the
// trace spans, and above all the stream ordering: a collective reads its inputs only after the
// caller's queued kernels, Work::wait() returns without blocking the host, and the caller's stream
// reads the result only after the collective. At one rank the values are trivial (the identity, a
// copy), so the ordering tests hold the compute stream at a gate and queue work behind it.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <thread>
#include <vector>

#include "core/cuda_stream.h"
#include "core/tensor.h"
#include "core/trace.h"
#include "distributed/nccl_process_group.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/testing.h"

namespace octet {
namespace {

using distributed::Collective;
using distributed::NcclProcessGroup;
using distributed::ReduceOp;
using testing::kGpu;
using testing::same_bits;

const std::vector<int64_t> kSizes = {1, 7, 1000, 100003};
const std::vector<ReduceOp> kOps = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max};

// Holds a stream at a host function until open() is called, so that a test can queue work behind
// it and watch what the host does meanwhile. It opens by itself after 10 s, so a wait() that
// wrongly blocks the host fails the test instead of hanging it.
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) : stream_(stream) {
    cuda::check(cudaLaunchHostFunc(stream_, &StreamGate::hold, this), "cudaLaunchHostFunc");
  }
  ~StreamGate() {
    open();
    cudaStreamSynchronize(stream_);  // hold() must be done with `this`
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  void open() { open_.store(true); }
  bool opened_by_itself() const { return opened_by_itself_.load(); }

 private:
  static void hold(void* self) {
    auto* gate = static_cast<StreamGate*>(self);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!gate->open_.load()) {
      if (std::chrono::steady_clock::now() > deadline) {
        gate->opened_by_itself_.store(true);
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  cudaStream_t stream_;
  std::atomic<bool> open_{false}, opened_by_itself_{false};
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(CudaNccl, AllReduceAtOneRankLeavesTheInput) {
  SKIP_WITHOUT_GPU();
  NcclProcessGroup group(kGpu);
  EXPECT_EQ(group.rank(), 0);
  EXPECT_EQ(group.size(), 1);
  EXPECT_EQ(group.backend(), "nccl");
  EXPECT_EQ(group.device(), kGpu);
  uint64_t seed = 1;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i64}) {
    for (ReduceOp op : kOps) {
      // An i64 average is refused by every group (ProcessGroup::all_reduce: it would truncate), so
      // that case checks the refusal and that nothing was written.
      if (dtype == DType::i64 && op == ReduceOp::Avg) {
        const Tensor host = testing::random_tensor({7}, dtype, ++seed, 1000.0);
        const Tensor dev = host.to(kGpu);
        EXPECT_TRUE(testing::throws_with([&] { group.all_reduce(dev, op); }, {"all_reduce", "cannot average"}));
        EXPECT_TRUE(same_bits(dev, host));
        continue;
      }
      for (int64_t n : kSizes) {
        const Tensor host = testing::random_tensor({n}, dtype, ++seed, dtype == DType::i64 ? 1000.0 : 1.0);
        const Tensor dev = host.to(kGpu);
        group.all_reduce(dev, op)->wait();
        EXPECT_TRUE(same_bits(dev, host)) << dtype_name(dtype) << " " << distributed::reduce_op_name(op) << " x" << n;
      }
    }
  }
}

// ncclCommSplit at one rank: a group of its own (its own communicator, stream and counters), or none.
TEST(CudaNccl, SplitAtOneRankGivesAGroupOfItsOwn) {
  SKIP_WITHOUT_GPU();
  NcclProcessGroup group(kGpu);
  EXPECT_EQ(group.split(distributed::ProcessGroup::kNoColor, 0), nullptr);
  const auto sub = group.split(0, 0);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->backend(), "nccl");
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->rank(), 0);
  const Tensor host = testing::random_tensor({1000}, DType::f32, 77);
  const Tensor a = host.to(kGpu), b = host.to(kGpu);
  // Both communicators in flight at once.
  const auto wa = group.all_reduce(a, ReduceOp::Avg), wb = sub->all_reduce(b, ReduceOp::Sum);
  wa->wait(), wb->wait();
  EXPECT_TRUE(same_bits(a, host));
  EXPECT_TRUE(same_bits(b, host));
  EXPECT_EQ(sub->counters().calls_of(Collective::AllReduce), 1);
  EXPECT_EQ(group.counters().calls_of(Collective::AllReduce), 1);
}

TEST(CudaNccl, AllGatherFlatAndIntoAList) {
  SKIP_WITHOUT_GPU();
  NcclProcessGroup group(kGpu);
  uint64_t seed = 100;
  // e4m3 travels as raw bytes: gathers move FP8 values, reductions refuse them.
  for (DType dtype : {DType::f32, DType::bf16, DType::e4m3}) {
    for (int64_t n : kSizes) {
      const Tensor host = testing::random_tensor({n}, dtype, ++seed);
      const Tensor input = host.to(kGpu);
      const Tensor flat = full({n}, -1.0, dtype, kGpu);
      group.all_gather(flat, input)->wait();
      EXPECT_TRUE(same_bits(flat, host)) << dtype_name(dtype) << " x" << n;

      const std::vector<Tensor> list = {full({n}, -1.0, dtype, kGpu)};
      group.all_gather(list, input)->wait();
      EXPECT_TRUE(same_bits(list[0], host)) << dtype_name(dtype) << " x" << n << " into a list";
    }
  }
  const Tensor fp8 = zeros({8}, DType::e4m3, kGpu);
  EXPECT_TRUE(testing::throws_with([&] { group.all_reduce(fp8); }, {"all_reduce", "cannot reduce"}));
}

TEST(CudaNccl, ReduceScatterAndBroadcastAtOneRank) {
  SKIP_WITHOUT_GPU();
  NcclProcessGroup group(kGpu);
  uint64_t seed = 200;
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t n : kSizes) {
      const Tensor host = testing::random_tensor({n}, dtype, ++seed);
      for (ReduceOp op : kOps) {
        const Tensor output = full({n}, -1.0, dtype, kGpu);
        group.reduce_scatter(output, host.to(kGpu), op)->wait();
        EXPECT_TRUE(same_bits(output, host)) << dtype_name(dtype) << " " << distributed::reduce_op_name(op) << " x"
                                             << n;
      }
      const Tensor dev = host.to(kGpu);
      group.broadcast(dev, 0)->wait();
      EXPECT_TRUE(same_bits(dev, host)) << dtype_name(dtype) << " broadcast x" << n;
    }
  }
}

// An average at one rank is the input itself, out of place too, at sizes whose split among the
// blocks of NCCL's one-rank average kernel (up to 32 blocks of ceil(bytes / 16 KiB), which in NCCL
// up to 2.29.2 dropped the tail, distributed/nccl_reduction.h) leaves remainders 1 to 31 and none.
// The output starts as NaNs, so an element nothing writes fails.
TEST(CudaNccl, AverageAtOneRankWritesEveryElementOutOfPlace) {
  SKIP_WITHOUT_GPU();
  NcclProcessGroup group(kGpu);
  uint64_t seed = 300;
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    for (int64_t n : {int64_t{100003}, int64_t{131072}, int64_t{131103}, int64_t{524287}, int64_t{1 << 22} + 31}) {
      const Tensor host = testing::random_tensor({n}, dtype, ++seed);
      const Tensor output = full({n}, std::numeric_limits<double>::quiet_NaN(), dtype, kGpu);
      group.reduce_scatter(output, host.to(kGpu), ReduceOp::Avg)->wait();
      EXPECT_TRUE(same_bits(output, host)) << dtype_name(dtype) << " reduce_scatter(avg) x" << n;
      const Tensor dev = host.to(kGpu);
      group.all_reduce(dev, ReduceOp::Avg)->wait();
      EXPECT_TRUE(same_bits(dev, host)) << dtype_name(dtype) << " all_reduce(avg) x" << n;
    }
  }
}

TEST(CudaNccl, BarrierBlocksTheHostUntilDone) {
  SKIP_WITHOUT_GPU();
  NcclProcessGroup group(kGpu);
  const distributed::WorkHandle work = group.barrier();
  work->wait();
  EXPECT_TRUE(work->is_completed());
  EXPECT_EQ(work->describe(), "barrier");
}

TEST(CudaNccl, CountersFollowEveryCollective) {
  SKIP_WITHOUT_GPU();
  NcclProcessGroup group(kGpu);
  const Tensor a = zeros({1000}, DType::f32, kGpu), b = zeros({7}, DType::bf16, kGpu);
  group.all_reduce(a)->wait();
  group.all_reduce(b, ReduceOp::Avg)->wait();
  group.all_gather(zeros({7}, DType::bf16, kGpu), b)->wait();
  group.reduce_scatter(zeros({1000}, DType::f32, kGpu), a)->wait();
  group.broadcast(a)->wait();
  group.barrier()->wait();
  const distributed::CommCounters c = group.counters();
  EXPECT_EQ(c.world_size, 1);
  EXPECT_EQ(c.calls_of(Collective::AllReduce), 2);
  EXPECT_EQ(c.payload_of(Collective::AllReduce), 4000 + 14);
  EXPECT_EQ(c.payload_of(Collective::AllGather), 14);
  EXPECT_EQ(c.payload_of(Collective::ReduceScatter), 4000);
  EXPECT_EQ(c.payload_of(Collective::Broadcast), 4000);
  EXPECT_EQ(c.calls_of(Collective::Barrier), 1);
  EXPECT_EQ(c.bus_bytes(Collective::AllReduce), 0.0);  // one rank sends nothing
  group.reset_counters();
  EXPECT_EQ(group.counters().calls_of(Collective::AllReduce), 0);
}

// The collective waits for a kernel queued before it on the caller's stream (the fill), wait()
// returns while both are held at the gate, and a copy queued after wait() sees the gathered values.
TEST(CudaNccl, WaitOrdersTheCallersStreamWithoutBlockingTheHost) {
  SKIP_WITHOUT_GPU();
  NcclProcessGroup group(kGpu);
  const int64_t n = 1 << 20;
  const Tensor input = zeros({n}, DType::f32, kGpu), output = full({n}, -1.0, DType::f32, kGpu);
  // Warm up everything queued behind the gate below: a first call may load modules or set up NCCL.
  group.all_gather(output, input)->wait();
  input.fill_(0.0);
  (void)output.clone();
  cuda::synchronize(kGpu.index);

  output.fill_(-1.0);
  StreamGate gate(cuda::current_stream(kGpu.index));
  input.fill_(7.0);  // queued behind the gate
  const distributed::WorkHandle work = group.all_gather(output, input);
  const auto start = std::chrono::steady_clock::now();
  work->wait();
  const double wait_seconds = seconds_since(start);
  const Tensor snapshot = output.clone();  // a device copy, queued after wait()
  EXPECT_FALSE(work->is_completed()) << "the collective ran before the kernels queued ahead of it";
  EXPECT_LT(wait_seconds, 1.0) << "wait() blocked the host";
  gate.open();
  work->synchronize();
  EXPECT_TRUE(work->is_completed());
  EXPECT_FALSE(gate.opened_by_itself());
  EXPECT_TRUE(same_bits(snapshot, full({n}, 7.0, DType::f32)));
}

// Without a gate: a large collective issued right after the kernel that writes its input, read at
// once on the compute stream, for each collective.
TEST(CudaNccl, LargeCollectivesReadAndWriteInStreamOrder) {
  SKIP_WITHOUT_GPU();
  NcclProcessGroup group(kGpu);
  const int64_t n = 16 * 1000 * 1000 + 3;  // 64 MB of f32
  const Tensor data = zeros({n}, DType::f32, kGpu), out = zeros({n}, DType::f32, kGpu);
  for (int step = 1; step <= 3; ++step) {
    data.fill_(step);
    group.all_reduce(data, ReduceOp::Avg)->wait();
    group.all_gather(out, data)->wait();
    EXPECT_TRUE(same_bits(out.clone(), full({n}, step, DType::f32))) << "step " << step;
    out.fill_(-step);
    group.reduce_scatter(data, out)->wait();
    EXPECT_TRUE(same_bits(data, full({n}, -step, DType::f32))) << "reduce_scatter, step " << step;
  }
}

TEST(CudaNccl, AbortedGroupRefusesNewWork) {
  SKIP_WITHOUT_GPU();
  NcclProcessGroup group(kGpu);
  const Tensor t = zeros({10}, DType::f32, kGpu);
  group.all_reduce(t)->synchronize();
  group.abort();
  group.abort();  // idempotent
  EXPECT_TRUE(testing::throws_with([&] { group.all_reduce(t); }, {"all_reduce", "aborted", "new process group"}));
  EXPECT_TRUE(testing::throws_with([&] { group.barrier(); }, {"barrier", "aborted"}));
}

TEST(CudaNccl, RefusesACpuDevice) {
  SKIP_WITHOUT_GPU();
  EXPECT_TRUE(testing::throws_with([] { NcclProcessGroup group(Device::cpu()); },
                                   {"NcclProcessGroup", "CUDA devices", "cpu", "MPI backend"}));
}

// Each collective is a span on the "gpu comm" track, timed by CUDA events and placed on the host's
// trace clock: inside the host window that issued and synchronised it.
TEST(CudaNccl, TraceRecordsEachCollectiveOnTheGpuCommTrack) {
  SKIP_WITHOUT_GPU();
  NcclProcessGroup group(kGpu);
  const Tensor t = testing::random_tensor({1 << 22}, DType::f32, 5).to(kGpu);
  group.all_reduce(t)->synchronize();  // NCCL's first-call setup stays out of the window
  trace::start(0);
  const int64_t before_us = trace::now_us();
  const distributed::WorkHandle work = group.all_reduce(t, ReduceOp::Avg);
  work->synchronize();
  const int64_t after_us = trace::now_us();
  const std::vector<trace::Span> spans = trace::spans();
  trace::stop();
  const auto span = std::find_if(spans.begin(), spans.end(), [](const trace::Span& s) { return s.track == "gpu comm"; });
  ASSERT_NE(span, spans.end()) << "no span on the gpu comm track";
  EXPECT_EQ(span->name, work->describe());
  EXPECT_EQ(span->category, "comm");
  EXPECT_LE(span->start_us, span->end_us);
  // The clock anchor is good to a few microseconds; 2 ms of slack keeps the test robust.
  EXPECT_GE(span->start_us, before_us - 2000);
  EXPECT_LE(span->end_us, after_us + 2000);
}

}  // namespace
}  // namespace octet
