// The pure parts of data parallelism, without ranks: FSDP's layout planner (distributed/fsdp_layout.h),
// hybrid sharding's groups (distributed/fsdp_hybrid.h) and the ordered release of gradient buckets
// that DDP and FSDP share (distributed/ordered_reducer.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "distributed/fsdp_hybrid.h"
#include "distributed/fsdp_layout.h"
#include "distributed/ordered_reducer.h"
#include "tests/testing.h"

namespace octet::testing {
namespace {

using distributed::FsdpLayout;
using distributed::LayoutParameter;
using distributed::OrderedReducer;
using distributed::plan_fsdp_layout;

// A small ViT-like model: a root (patch embedding, head), blocks.0 .. blocks.10 with a weight and a
// bias each, and a frozen parameter in blocks.1.
std::vector<LayoutParameter> model_parameters() {
  std::vector<LayoutParameter> p = {{"patch.weight", 48, 1}, {"patch.bias", 4, 0}};
  for (int b = 0; b <= 10; ++b) {
    const std::string prefix = "blocks." + std::to_string(b) + ".";
    p.push_back({prefix + "fc.weight", 32 + b, 1});
    p.push_back({prefix + "fc.bias", 3, 0});
  }
  p.push_back({"blocks.1.base.weight", 7, 1, /*trainable=*/false});
  p.push_back({"head.weight", 40, 1});
  return p;
}

std::vector<std::string> blocks() {
  std::vector<std::string> names;
  for (int b = 0; b <= 10; ++b) names.push_back("blocks." + std::to_string(b));
  return names;
}

std::vector<std::string> names_of(const FsdpLayout& layout, int f, const std::vector<LayoutParameter>& params) {
  std::vector<std::string> out;
  for (int i : layout.flats[f].parameters) out.push_back(params[i].name);
  return out;
}

TEST(FsdpLayout, UnitsAreTheRootAndTheOutermostWrappedModules) {
  std::vector<std::string> wrapped = blocks();
  wrapped.insert(wrapped.begin() + 2, "blocks.1.fc");  // inside blocks.1: not a unit of its own
  const FsdpLayout layout = plan_fsdp_layout(wrapped, model_parameters(), 4);
  ASSERT_EQ(layout.units.size(), 12u);
  EXPECT_EQ(layout.units[0], "");
  EXPECT_EQ(layout.units[2], "blocks.1");
  EXPECT_EQ(layout.units[11], "blocks.10");
  // blocks.1's parameters are its own, not blocks.10's (a name prefix ends at a dot).
  const std::vector<LayoutParameter> params = model_parameters();
  EXPECT_EQ(names_of(layout, layout.unit_flats[2][0], params), (std::vector<std::string>{"blocks.1.fc.weight"}));
  EXPECT_EQ(names_of(layout, layout.unit_flats[11][0], params), (std::vector<std::string>{"blocks.10.fc.weight"}));
  EXPECT_TRUE(throws_with([] { (void)plan_fsdp_layout({""}, model_parameters(), 2); }, {"root"}));
  EXPECT_TRUE(throws_with([] { (void)plan_fsdp_layout({}, model_parameters(), 0); }, {"world size", "0"}));
}

// Per unit, one flat per (key, trainable, fp8) in the order each first appears; inside a flat the
// parameters sit back to back in registration order; a flat is padded to a multiple of the world.
TEST(FsdpLayout, FlatsSplitByKeyTrainableAndFp8AndArePaddedToTheWorld) {
  std::vector<LayoutParameter> params = model_parameters();
  params[0].fp8 = true;  // patch.weight, as the weight of an FP8 Linear
  for (int world : {1, 2, 3, 4, 7}) {
    SCOPED_TRACE("world " + std::to_string(world));
    const FsdpLayout layout = plan_fsdp_layout(blocks(), params, world);
    // The root: patch.weight (key 1, fp8), patch.bias (key 0), head.weight (key 1).
    ASSERT_EQ(layout.unit_flats[0].size(), 3u);
    EXPECT_EQ(names_of(layout, layout.unit_flats[0][0], params), (std::vector<std::string>{"patch.weight"}));
    EXPECT_TRUE(layout.flats[layout.unit_flats[0][0]].fp8);
    EXPECT_EQ(names_of(layout, layout.unit_flats[0][2], params), (std::vector<std::string>{"head.weight"}));
    // blocks.1: its weight (key 1), its bias (key 0), its frozen weight (key 1, frozen).
    const std::vector<int>& b1 = layout.unit_flats[2];
    ASSERT_EQ(b1.size(), 3u);
    EXPECT_FALSE(layout.flats[b1[2]].trainable);
    EXPECT_EQ(names_of(layout, b1[2], params), (std::vector<std::string>{"blocks.1.base.weight"}));
    int64_t total = 0;
    for (const auto& flat : layout.flats) {
      int64_t at = 0;
      for (size_t i = 0; i < flat.parameters.size(); ++i) {
        EXPECT_EQ(flat.offsets[i], at);
        at += params[flat.parameters[i]].numel;
      }
      EXPECT_EQ(flat.numel, at);
      EXPECT_EQ(flat.padded % world, 0);
      EXPECT_GE(flat.padded, flat.numel);
      EXPECT_LT(flat.padded - flat.numel, world);
      EXPECT_EQ(flat.shard_numel * world, flat.padded);
      total += flat.numel;
    }
    const int64_t expected = std::accumulate(params.begin(), params.end(), int64_t{0},
                                             [](int64_t s, const LayoutParameter& p) { return s + p.numel; });
    EXPECT_EQ(total, expected) << "every parameter in exactly one flat";
  }
}

// Backward finishes the last unit first: its flats are reduced first, the root's last, frozen ones never.
TEST(FsdpLayout, FlatsAreReducedLastUnitFirstAndFrozenOnesNever) {
  const FsdpLayout layout = plan_fsdp_layout(blocks(), model_parameters(), 2);
  std::vector<int> expected;
  for (size_t u = layout.units.size(); u-- > 0;) {
    for (int f : layout.unit_flats[u]) {
      if (layout.flats[f].trainable) expected.push_back(f);
    }
  }
  EXPECT_EQ(layout.reduce_order, expected);
  EXPECT_EQ(layout.flats[layout.reduce_order.front()].unit, 11);
  EXPECT_EQ(layout.flats[layout.reduce_order.back()].unit, 0);
  EXPECT_EQ(layout.reduce_order.size(), layout.flats.size() - 1);
}

OrderedReducer three_buckets() { return OrderedReducer({{"a", "b"}, {"c"}, {"d", "e", "f"}}, "Wrapper"); }

// Whatever order gradients arrive in, buckets are released in bucket order.
TEST(OrderedReducer, ReleasesBucketsInOrderWhateverOrderGradientsArriveIn) {
  std::vector<std::pair<int, int>> members = {{0, 0}, {0, 1}, {1, 0}, {2, 0}, {2, 1}, {2, 2}};
  std::mt19937 rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    std::shuffle(members.begin(), members.end(), rng);
    OrderedReducer reducer = three_buckets();
    reducer.begin_pass();
    std::vector<int> released;
    for (const auto& [b, m] : members) {
      reducer.arrive(b, m);
      for (int r : reducer.take_ready()) {
        // A bucket is released only when it and every bucket before it are full.
        EXPECT_EQ(r, static_cast<int>(released.size()));
        released.push_back(r);
      }
    }
    EXPECT_EQ(released, (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(reducer.launched(), 3);
  }
}

TEST(OrderedReducer, FillsWhatNeverArrivedAndNamesAGradientThatArrivesTwice) {
  OrderedReducer reducer = three_buckets();
  reducer.begin_pass();
  reducer.arrive(2, 1);
  reducer.arrive(0, 1);
  EXPECT_TRUE(reducer.take_ready().empty());
  EXPECT_TRUE(throws_with([&] { reducer.arrive(0, 1); }, {"Wrapper", "gradient of b", "twice"}));
  std::vector<std::pair<int, int>> filled;
  reducer.finish_pass([&](int b, int m) { filled.emplace_back(b, m); });
  EXPECT_EQ(filled, (std::vector<std::pair<int, int>>{{0, 0}, {1, 0}, {2, 0}, {2, 2}}));
  EXPECT_EQ(reducer.take_ready(), (std::vector<int>{0, 1, 2}));
  reducer.end_pass();
  EXPECT_FALSE(reducer.pass_active());
  EXPECT_TRUE(throws_with([&] { reducer.arrive(1, 0); }, {"outside a backward pass"}));
  // A new pass waits for every member again.
  reducer.begin_pass();
  EXPECT_EQ(reducer.launched(), 0);
  reducer.arrive(1, 0);
  EXPECT_TRUE(reducer.take_ready().empty());
  reducer.arrive(0, 0);
  reducer.arrive(0, 1);
  EXPECT_EQ(reducer.take_ready(), (std::vector<int>{0, 1}));
}

// 8 ranks on 2 nodes of 4: shard groups are the nodes, replicate groups one rank of each node.
TEST(HybridGroups, ShardGroupsAreConsecutiveRanksAndReplicateGroupsStrideAcrossThem) {
  const distributed::fsdp::HybridLayout layout = distributed::fsdp::plan_hybrid_groups(8, 6, 4);
  EXPECT_EQ(layout.shard_group_size, 4);
  EXPECT_EQ(layout.replicas, 2);
  EXPECT_EQ(layout.shard_color, 1);
  EXPECT_EQ(layout.replicate_color, 2);
  EXPECT_EQ(layout.shard_groups, (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(layout.replicate_groups, (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(distributed::fsdp::describe(layout),
            "2 shard groups of 4 ranks: {0,1,2,3} {4,5,6,7}; 4 replicate groups of 2 ranks: {0,4} {1,5} {2,6} {3,7}");
  // Every rank is in exactly one group of each kind, and its colors name them.
  for (int n : {1, 6, 12}) {
    for (int g = 1; g <= n; ++g) {
      if (n % g != 0) continue;
      for (int r = 0; r < n; ++r) {
        const auto l = distributed::fsdp::plan_hybrid_groups(n, r, g);
        const auto& shard = l.shard_groups.at(static_cast<size_t>(l.shard_color));
        const auto& replicate = l.replicate_groups.at(static_cast<size_t>(l.replicate_color));
        EXPECT_EQ(std::count(shard.begin(), shard.end(), r), 1);
        EXPECT_EQ(std::count(replicate.begin(), replicate.end(), r), 1);
        EXPECT_EQ(static_cast<int>(shard.size()), g);
        EXPECT_EQ(static_cast<int>(replicate.size()), n / g);
      }
    }
  }
}

// A large job's log line names the first groups and the last.
TEST(HybridGroups, ManyGroupsAreElidedInTheDescription) {
  const std::string text = distributed::fsdp::describe(distributed::fsdp::plan_hybrid_groups(12, 0, 2));
  EXPECT_EQ(text, "6 shard groups of 2 ranks: {0,1} {2,3} {4,5} … {10,11}; 2 replicate groups of 6 ranks: "
                  "{0,2,4,6,8,10} {1,3,5,7,9,11}");
}

TEST(HybridGroups, ASizeThatDoesNotDivideTheWorldNamesBothAndTheFix) {
  EXPECT_TRUE(throws_with([] { distributed::fsdp::plan_hybrid_groups(6, 0, 4); },
                          {"world size 6", "shard group size 4", "divides 6", "multiple of 4"}));
  EXPECT_TRUE(throws_with([] { distributed::fsdp::plan_hybrid_groups(4, 0, 0); }, {"shard group size 0"}));
}

}  // namespace
}  // namespace octet::testing
