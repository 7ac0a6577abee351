// Every collective of the MPI process group, run by mpirun at N = 1 … 4 ranks (label mpi; main in
// mpi_main.cpp). Each rank rebuilds every rank's input from (salt, rank) and checks its own result
// against values it computes itself; odd sizes, f32, f64, bf16, f16 and i64.
//
// As mpi_main.h asks: the same collectives in the same order on every rank, EXPECT between
// collectives, never an early return.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "distributed/launch.h"
#include "distributed/process_group.h"
#include "tests/distributed/collective_testing.h"
#include "tests/distributed/mpi_main.h"

namespace octet::testing {
namespace {

using distributed::Collective;
using distributed::collective_name;
using distributed::ReduceOp;
using distributed::WorkHandle;

int world_size() { return world().size(); }
int my_rank() { return world().rank(); }

const std::vector<ReduceOp> kOps = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max};

// The work has finished, and its description names the collective (and the reduction, if any).
void expect_finished_and_named(const WorkHandle& work, Collective c, const char* op_name = nullptr) {
  EXPECT_TRUE(work->is_completed()) << work->describe();
  EXPECT_NE(work->describe().find(collective_name(c)), std::string::npos) << work->describe();
  if (op_name) {
    EXPECT_NE(work->describe().find(op_name), std::string::npos) << work->describe();
  }
}

TEST(MpiGroup, IsTheJobsWorld) {
  // Under mpirun the MPI backend (even at -np 1); started alone, init_process_group gives the local group.
  const distributed::LaunchInfo launch = distributed::launch_info();
  EXPECT_EQ(world().backend(), launch.under_mpirun ? "mpi" : "local");
  EXPECT_EQ(world().rank(), launch.rank);
  EXPECT_EQ(world().size(), launch.world_size);
  EXPECT_EQ(distributed::mpi_initialized(), launch.under_mpirun);
  EXPECT_EQ(world().device().str(), collective_device().str());
}

TEST(AllReduce, SumAvgAndMaxOfEveryRanksInput) {
  uint64_t salt = 1000;
  for (DType dtype : kCollectiveDtypes) {
    for (int64_t n : kOddSizes) {
      for (ReduceOp op : kOps) {
        if (op == ReduceOp::Avg && dtype == DType::i64) continue;  // an integer average would truncate
        SCOPED_TRACE(case_name(dtype, n, distributed::reduce_op_name(op)));
        const std::vector<Tensor> inputs = all_rank_inputs(world_size(), odd_shape(n), dtype, ++salt);
        const Tensor tensor = inputs[my_rank()].clone();
        const WorkHandle work = world().all_reduce(tensor, op);
        work->wait();
        expect_finished_and_named(work, Collective::AllReduce, distributed::reduce_op_name(op));
        EXPECT_EQ(tensor.shape(), odd_shape(n));
        EXPECT_TRUE(reduced_correctly(tensor, inputs, 0, op));
      }
    }
  }
}

// bf16 reduces in f32 and rounds once per pairwise step: the sum stays within (N + 1)·2^-8·Σ|x| of
// the exact sum of the (bf16) inputs, and for N ≥ 2 it is not just one rank's value rounded.
TEST(AllReduce, Bf16SumStaysWithinTheRoundingBound) {
  const std::vector<Tensor> inputs = all_rank_inputs(world_size(), {4099}, DType::bf16, 77);
  const Tensor tensor = inputs[my_rank()].clone();
  world().all_reduce(tensor, ReduceOp::Sum)->wait();
  EXPECT_TRUE(reduced_correctly(tensor, inputs, 0, ReduceOp::Sum));
  if (world_size() > 1) {
    EXPECT_FALSE(equals_exactly(tensor, inputs[my_rank()]));
  }
}

// Data-parallel replicas stay identical only if every rank gets the very same bits, whatever order
// the backend added the terms in on each rank.
TEST(AllReduce, EveryRankGetsTheSameBits) {
  uint64_t salt = 1500;
  for (DType dtype : kFloatingDtypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      SCOPED_TRACE(case_name(dtype, 4099, distributed::reduce_op_name(op)));
      const Tensor tensor = rank_input(my_rank(), {4099}, dtype, ++salt);
      world().all_reduce(tensor, op)->wait();
      const Tensor everyones = sentinel({world_size() * 4099}, dtype);
      world().all_gather(everyones, tensor)->wait();
      for (int r = 0; r < world_size(); ++r) {
        EXPECT_TRUE(equals_exactly(everyones.narrow(r * 4099, 4099), tensor)) << "rank " << r << " differs from rank " << my_rank();
      }
    }
  }
}

TEST(AllReduce, InPlaceOnAViewLeavesTheRestOfTheStorageAlone) {
  const Tensor base = rank_input(my_rank(), {3, 1001}, DType::f32, 55);
  const Tensor before = base.clone();
  const Tensor middle_row = base.select(1);
  std::vector<Tensor> inputs;
  for (const Tensor& t : all_rank_inputs(world_size(), {3, 1001}, DType::f32, 55)) inputs.push_back(t.select(1));
  world().all_reduce(middle_row, ReduceOp::Sum)->wait();
  EXPECT_TRUE(reduced_correctly(middle_row, inputs, 0, ReduceOp::Sum));
  EXPECT_TRUE(equals_exactly(base.select(0), before.select(0)));
  EXPECT_TRUE(equals_exactly(base.select(2), before.select(2)));
}

TEST(ReduceScatter, EachRankGetsItsChunkReduced) {
  uint64_t salt = 2000;
  const int n_ranks = world_size();
  for (DType dtype : kCollectiveDtypes) {
    for (int64_t chunk : {int64_t{1}, int64_t{7}, int64_t{1001}}) {
      for (ReduceOp op : kOps) {
        if (op == ReduceOp::Avg && dtype == DType::i64) continue;
        SCOPED_TRACE(case_name(dtype, chunk, distributed::reduce_op_name(op)));
        // The input as [N, chunk] for one size: only the element counts must agree.
        const Shape input_shape = chunk == 7 ? Shape{n_ranks, chunk} : Shape{n_ranks * chunk};
        const std::vector<Tensor> inputs = all_rank_inputs(n_ranks, input_shape, dtype, ++salt);
        const Tensor output = sentinel({chunk}, dtype);
        const WorkHandle work = world().reduce_scatter(output, inputs[my_rank()].clone(), op);
        work->wait();
        expect_finished_and_named(work, Collective::ReduceScatter, distributed::reduce_op_name(op));
        EXPECT_TRUE(reduced_correctly(output, inputs, my_rank() * chunk, op));
      }
    }
  }
}

TEST(AllGather, IntoOneFlatBuffer) {
  uint64_t salt = 3000;
  for (DType dtype : kCollectiveDtypes) {
    for (int64_t n : kOddSizes) {
      SCOPED_TRACE(case_name(dtype, n));
      const std::vector<Tensor> inputs = all_rank_inputs(world_size(), odd_shape(n), dtype, ++salt);
      const Tensor output = sentinel({world_size() * n}, dtype);
      const Tensor input = inputs[my_rank()].clone();
      const WorkHandle work = world().all_gather(output, input);
      work->wait();
      expect_finished_and_named(work, Collective::AllGather);
      for (int r = 0; r < world_size(); ++r) EXPECT_TRUE(equals_exactly(output.narrow(r * n, n), inputs[r])) << "chunk " << r;
      EXPECT_TRUE(equals_exactly(input, inputs[my_rank()])) << "all_gather changed its input";
    }
  }
}

TEST(AllGather, IntoAList) {
  uint64_t salt = 4000;
  for (DType dtype : kCollectiveDtypes) {
    for (int64_t n : kOddSizes) {
      SCOPED_TRACE(case_name(dtype, n));
      const std::vector<Tensor> inputs = all_rank_inputs(world_size(), odd_shape(n), dtype, ++salt);
      std::vector<Tensor> outputs;
      for (int r = 0; r < world_size(); ++r) outputs.push_back(sentinel(odd_shape(n), dtype));
      const WorkHandle work = world().all_gather(outputs, inputs[my_rank()].clone());
      work->wait();
      expect_finished_and_named(work, Collective::AllGather);
      for (int r = 0; r < world_size(); ++r) {
        EXPECT_EQ(outputs[r].shape(), odd_shape(n));
        EXPECT_TRUE(equals_exactly(outputs[r], inputs[r])) << "output " << r;
      }
    }
  }
}

TEST(Broadcast, FromEveryRootRank) {
  uint64_t salt = 5000;
  for (int root = 0; root < world_size(); ++root) {
    for (DType dtype : kCollectiveDtypes) {
      for (int64_t n : {int64_t{1}, int64_t{1001}, int64_t{4099}}) {
        SCOPED_TRACE(case_name(dtype, n, ("root " + std::to_string(root)).c_str()));
        const std::vector<Tensor> inputs = all_rank_inputs(world_size(), odd_shape(n), dtype, ++salt);
        const Tensor tensor = inputs[my_rank()].clone();
        const WorkHandle work = world().broadcast(tensor, root);
        work->wait();
        expect_finished_and_named(work, Collective::Broadcast);
        EXPECT_TRUE(equals_exactly(tensor, inputs[root]));
      }
    }
  }
}

// Causality, not timing: rank 0 arrives late and leaves a file behind just before the barrier; no
// rank may leave the barrier without seeing it. A barrier that did not wait would let the other
// ranks look during rank 0's sleep and fail.
TEST(Barrier, NoRankLeavesBeforeTheLastOneArrives) {
  const Tensor token =
      from_vector<int64_t>({static_cast<int64_t>(std::random_device{}() & 0x7fffffff)}, {1}).to(collective_device());
  world().broadcast(token, 0)->wait();
  const std::filesystem::path marker =
      std::filesystem::temp_directory_path() / ("octet_barrier_" + std::to_string(token.item<int64_t>()));

  world().barrier()->wait();
  if (my_rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::FILE* f = std::fopen(marker.c_str(), "w");
    EXPECT_NE(f, nullptr) << marker;
    if (f) std::fclose(f);
  }
  const WorkHandle work = world().barrier();
  work->wait();
  expect_finished_and_named(work, Collective::Barrier);
  EXPECT_TRUE(std::filesystem::exists(marker)) << "rank " << my_rank() << " left the barrier before rank 0 entered it";

  world().barrier()->wait();  // everyone has looked
  if (my_rank() == 0) std::filesystem::remove(marker);
}

// Five collectives of different kinds issued before any is waited on, then waited in the given
// order: each must still give its own correct result.
void five_collectives_in_flight(bool wait_in_reverse, uint64_t salt) {
  const int n_ranks = world_size(), me = my_rank();
  const std::vector<Tensor> sum_in = all_rank_inputs(n_ranks, {1001}, DType::f32, salt + 1);
  const std::vector<Tensor> scatter_in = all_rank_inputs(n_ranks, {n_ranks * 7}, DType::bf16, salt + 2);
  const std::vector<Tensor> gather_in = all_rank_inputs(n_ranks, {4099}, DType::f64, salt + 3);
  const std::vector<Tensor> bcast_in = all_rank_inputs(n_ranks, {7}, DType::i64, salt + 4);
  const std::vector<Tensor> max_in = all_rank_inputs(n_ranks, {4099}, DType::f32, salt + 5);

  const Tensor summed = sum_in[me].clone(), scattered = sentinel({7}, DType::bf16),
               gathered = sentinel({n_ranks * 4099}, DType::f64), broadcast = bcast_in[me].clone(),
               maxed = max_in[me].clone();
  const int root = n_ranks - 1;
  const std::vector<WorkHandle> works = {
      world().all_reduce(summed, ReduceOp::Sum),
      world().reduce_scatter(scattered, scatter_in[me], ReduceOp::Avg),
      world().all_gather(gathered, gather_in[me]),
      world().broadcast(broadcast, root),
      world().all_reduce(maxed, ReduceOp::Max),
  };
  if (wait_in_reverse) {
    for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  } else {
    for (const WorkHandle& work : works) work->wait();
  }

  expect_finished_and_named(works[0], Collective::AllReduce, "sum");
  expect_finished_and_named(works[1], Collective::ReduceScatter, "avg");
  expect_finished_and_named(works[2], Collective::AllGather);
  expect_finished_and_named(works[3], Collective::Broadcast);
  expect_finished_and_named(works[4], Collective::AllReduce, "max");
  EXPECT_TRUE(reduced_correctly(summed, sum_in, 0, ReduceOp::Sum));
  EXPECT_TRUE(reduced_correctly(scattered, scatter_in, me * 7, ReduceOp::Avg));
  for (int r = 0; r < n_ranks; ++r) EXPECT_TRUE(equals_exactly(gathered.narrow(r * 4099, 4099), gather_in[r]));
  EXPECT_TRUE(equals_exactly(broadcast, bcast_in[root]));
  EXPECT_TRUE(reduced_correctly(maxed, max_in, 0, ReduceOp::Max));
}

TEST(Async, FiveCollectivesInFlightWaitedInIssueOrder) { five_collectives_in_flight(false, 6000); }
TEST(Async, FiveCollectivesInFlightWaitedInReverseOrder) { five_collectives_in_flight(true, 6100); }

// Two collectives on one buffer, the second issued before the first is waited on, run in issue
// order: broadcast then sum gives N × root's values; the other order would give the plain sum.
TEST(Async, CollectivesOnOneBufferRunInIssueOrder) {
  const int root = world_size() - 1;
  const std::vector<Tensor> inputs = all_rank_inputs(world_size(), {1001}, DType::f64, 6200);
  const Tensor tensor = inputs[my_rank()].clone();
  const WorkHandle first = world().broadcast(tensor, root);
  const WorkHandle second = world().all_reduce(tensor, ReduceOp::Sum);
  second->wait();
  first->wait();
  EXPECT_TRUE(first->is_completed());
  const std::vector<Tensor> root_everywhere(world_size(), inputs[root]);
  EXPECT_TRUE(reduced_correctly(tensor, root_everywhere, 0, ReduceOp::Sum));
}

// A collective's result feeding the next collective, both issued before either is waited on: the
// all_gather must gather the sums, and a second all_reduce over the same buffer must sum the sums
// (N × the sum), whatever order the handles are waited in. With CUDA tensors over MPI each
// collective stages its inputs through host memory when issued, so the second must wait for the
// first's result to be back in the buffer (distributed/mpi_process_group.cpp, stage_after_earlier).
TEST(Async, AResultFeedsTheNextCollectiveBeforeItIsWaitedOn) {
  const int n_ranks = world_size(), me = my_rank();
  const std::vector<Tensor> inputs = all_rank_inputs(n_ranks, {517}, DType::f64, 6250);
  const Tensor summed = inputs[me].clone(), gathered = sentinel({n_ranks * 517}, DType::f64);
  const WorkHandle sum = world().all_reduce(summed, ReduceOp::Sum);
  const WorkHandle gather = world().all_gather(gathered, summed);
  gather->wait();
  sum->wait();
  EXPECT_TRUE(reduced_correctly(summed, inputs, 0, ReduceOp::Sum));
  for (int r = 0; r < n_ranks; ++r) EXPECT_TRUE(equals_exactly(gathered.narrow(r * 517, 517), summed)) << "chunk " << r;

  const Tensor twice = inputs[me].clone();
  const WorkHandle first = world().all_reduce(twice, ReduceOp::Sum);
  const WorkHandle second = world().all_reduce(twice, ReduceOp::Sum);
  second->wait();
  first->wait();
  // Every rank holds the same sum after the first, so the second gives exactly N times it.
  const std::vector<Tensor> sums(n_ranks, summed);
  EXPECT_TRUE(reduced_correctly(twice, sums, 0, ReduceOp::Sum));
}

// Waiting on a collective completes every earlier one of the group, whose handles the caller may have
// dropped: FSDP gathers a unit's flat parameters one after the other, keeps the last handle and waits
// on it alone. With CUDA tensors over MPI each result reaches its tensor by a copy, which the group
// must still make for a dropped handle (distributed/mpi_process_group.cpp, StagedResults); a barrier's
// wait does the same.
TEST(Async, WaitingOnTheLastCollectiveCompletesTheDroppedOnes) {
  const int n_ranks = world_size(), me = my_rank();
  const std::vector<Tensor> first = all_rank_inputs(n_ranks, {301}, DType::f32, 6400),
                            second = all_rank_inputs(n_ranks, {77}, DType::bf16, 6401);
  const Tensor gathered_first = sentinel({n_ranks * 301}, DType::f32), gathered_second = sentinel({n_ranks * 77},
                                                                                                  DType::bf16);
  (void)world().all_gather(gathered_first, first[me]);
  world().all_gather(gathered_second, second[me])->wait();
  for (int r = 0; r < n_ranks; ++r) {
    EXPECT_TRUE(equals_exactly(gathered_first.narrow(r * 301, 301), first[r])) << "first, chunk " << r;
    EXPECT_TRUE(equals_exactly(gathered_second.narrow(r * 77, 77), second[r])) << "second, chunk " << r;
  }

  const std::vector<Tensor> summed_in = all_rank_inputs(n_ranks, {1001}, DType::f64, 6402);
  const Tensor summed = summed_in[me].clone();
  (void)world().all_reduce(summed, ReduceOp::Sum);
  world().barrier()->wait();
  EXPECT_TRUE(reduced_correctly(summed, summed_in, 0, ReduceOp::Sum)) << "an all_reduce before a barrier";
}

TEST(Async, SynchronizeAlsoFinishesTheWork) {
  const std::vector<Tensor> inputs = all_rank_inputs(world_size(), {4099}, DType::f32, 6300);
  const Tensor tensor = inputs[my_rank()].clone();
  const WorkHandle work = world().all_reduce(tensor, ReduceOp::Avg);
  work->synchronize();
  EXPECT_TRUE(work->is_completed());
  EXPECT_TRUE(reduced_correctly(tensor, inputs, 0, ReduceOp::Avg));
  work->wait();  // waiting again on finished work is harmless
}

// ---- byte counters ---------------------------------------------------------------------------------

TEST(Counters, CountCallsPayloadAndRingBusBytesExactly) {
  distributed::ProcessGroup& group = world();
  const int n = group.size(), me = group.rank();
  group.reset_counters();
  distributed::CommCounters counters = group.counters();
  EXPECT_EQ(counters.world_size, n);
  for (int c = 0; c < distributed::kNumCollectives; ++c) {
    EXPECT_EQ(counters.calls[c], 0);
    EXPECT_EQ(counters.payload_bytes[c], 0);
  }

  // A known sequence; the payload of each call by the header's rule.
  std::vector<WorkHandle> works;
  const Tensor f32_1001 = rank_input(me, {1001}, DType::f32, 7001), bf16_7 = rank_input(me, {7}, DType::bf16, 7002);
  works.push_back(group.all_reduce(f32_1001, ReduceOp::Sum));  // 4004 B
  works.push_back(group.all_reduce(bf16_7, ReduceOp::Max));    // 14 B
  const Tensor scatter_out = sentinel({7}, DType::f64);
  works.push_back(group.reduce_scatter(scatter_out, rank_input(me, {n * 7}, DType::f64, 7003)));  // the input: 56·N B
  const Tensor gather_in = rank_input(me, {1001}, DType::f32, 7004), gather_out = sentinel({n * 1001}, DType::f32);
  works.push_back(group.all_gather(gather_out, gather_in));  // the output: 4004·N B
  const Tensor list_in = rank_input(me, {7}, DType::i64, 7005);
  std::vector<Tensor> list_out;
  for (int r = 0; r < n; ++r) list_out.push_back(sentinel({7}, DType::i64));
  works.push_back(group.all_gather(list_out, list_in));  // 56·N B
  const Tensor bcast_big = rank_input(me, {4099}, DType::f32, 7006), bcast_one = rank_input(me, {1}, DType::i64, 7007);
  works.push_back(group.broadcast(bcast_big, n - 1));  // 16396 B
  works.push_back(group.broadcast(bcast_one, 0));      // 8 B
  works.push_back(group.barrier());
  works.push_back(group.barrier());
  for (const WorkHandle& work : works) work->wait();

  counters = group.counters();
  EXPECT_EQ(counters.world_size, n);
  EXPECT_EQ(counters.calls_of(Collective::AllReduce), 2);
  EXPECT_EQ(counters.calls_of(Collective::ReduceScatter), 1);
  EXPECT_EQ(counters.calls_of(Collective::AllGather), 2);
  EXPECT_EQ(counters.calls_of(Collective::Broadcast), 2);
  EXPECT_EQ(counters.calls_of(Collective::Barrier), 2);
  EXPECT_EQ(counters.payload_of(Collective::AllReduce), 4004 + 14);
  EXPECT_EQ(counters.payload_of(Collective::ReduceScatter), 56 * n);
  EXPECT_EQ(counters.payload_of(Collective::AllGather), (4004 + 56) * n);
  EXPECT_EQ(counters.payload_of(Collective::Broadcast), 16396 + 8);
  EXPECT_EQ(counters.payload_of(Collective::Barrier), 0);

  // Ring traffic per rank: all_reduce 2(N−1)/N, reduce_scatter and all_gather (N−1)/N, broadcast 1×.
  const double ring = static_cast<double>(n - 1) / n;
  EXPECT_DOUBLE_EQ(counters.bus_bytes(Collective::AllReduce), 2 * ring * (4004 + 14));
  EXPECT_DOUBLE_EQ(counters.bus_bytes(Collective::ReduceScatter), ring * 56 * n);
  EXPECT_DOUBLE_EQ(counters.bus_bytes(Collective::AllGather), ring * (4004 + 56) * n);
  EXPECT_DOUBLE_EQ(counters.bus_bytes(Collective::Broadcast), 16396.0 + 8);
  EXPECT_DOUBLE_EQ(counters.bus_bytes(Collective::Barrier), 0.0);

  // A collective refused by the checks moves nothing, so it is not counted.
  EXPECT_THROW(group.reduce_scatter(sentinel({7}, DType::f32), rank_input(me, {n * 7 + 1}, DType::f32, 7008)), Error);
  EXPECT_EQ(group.counters().calls_of(Collective::ReduceScatter), 1);
  EXPECT_EQ(group.counters().payload_of(Collective::ReduceScatter), 56 * n);

  group.reset_counters();
  counters = group.counters();
  EXPECT_EQ(counters.world_size, n);
  for (int c = 0; c < distributed::kNumCollectives; ++c) {
    EXPECT_EQ(counters.calls[c], 0) << collective_name(static_cast<Collective>(c));
    EXPECT_EQ(counters.payload_bytes[c], 0) << collective_name(static_cast<Collective>(c));
    EXPECT_EQ(counters.bus_bytes(static_cast<Collective>(c)), 0.0);
  }
}

// ---- errors ------------------------------------------------------------------------------------------
// The checks run in the base class before anything is sent, on arguments every rank shares, so every
// rank throws the same error and none is left waiting. Each test ends by proving the ranks are still
// in step with one collective.

void expect_ranks_still_in_step() {
  const Tensor t = from_vector<int64_t>({my_rank() + 1}, {1}).to(collective_device());
  world().all_reduce(t, ReduceOp::Sum)->wait();
  EXPECT_EQ(t.item<int64_t>(), int64_t{world_size()} * (world_size() + 1) / 2);
}

TEST(Errors, ReduceScatterInputMustBeWorldSizeTimesOutput) {
  const int n = world_size();
  const Tensor output = sentinel({7}, DType::f32);
  const Tensor too_long = rank_input(my_rank(), {n * 7 + 1}, DType::f32, 8001);
  // The message names the wrong tensor and the size it should have.
  EXPECT_TRUE(throws_with([&] { world().reduce_scatter(output, too_long); },
                          {"reduce_scatter", too_long.describe(), std::to_string(n * 7)}));
  const Tensor other_dtype = rank_input(my_rank(), {n * 7}, DType::f64, 8002);
  EXPECT_TRUE(throws_with([&] { world().reduce_scatter(output, other_dtype); },
                          {"reduce_scatter", output.describe(), other_dtype.describe()}));
  expect_ranks_still_in_step();
}

TEST(Errors, AllGatherOutputMustBeWorldSizeTimesInput) {
  const int n = world_size();
  const Tensor input = rank_input(my_rank(), {7}, DType::f32, 8003);
  const Tensor too_short = sentinel({n * 7 - 1}, DType::f32);
  EXPECT_TRUE(throws_with([&] { world().all_gather(too_short, input); },
                          {"all_gather", too_short.describe(), std::to_string(n * 7)}));
  const Tensor other_dtype = sentinel({n * 7}, DType::bf16);
  EXPECT_TRUE(throws_with([&] { world().all_gather(other_dtype, input); },
                          {"all_gather", other_dtype.describe(), input.describe()}));
  expect_ranks_still_in_step();
}

TEST(Errors, AllGatherListNeedsOneInputShapedOutputPerRank) {
  const int n = world_size();
  const Tensor input = rank_input(my_rank(), {3, 7}, DType::f32, 8004);
  std::vector<Tensor> one_too_many;
  for (int r = 0; r <= n; ++r) one_too_many.push_back(sentinel({3, 7}, DType::f32));
  EXPECT_TRUE(throws_with([&] { world().all_gather(one_too_many, input); }, {"all_gather", std::to_string(n + 1)}));
  const std::vector<Tensor> none;
  EXPECT_TRUE(throws_with([&] { world().all_gather(none, input); }, {"all_gather", "0"}));

  std::vector<Tensor> one_misshaped;
  for (int r = 0; r < n; ++r) one_misshaped.push_back(sentinel({3, 7}, DType::f32));
  one_misshaped[n - 1] = sentinel({3, 8}, DType::f32);
  EXPECT_TRUE(throws_with([&] { world().all_gather(one_misshaped, input); },
                          {"all_gather", one_misshaped[n - 1].describe(), input.describe()}));
  std::vector<Tensor> one_missing = one_misshaped;
  one_missing[n - 1] = Tensor();
  EXPECT_TRUE(throws_with([&] { world().all_gather(one_missing, input); }, {"all_gather", "undefined"}));
  expect_ranks_still_in_step();
}

TEST(Errors, UndefinedTensorsAreRefusedByEveryCollective) {
  const Tensor defined = rank_input(my_rank(), {world_size() * 7}, DType::f32, 8005);
  const Tensor undefined;
  EXPECT_TRUE(throws_with([&] { world().all_reduce(undefined); }, {"all_reduce", "undefined"}));
  EXPECT_TRUE(throws_with([&] { world().broadcast(undefined, 0); }, {"broadcast", "undefined"}));
  EXPECT_TRUE(throws_with([&] { world().reduce_scatter(undefined, defined); }, {"reduce_scatter", "undefined"}));
  EXPECT_TRUE(throws_with([&] { world().reduce_scatter(sentinel({7}, DType::f32), undefined); },
                          {"reduce_scatter", "undefined"}));
  EXPECT_TRUE(throws_with([&] { world().all_gather(defined, undefined); }, {"all_gather", "undefined"}));
  EXPECT_TRUE(throws_with([&] { world().all_gather(undefined, defined); }, {"all_gather", "undefined"}));
  expect_ranks_still_in_step();
}

TEST(Errors, UnsupportedDtypesAreRefused) {
  // The header's list: f32, bf16, f16, f64 and i64.
  for (DType dtype : {DType::i32, DType::u8, DType::e4m3}) {
    const Tensor t = full({7}, 1.0, dtype).to(collective_device());
    EXPECT_TRUE(throws_with([&] { world().all_reduce(t); }, {"all_reduce", dtype_name(dtype)})) << dtype_name(dtype);
  }
  expect_ranks_still_in_step();
}

TEST(Errors, BroadcastRootMustBeARank) {
  const Tensor t = rank_input(my_rank(), {7}, DType::f32, 8006);
  const Tensor before = t.clone();
  for (int root : {-1, world_size(), world_size() + 5}) {
    EXPECT_TRUE(throws_with([&] { world().broadcast(t, root); }, {"broadcast", "root", std::to_string(root)})) << root;
  }
  EXPECT_TRUE(equals_exactly(t, before));
  expect_ranks_still_in_step();
}

// A CUDA tensor on the CPU group, or a CPU tensor on a CUDA group (OCTET_TEST_DEVICE=cuda:0).
TEST(Errors, ATensorOnAnotherDeviceIsRefused) {
  const bool group_on_cpu = world().device().is_cpu();
  if (group_on_cpu && !cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device on this machine; this test runs on the GPU machine";
  }
  const Tensor elsewhere = rank_input(my_rank(), {7}, DType::f32, 8007).to(group_on_cpu ? Device::cuda(0) : Device::cpu());
  EXPECT_TRUE(throws_with([&] { world().all_reduce(elsewhere); }, {"all_reduce", elsewhere.describe()}));
  expect_ranks_still_in_step();
}

}  // namespace
}  // namespace octet::testing
