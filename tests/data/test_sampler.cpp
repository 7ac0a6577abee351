// DistributedSampler against PyTorch's semantics (hand-worked examples and its size formulas), and
// the Philox Fisher-Yates shuffle checked for uniformity.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "data/sampler.h"
#include "tests/testing.h"

namespace {

using namespace octet::data;
using octet::testing::throws_with;

std::vector<std::vector<int64_t>> all_ranks(int64_t size, int world, bool shuffle, uint64_t seed, bool drop_last,
                                            int64_t epoch) {
  std::vector<std::vector<int64_t>> shards;
  for (int r = 0; r < world; ++r)
    shards.push_back(DistributedSampler(size, r, world, shuffle, seed, drop_last).indices(epoch));
  return shards;
}

TEST(DistributedSampler, HandWorkedPyTorchExamples) {
  // torch.utils.data.DistributedSampler(range(10), num_replicas=3, shuffle=False): padded with 0, 1.
  using Shards = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(all_ranks(10, 3, false, 0, false, 0), (Shards{{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}}));
  // drop_last=True trims to 9.
  EXPECT_EQ(all_ranks(10, 3, false, 0, true, 0), (Shards{{0, 3, 6}, {1, 4, 7}, {2, 5, 8}}));
  // More ranks than items: the padding wraps around more than once.
  EXPECT_EQ(all_ranks(2, 5, false, 0, false, 0), (Shards{{0}, {1}, {0}, {1}, {0}}));
  EXPECT_EQ(all_ranks(2, 5, false, 0, true, 0), (Shards(5)));
  EXPECT_EQ(all_ranks(4, 1, false, 0, false, 3), (Shards{{0, 1, 2, 3}}));
}

TEST(DistributedSampler, EveryIndexOncePerEpochAcrossRanks) {
  for (int64_t size : {1, 2, 7, 10, 64, 101}) {
    for (int world : {1, 2, 3, 4, 7}) {
      for (bool drop_last : {false, true}) {
        for (bool shuffle : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "size " << size << " world " << world << " drop_last " << drop_last
                                            << " shuffle " << shuffle);
          // PyTorch: num_samples = math.ceil((size - world) / world) with drop_last when size % world != 0,
          // else math.ceil(size / world).
          const int64_t expected_per_rank = drop_last && size % world != 0
                                                ? static_cast<int64_t>(std::ceil(double(size - world) / world))
                                                : static_cast<int64_t>(std::ceil(double(size) / world));
          const auto shards = all_ranks(size, world, shuffle, 17, drop_last, 2);
          std::map<int64_t, int> seen;
          for (int r = 0; r < world; ++r) {
            ASSERT_EQ(static_cast<int64_t>(shards[r].size()), std::max<int64_t>(expected_per_rank, 0));
            EXPECT_EQ(DistributedSampler(size, r, world, shuffle, 17, drop_last).num_samples(),
                      static_cast<int64_t>(shards[r].size()));
            for (int64_t i : shards[r]) {
              ASSERT_GE(i, 0);
              ASSERT_LT(i, size);
              ++seen[i];
            }
          }
          const int64_t total = expected_per_rank * world;
          if (drop_last || size % world == 0) {
            // Disjoint shards, each index at most once; all of them when nothing is trimmed.
            for (auto [index, times] : seen) EXPECT_EQ(times, 1) << "index " << index;
            EXPECT_EQ(static_cast<int64_t>(seen.size()), total);
          } else {
            // Every index, plus (total - size) wrapped-around duplicates.
            EXPECT_EQ(static_cast<int64_t>(seen.size()), size);
            int64_t extra = 0;
            for (auto [index, times] : seen) extra += times - 1;
            EXPECT_EQ(extra, total - size);
          }
        }
      }
    }
  }
}

TEST(DistributedSampler, ShardsInterleaveOnePermutationPerEpoch) {
  const int64_t size = 50;
  const int world = 3;
  for (int64_t epoch : {0, 1, 5}) {
    const auto shards = all_ranks(size, world, true, 123, true, epoch);
    const std::vector<int64_t> perm = random_permutation(size, 123, epoch);
    for (int r = 0; r < world; ++r) {
      for (size_t k = 0; k < shards[r].size(); ++k) EXPECT_EQ(shards[r][k], perm[r + k * world]);
    }
  }
}

TEST(DistributedSampler, OrderDependsOnSeedAndEpochOnly) {
  const DistributedSampler a(1000, 1, 4, true, 7, false), b(1000, 1, 4, true, 7, false),
      c(1000, 1, 4, true, 8, false);
  EXPECT_EQ(a.indices(3), b.indices(3));
  EXPECT_NE(a.indices(3), a.indices(4));
  EXPECT_NE(a.indices(3), c.indices(3));
  std::vector<int64_t> sorted = random_permutation(1000, 7, 3);
  EXPECT_NE(sorted, random_permutation(1000, 7, 4));
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  // Without shuffle the epoch does not matter.
  const DistributedSampler plain(1000, 1, 4, false, 7, false);
  EXPECT_EQ(plain.indices(0), plain.indices(9));
}

TEST(DistributedSampler, ShuffleIsUniform) {
  // All 24 orders of 4 items over 4800 (seed, epoch) pairs: each expected 200 times (sd ~14); an
  // off-by-one in Fisher-Yates (Sattolo's cycle, or j drawn from [0, n)) shows up far outside.
  std::map<std::vector<int64_t>, int> counts;
  for (uint64_t seed = 0; seed < 48; ++seed) {
    for (int64_t epoch = 0; epoch < 100; ++epoch) ++counts[random_permutation(4, seed, epoch)];
  }
  EXPECT_EQ(counts.size(), 24u);
  for (const auto& [perm, count] : counts) EXPECT_NEAR(count, 200, 60);
}

TEST(DistributedSampler, RejectsBadRanks) {
  EXPECT_TRUE(
      throws_with([] { DistributedSampler(10, 3, 3, true, 0, false); }, {"rank 3", "world size 3", "0 <= rank"}));
  EXPECT_TRUE(throws_with([] { DistributedSampler(10, 0, 0, true, 0, false); }, {"world size 0"}));
  EXPECT_TRUE(throws_with([] { DistributedSampler(0, 0, 1, true, 0, false); }, {"empty"}));
  EXPECT_TRUE(throws_with([] { DistributedSampler(5, 0, 1, true, 0, false).indices(-1); }, {"epoch -1"}));
}

}  // namespace
