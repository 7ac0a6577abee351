// LocalProcessGroup: world size 1 without MPI, where every collective is the identity (a copy for
// all_gather and reduce_scatter), so a program written against ProcessGroup runs unchanged without
// mpirun. A plain cpu-label suite: no mpirun, no MPI at run time.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "distributed/launch.h"
#include "distributed/process_group.h"
#include "tests/distributed/collective_testing.h"
#include "tests/log_capture.h"
#include "tests/testing.h"

namespace octet::testing {
namespace {

using distributed::Collective;
using distributed::LocalProcessGroup;
using distributed::ReduceOp;
using distributed::WorkHandle;

// Destructors that wait for collectives still in flight (DDP's buckets, FSDP's gathers and
// reduce-scatters) call synchronize_in_destructor: a Work whose synchronize throws (an error NCCL
// found in the collective) must not escape a destructor, which would end the process through
// std::terminate without a message. While an exception unwinds (on its way to end the job with its
// own message) it is logged, naming the owner; otherwise it ends the job with that message.
struct FailingWork : distributed::Work {
  int synchronized = 0;
  void wait() override {}
  void synchronize() override {
    ++synchronized;
    OCTET_FAIL("planted: NCCL reported an error on rank 1");
  }
  bool is_completed() override { return false; }
  std::string describe() const override { return "all_reduce(avg) of 4.00 MB"; }
};

struct SynchronizesWhenDestroyed {
  FailingWork& work;
  ~SynchronizesWhenDestroyed() { distributed::synchronize_in_destructor(work, "DistributedDataParallel"); }
};

TEST(LocalGroup, SynchronizeInADestructorLogsWhatTheWorkThrowsWhileAnExceptionUnwinds) {
  FailingWork work;
  CapturedLog log;
  try {
    SynchronizesWhenDestroyed owner{work};
    throw std::runtime_error("the backward that failed");
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "the backward that failed") << "the exception in flight is the one that arrives";
  }
  EXPECT_EQ(work.synchronized, 1);
  EXPECT_NE(log.text().find("DistributedDataParallel: a collective in flight at its destruction failed: planted: "
                            "NCCL reported an error"),
            std::string::npos)
      << log.text();
}

TEST(LocalGroupDeathTest, SynchronizeInADestructorEndsTheJobWithWhatTheWorkThrows) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        FailingWork work;
        { SynchronizesWhenDestroyed owner{work}; }
      },
      ::testing::ExitedWithCode(1),
      "DistributedDataParallel: a collective in flight at its destruction failed: planted: NCCL reported an error");
}

TEST(LocalGroup, IsRankZeroOfOne) {
  LocalProcessGroup group;
  EXPECT_EQ(group.rank(), 0);
  EXPECT_EQ(group.size(), 1);
  EXPECT_EQ(group.backend(), "local");
  EXPECT_TRUE(group.device().is_cpu());
  EXPECT_EQ(group.counters().world_size, 1);
}

TEST(LocalGroup, AllReduceLeavesTheTensorAsItIs) {
  LocalProcessGroup group;
  uint64_t salt = 1;
  for (DType dtype : kCollectiveDtypes) {
    for (int64_t n : kOddSizes) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        if (op == ReduceOp::Avg && dtype == DType::i64) continue;
        SCOPED_TRACE(case_name(dtype, n, distributed::reduce_op_name(op)));
        const Tensor input = rank_input(0, odd_shape(n), dtype, ++salt);
        const Tensor tensor = input.clone();
        const WorkHandle work = group.all_reduce(tensor, op);
        EXPECT_TRUE(work->is_completed());  // finished before wait()
        work->wait();
        EXPECT_NE(work->describe().find("all_reduce"), std::string::npos) << work->describe();
        EXPECT_TRUE(equals_exactly(tensor, input));
      }
    }
  }
}

TEST(LocalGroup, ReduceScatterAndAllGatherCopy) {
  LocalProcessGroup group;
  uint64_t salt = 100;
  for (DType dtype : kCollectiveDtypes) {
    for (int64_t n : kOddSizes) {
      SCOPED_TRACE(case_name(dtype, n));
      const Tensor input = rank_input(0, odd_shape(n), dtype, ++salt);

      const Tensor scattered = sentinel({n}, dtype);
      const WorkHandle scatter =
          group.reduce_scatter(scattered, input, dtype == DType::i64 ? ReduceOp::Sum : ReduceOp::Avg);
      EXPECT_TRUE(scatter->is_completed());
      EXPECT_NE(scatter->describe().find("reduce_scatter"), std::string::npos) << scatter->describe();
      EXPECT_TRUE(equals_exactly(scattered, input));

      const Tensor gathered = sentinel({n}, dtype);
      EXPECT_TRUE(group.all_gather(gathered, input)->is_completed());
      EXPECT_TRUE(equals_exactly(gathered, input));
      EXPECT_FALSE(gathered.storage() == input.storage()) << "all_gather must copy, not alias";

      const std::vector<Tensor> list = {sentinel(odd_shape(n), dtype)};
      const WorkHandle gather = group.all_gather(list, input);
      gather->wait();  // the list is the caller's only after wait(), even when the work has finished
      EXPECT_NE(gather->describe().find("all_gather"), std::string::npos) << gather->describe();
      EXPECT_TRUE(equals_exactly(list[0], input));
    }
  }
}

TEST(LocalGroup, BroadcastAndBarrierFinishAtOnce) {
  LocalProcessGroup group;
  const Tensor input = rank_input(0, {1001}, DType::bf16, 200);
  const Tensor tensor = input.clone();
  const WorkHandle bcast = group.broadcast(tensor, 0);
  EXPECT_TRUE(bcast->is_completed());
  EXPECT_NE(bcast->describe().find("broadcast"), std::string::npos) << bcast->describe();
  EXPECT_TRUE(equals_exactly(tensor, input));
  const WorkHandle barrier = group.barrier();
  EXPECT_TRUE(barrier->is_completed());
  barrier->synchronize();
  EXPECT_NE(barrier->describe().find("barrier"), std::string::npos) << barrier->describe();
}

TEST(LocalGroup, CountsBytesWithNothingOnTheRing) {
  LocalProcessGroup group;
  group.all_reduce(rank_input(0, {1001}, DType::f32, 300));                        // 4004 B
  group.reduce_scatter(sentinel({7}, DType::f64), rank_input(0, {7}, DType::f64, 301));  // 56 B
  group.all_gather(sentinel({4099}, DType::bf16), rank_input(0, {4099}, DType::bf16, 302));  // 8198 B
  group.broadcast(rank_input(0, {7}, DType::i64, 303), 0);                         // 56 B
  group.barrier();
  const distributed::CommCounters c = group.counters();
  EXPECT_EQ(c.world_size, 1);
  for (int i = 0; i < distributed::kNumCollectives; ++i) EXPECT_EQ(c.calls[i], 1) << i;
  EXPECT_EQ(c.payload_of(Collective::AllReduce), 4004);
  EXPECT_EQ(c.payload_of(Collective::ReduceScatter), 56);
  EXPECT_EQ(c.payload_of(Collective::AllGather), 8198);
  EXPECT_EQ(c.payload_of(Collective::Broadcast), 56);
  EXPECT_EQ(c.payload_of(Collective::Barrier), 0);
  // One rank: the ring sends nothing, but a broadcast still counts its payload once (1 × payload).
  EXPECT_EQ(c.bus_bytes(Collective::AllReduce), 0.0);
  EXPECT_EQ(c.bus_bytes(Collective::ReduceScatter), 0.0);
  EXPECT_EQ(c.bus_bytes(Collective::AllGather), 0.0);
  EXPECT_EQ(c.bus_bytes(Collective::Broadcast), 56.0);
  group.reset_counters();
  for (int i = 0; i < distributed::kNumCollectives; ++i) {
    EXPECT_EQ(group.counters().calls[i], 0);
    EXPECT_EQ(group.counters().payload_bytes[i], 0);
  }
}

// The base class's checks hold at world size 1 as well.
TEST(LocalGroup, RefusesWhatEveryGroupRefuses) {
  LocalProcessGroup group;
  const Tensor seven = rank_input(0, {7}, DType::f32, 400);
  EXPECT_TRUE(throws_with([&] { group.broadcast(seven, 1); }, {"broadcast", "root", "1"}));
  EXPECT_TRUE(throws_with([&] { group.broadcast(seven, -1); }, {"broadcast", "root", "-1"}));
  const Tensor eight = sentinel({8}, DType::f32);
  // Each size error names the wrong tensor and the size it should have.
  EXPECT_TRUE(throws_with([&] { group.reduce_scatter(eight, seven); }, {"reduce_scatter", seven.describe(), "8"}));
  EXPECT_TRUE(throws_with([&] { group.all_gather(eight, seven); }, {"all_gather", eight.describe(), "7"}));
  const std::vector<Tensor> two = {sentinel({7}, DType::f32), sentinel({7}, DType::f32)};
  EXPECT_TRUE(throws_with([&] { group.all_gather(two, seven); }, {"all_gather", "2"}));
  EXPECT_TRUE(throws_with([&] { group.all_reduce(Tensor()); }, {"all_reduce", "undefined"}));
  EXPECT_TRUE(throws_with([&] { group.all_reduce(full({3}, 1.0, DType::i32)); }, {"all_reduce", "i32"}));
  // An integer average would truncate (differently on each backend): refused at every world size,
  // naming the tensor and the way out; the same tensor sums and maxes.
  const Tensor counts = rank_input(0, {7}, DType::i64, 401);
  EXPECT_TRUE(throws_with([&] { group.all_reduce(counts, ReduceOp::Avg); },
                          {"all_reduce", "cannot average", counts.describe(), "Sum"}));
  EXPECT_TRUE(throws_with([&] { group.reduce_scatter(sentinel({7}, DType::i64), counts, ReduceOp::Avg); },
                          {"reduce_scatter", "cannot average", counts.describe()}));
  EXPECT_EQ(group.counters().calls_of(Collective::AllReduce), 0);
  EXPECT_EQ(group.counters().calls_of(Collective::ReduceScatter), 0);
  group.all_reduce(counts, ReduceOp::Sum)->wait();
  group.all_reduce(counts, ReduceOp::Max)->wait();
  EXPECT_EQ(group.counters().calls_of(Collective::AllReduce), 2);
  EXPECT_EQ(group.counters().calls_of(Collective::Broadcast), 0);
  EXPECT_EQ(group.counters().calls_of(Collective::AllGather), 0);
}

TEST(Launch, WithoutMpirunTheWorldIsOneProcessWithoutMpi) {
  const distributed::LaunchInfo info = distributed::launch_info();
  if (info.under_mpirun) GTEST_SKIP() << "this suite was started by mpirun; the test checks a plain start";
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_world_size, 1);
  const auto group = distributed::init_process_group(Device::cpu(), distributed::Backend::Mpi);
  EXPECT_EQ(group->backend(), "local");
  EXPECT_EQ(group->size(), 1);
  EXPECT_FALSE(distributed::mpi_initialized());
}

TEST(Launch, ParseBackendNamesTheValidValues) {
  EXPECT_EQ(distributed::parse_backend("auto"), distributed::Backend::Auto);
  EXPECT_EQ(distributed::parse_backend("nccl"), distributed::Backend::Nccl);
  EXPECT_EQ(distributed::parse_backend("mpi"), distributed::Backend::Mpi);
  EXPECT_TRUE(throws_with([] { distributed::parse_backend("gloo"); }, {"gloo", "auto", "nccl", "mpi"}));
}

// A rank alone splits into a group of itself, with counters of its own, or into none.
TEST(LocalGroup, SplitGivesAGroupOfOneOrNone) {
  LocalProcessGroup group;
  EXPECT_EQ(group.split(distributed::ProcessGroup::kNoColor, 0), nullptr);
  const auto sub = group.split(3, 0);
  ASSERT_NE(sub, nullptr);
  EXPECT_NE(sub.get(), &group);
  EXPECT_EQ(sub->backend(), "local");
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->rank(), 0);
  const Tensor input = rank_input(0, {7}, DType::f32, 9), gathered = sentinel({7}, DType::f32);
  sub->all_gather(gathered, input)->wait();
  EXPECT_TRUE(equals_exactly(gathered, input));
  EXPECT_EQ(sub->counters().calls_of(Collective::AllGather), 1);
  EXPECT_EQ(group.counters().calls_of(Collective::AllGather), 0) << "the parent counted its subgroup's collective";
  EXPECT_TRUE(throws_with([&] { group.split(-5, 0); }, {"split", "color -5"}));
}

TEST(FormatBytes, SmallCountsInBytes) { EXPECT_EQ(distributed::format_bytes(512), "512 B"); }

}  // namespace
}  // namespace octet::testing
