// ProcessGroup::split on the MPI backend, run by mpirun at 4 and 6 ranks (label mpi; main in
// mpi_main.cpp): groups of consecutive ranks (one "node" each, as hybrid sharding makes them), of
// strided ranks (one per node), uneven groups, reversed keys and ranks left out. Every collective in
// a subgroup runs on random data and is checked against its members' inputs, which every rank
// rebuilds from (salt, world rank); counters are kept per group; subgroup and world collectives may
// be in flight together.
//
// As mpi_main.h asks: the same collectives in the same order on every rank of each group, EXPECT
// between collectives, never an early return.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "distributed/process_group.h"
#include "tests/distributed/collective_testing.h"
#include "tests/distributed/mpi_main.h"

namespace octet::testing {
namespace {

using distributed::Collective;
using distributed::ProcessGroup;
using distributed::ReduceOp;
using distributed::WorkHandle;

int my_rank() { return world().rank(); }

// A subgroup and its members' world ranks in their subgroup rank order, which each rank works out
// alone from the colors and keys.
struct Split {
  std::shared_ptr<ProcessGroup> group;
  std::vector<int> members;
  std::string name;

  int member(int group_rank) const { return members[static_cast<size_t>(group_rank)]; }
  // Every member's input in test `salt`, in group rank order.
  std::vector<Tensor> inputs(const Shape& shape, DType dtype, uint64_t salt) const {
    std::vector<Tensor> out;
    for (int r : members) out.push_back(rank_input(r, shape, dtype, salt));
    return out;
  }
};

Split split_world(const std::string& name, const std::function<int(int)>& color, const std::function<int(int)>& key) {
  Split s{world().split(color(my_rank()), key(my_rank())), {}, name};
  if (color(my_rank()) == ProcessGroup::kNoColor) return s;
  for (int r = 0; r < world().size(); ++r) {
    if (color(r) == color(my_rank())) s.members.push_back(r);
  }
  std::stable_sort(s.members.begin(), s.members.end(), [&](int a, int b) { return key(a) < key(b); });
  return s;
}

// The splits every test runs on: at 6 ranks, 3 "nodes" of 2, 2 strided groups of 3, the same
// groups with their order reversed, one rank against the rest, and the world without its multiples of 3.
std::vector<Split> splits() {
  const int n = world().size();
  std::vector<Split> out;
  out.push_back(split_world("nodes of 2", [](int r) { return r / 2; }, [](int r) { return r; }));
  out.push_back(split_world("strided", [](int r) { return r % 2; }, [](int r) { return r; }));
  out.push_back(split_world("strided, reversed", [](int r) { return r % 2; }, [](int r) { return -r; }));
  out.push_back(split_world("uneven", [n](int r) { return r == n - 1 ? 7 : 3; }, [](int r) { return r; }));
  out.push_back(split_world(
      "some left out", [](int r) { return r % 3 == 0 ? ProcessGroup::kNoColor : 0; }, [](int r) { return r; }));
  return out;
}

TEST(Split, RanksAndSizesFollowColorAndKey) {
  for (const Split& s : splits()) {
    SCOPED_TRACE(s.name);
    if (s.members.empty()) {
      EXPECT_EQ(s.group, nullptr) << "a rank that passed kNoColor got a group";
      continue;
    }
    EXPECT_TRUE(s.group != nullptr);
    if (!s.group) continue;
    const auto me = std::find(s.members.begin(), s.members.end(), my_rank());
    EXPECT_EQ(s.group->rank(), me - s.members.begin());
    EXPECT_EQ(s.group->size(), static_cast<int>(s.members.size()));
    EXPECT_EQ(s.group->counters().world_size, s.group->size());
    EXPECT_EQ(s.group->backend(), world().backend());
    EXPECT_EQ(s.group->device().str(), world().device().str());
    EXPECT_EQ(s.group->options().timeout, world().options().timeout);
  }
}

TEST(Split, EveryCollectiveInASubgroupCombinesItsMembersInputs) {
  uint64_t salt = 10000;
  for (const Split& s : splits()) {
    if (!s.group) continue;
    ProcessGroup& g = *s.group;
    const int n = g.size(), me = g.rank();
    for (DType dtype : {DType::f32, DType::bf16, DType::i64}) {
      SCOPED_TRACE(s.name + ", " + dtype_name(dtype));
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        if (op == ReduceOp::Avg && dtype == DType::i64) continue;
        const std::vector<Tensor> in = s.inputs({1001}, dtype, ++salt);
        const Tensor t = in[me].clone();
        g.all_reduce(t, op)->wait();
        EXPECT_TRUE(reduced_correctly(t, in, 0, op)) << "all_reduce " << distributed::reduce_op_name(op);

        const std::vector<Tensor> scatter_in = s.inputs({n * 7}, dtype, ++salt);
        const Tensor scattered = sentinel({7}, dtype);
        g.reduce_scatter(scattered, scatter_in[me], op)->wait();
        EXPECT_TRUE(reduced_correctly(scattered, scatter_in, me * 7, op)) << "reduce_scatter";
      }
      const std::vector<Tensor> gather_in = s.inputs({7, 11, 13}, dtype, ++salt);
      const Tensor gathered = sentinel({n * 1001}, dtype);
      g.all_gather(gathered, gather_in[me])->wait();
      for (int k = 0; k < n; ++k) EXPECT_TRUE(equals_exactly(gathered.narrow(k * 1001, 1001), gather_in[k])) << k;

      const std::vector<Tensor> bcast_in = s.inputs({4099}, dtype, ++salt);
      const Tensor bcast = bcast_in[me].clone();
      g.broadcast(bcast, n - 1)->wait();
      EXPECT_TRUE(equals_exactly(bcast, bcast_in[n - 1])) << "broadcast from group rank " << n - 1 << " (world rank "
                                                          << s.member(n - 1) << ")";
    }
    g.barrier()->wait();
  }
}

// Each group counts its own collectives, with its own size for the ring's bus bytes; the world's
// counters and the other subgroups' see none of them.
TEST(Split, CountersArePerGroup) {
  const Split nodes = split_world("nodes of 2", [](int r) { return r / 2; }, [](int r) { return r; });
  const Split strided = split_world("strided", [](int r) { return r % 2; }, [](int r) { return r; });
  ProcessGroup& g = *nodes.group;
  const int n = g.size();
  world().reset_counters();
  std::vector<WorkHandle> works;
  const Tensor summed = rank_input(my_rank(), {1001}, DType::f32, 20001);
  works.push_back(g.all_reduce(summed, ReduceOp::Sum));  // 4004 B
  const Tensor gathered = sentinel({n * 7}, DType::f64);
  works.push_back(g.all_gather(gathered, rank_input(my_rank(), {7}, DType::f64, 20002)));  // 56·n B
  const Tensor scattered = sentinel({7}, DType::f32);
  works.push_back(g.reduce_scatter(scattered, rank_input(my_rank(), {n * 7}, DType::f32, 20003)));  // 28·n B
  for (const WorkHandle& w : works) w->wait();

  const distributed::CommCounters c = g.counters();
  EXPECT_EQ(c.world_size, n);
  EXPECT_EQ(c.calls_of(Collective::AllReduce), 1);
  EXPECT_EQ(c.payload_of(Collective::AllReduce), 4004);
  EXPECT_EQ(c.payload_of(Collective::AllGather), 56 * n);
  EXPECT_EQ(c.payload_of(Collective::ReduceScatter), 28 * n);
  EXPECT_DOUBLE_EQ(c.bus_bytes(Collective::AllReduce), 2.0 * (n - 1) / n * 4004);
  EXPECT_DOUBLE_EQ(c.bus_bytes(Collective::AllGather), (n - 1.0) / n * 56 * n);
  for (int k = 0; k < distributed::kNumCollectives; ++k) {
    EXPECT_EQ(world().counters().calls[k], 0) << "the world counted a subgroup's collective";
    EXPECT_EQ(strided.group->counters().calls[k], 0) << "another subgroup counted this one's collective";
  }
  g.reset_counters();
  EXPECT_EQ(g.counters().payload_of(Collective::AllReduce), 0);
}

// Groups run their collectives independently: a world all-reduce and two subgroups' collectives,
// all issued before any is waited on, waited on in reverse, each with its own correct result.
TEST(Split, SubgroupAndWorldCollectivesInFlightTogether) {
  const Split nodes = split_world("nodes of 2", [](int r) { return r / 2; }, [](int r) { return r; });
  const Split strided = split_world("strided", [](int r) { return r % 2; }, [](int r) { return r; });
  std::vector<Tensor> world_in;
  for (int r = 0; r < world().size(); ++r) world_in.push_back(rank_input(r, {4099}, DType::f32, 30001));
  const std::vector<Tensor> node_in = nodes.inputs({4099}, DType::f32, 30002);
  const std::vector<Tensor> strided_in = strided.inputs({strided.group->size() * 1001}, DType::f64, 30003);
  const Tensor in_world = world_in[my_rank()].clone(), in_node = node_in[nodes.group->rank()].clone();
  const Tensor in_strided = sentinel({1001}, DType::f64);
  const std::vector<WorkHandle> works = {
      nodes.group->all_reduce(in_node, ReduceOp::Avg),
      world().all_reduce(in_world, ReduceOp::Sum),
      strided.group->reduce_scatter(in_strided, strided_in[strided.group->rank()], ReduceOp::Sum),
  };
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  EXPECT_TRUE(reduced_correctly(in_node, node_in, 0, ReduceOp::Avg));
  EXPECT_TRUE(reduced_correctly(in_world, world_in, 0, ReduceOp::Sum));
  EXPECT_TRUE(reduced_correctly(in_strided, strided_in, strided.group->rank() * 1001, ReduceOp::Sum));
}

// A subgroup splits again: the strided groups into halves by their own rank.
TEST(Split, ASubgroupSplitsAgain) {
  const Split strided = split_world("strided", [](int r) { return r % 2; }, [](int r) { return r; });
  ProcessGroup& g = *strided.group;
  const auto half = g.split(g.rank() < (g.size() + 1) / 2 ? 0 : 1, g.rank());
  ASSERT_TRUE(half != nullptr);
  std::vector<int> members;
  for (int k = 0; k < g.size(); ++k) {
    if ((k < (g.size() + 1) / 2) == (g.rank() < (g.size() + 1) / 2)) members.push_back(strided.member(k));
  }
  EXPECT_EQ(half->size(), static_cast<int>(members.size()));
  std::vector<Tensor> in;
  for (int r : members) in.push_back(rank_input(r, {1001}, DType::f64, 40001));
  const Tensor t = rank_input(my_rank(), {1001}, DType::f64, 40001);
  half->all_reduce(t, ReduceOp::Sum)->wait();
  EXPECT_TRUE(reduced_correctly(t, in, 0, ReduceOp::Sum));
}

// The check runs before anything is sent: a color every rank passes wrong fails on every rank.
TEST(Split, ANegativeColorOtherThanNoColorIsRefused) {
  EXPECT_TRUE(throws_with([] { world().split(-2, 0); }, {"split", "color -2", "kNoColor"}));
  const Tensor t = from_vector<int64_t>({my_rank() + 1}, {1}).to(collective_device());
  world().all_reduce(t, ReduceOp::Sum)->wait();
  EXPECT_EQ(t.item<int64_t>(), int64_t{world().size()} * (world().size() + 1) / 2) << "the ranks fell out of step";
}

}  // namespace
}  // namespace octet::testing
