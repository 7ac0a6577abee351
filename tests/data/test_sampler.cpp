// DistributedSampler: each global batch split in rank order (hand-worked examples), N ranks x B
// items equal to one process with N·B items, batch for batch; world 1 equal to the single-process
// order the loader read before the sampler knew the batch size; every item once per epoch without
// drop_last. And the Philox Fisher-Yates shuffle: pinned values and uniformity.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <vector>

#include "data/sampler.h"
#include "tests/testing.h"

namespace {

using namespace octet::data;
using octet::testing::throws_with;
using Batches = std::vector<std::vector<int64_t>>;

// The sampler's indices for `epoch`, cut into its batches with batch_count.
Batches batches_of(const DistributedSampler& sampler, int64_t epoch) {
  const std::vector<int64_t> mine = sampler.indices(epoch);
  EXPECT_EQ(static_cast<int64_t>(mine.size()), sampler.num_samples());
  Batches batches;
  int64_t at = 0;
  for (int64_t b = 0; b < sampler.batches_per_epoch(); ++b) {
    const int64_t count = sampler.batch_count(b);
    EXPECT_TRUE(count == sampler.batch_size() || b + 1 == sampler.batches_per_epoch())
        << "batch " << b << " of " << sampler.batches_per_epoch() << " holds " << count;
    batches.emplace_back(mine.begin() + at, mine.begin() + at + count);
    at += count;
  }
  EXPECT_EQ(at, static_cast<int64_t>(mine.size()));
  return batches;
}

// Every rank's batches: [rank][batch][item].
std::vector<Batches> all_ranks(int64_t size, int world, int64_t batch_size, bool shuffle, uint64_t seed,
                               bool drop_last, int64_t epoch) {
  std::vector<Batches> ranks;
  for (int r = 0; r < world; ++r)
    ranks.push_back(batches_of(DistributedSampler(size, r, world, batch_size, shuffle, seed, drop_last), epoch));
  return ranks;
}

// What one process read before the sampler took a batch size: the whole order (a permutation, or
// 0..size-1), cut by the loader into consecutive batches of B, the short tail dropped or kept.
Batches single_process_batches_before(int64_t size, int64_t batch_size, bool shuffle, uint64_t seed,
                                      bool drop_last, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(size));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (shuffle) order = random_permutation(size, seed, epoch);
  const int64_t batches = drop_last ? size / batch_size : (size + batch_size - 1) / batch_size;
  Batches out;
  for (int64_t b = 0; b < batches; ++b) {
    const int64_t first = b * batch_size, count = std::min(batch_size, size - first);
    out.emplace_back(order.begin() + first, order.begin() + first + count);
  }
  return out;
}

TEST(DistributedSampler, HandWorkedExamples) {
  // 10 items, 3 ranks x 2: global batches of 6. drop_last keeps one; without it the remainder of 4
  // goes to ranks 0 and 1 and rank 2's last batch is empty.
  EXPECT_EQ(all_ranks(10, 3, 2, false, 0, true, 0), (std::vector<Batches>{{{0, 1}}, {{2, 3}}, {{4, 5}}}));
  EXPECT_EQ(all_ranks(10, 3, 2, false, 0, false, 0),
            (std::vector<Batches>{{{0, 1}, {6, 7}}, {{2, 3}, {8, 9}}, {{4, 5}, {}}}));
  // A remainder that ends inside rank 1's slice.
  EXPECT_EQ(all_ranks(9, 2, 3, false, 0, false, 0),
            (std::vector<Batches>{{{0, 1, 2}, {6, 7, 8}}, {{3, 4, 5}, {}}}));
  EXPECT_EQ(all_ranks(8, 2, 3, false, 0, false, 0), (std::vector<Batches>{{{0, 1, 2}, {6, 7}}, {{3, 4, 5}, {}}}));
  // Fewer items than one global batch: one batch, the last ranks empty.
  EXPECT_EQ(all_ranks(5, 4, 2, false, 0, false, 0), (std::vector<Batches>{{{0, 1}}, {{2, 3}}, {{4}}, {{}}}));
  // Shuffled: the same slices of the epoch's permutation.
  const std::vector<int64_t> p = random_permutation(10, 42, 3);
  EXPECT_EQ(all_ranks(10, 3, 2, true, 42, false, 3),
            (std::vector<Batches>{{{p[0], p[1]}, {p[6], p[7]}}, {{p[2], p[3]}, {p[8], p[9]}}, {{p[4], p[5]}, {}}}));
}

TEST(DistributedSampler, PermutationValuesArePinned) {
  // Printed by the implementation every earlier run used (before the sampler took a batch size): a
  // change here would silently change the batches of every existing run.
  EXPECT_EQ(random_permutation(10, 0, 0), (std::vector<int64_t>{7, 1, 0, 3, 6, 8, 4, 9, 2, 5}));
  EXPECT_EQ(random_permutation(10, 1234, 7), (std::vector<int64_t>{9, 5, 2, 3, 4, 0, 6, 7, 1, 8}));
  EXPECT_EQ(random_permutation(1, 5, 5), (std::vector<int64_t>{0}));
  EXPECT_TRUE(random_permutation(0, 5, 5).empty());
}

TEST(DistributedSampler, WorldOneReadsTheSingleProcessBatchesAsBefore) {
  for (int64_t size : {1, 2, 7, 10, 23, 64, 101}) {
    for (int64_t batch_size : {1, 3, 4, 8, 101}) {
      for (bool drop_last : {false, true}) {
        if (drop_last && size < batch_size) continue;  // rejected (RejectsBadArguments)
        for (bool shuffle : {false, true}) {
          for (int64_t epoch : {0, 2}) {
            SCOPED_TRACE(::testing::Message() << "size " << size << " B " << batch_size << " drop_last "
                                              << drop_last << " shuffle " << shuffle << " epoch " << epoch);
            const DistributedSampler sampler(size, 0, 1, batch_size, shuffle, 11, drop_last);
            EXPECT_EQ(batches_of(sampler, epoch),
                      single_process_batches_before(size, batch_size, shuffle, 11, drop_last, epoch));
          }
        }
      }
    }
  }
}

TEST(DistributedSampler, RanksTogetherReadTheSingleProcessGlobalBatch) {
  for (int world : {2, 3, 4}) {
    for (int64_t batch_size : {1, 2, 5}) {
      for (int64_t size : {1, 7, 23, 37, 64}) {
        for (bool drop_last : {false, true}) {
          if (drop_last && size < world * batch_size) continue;  // rejected (RejectsBadArguments)
          for (bool shuffle : {false, true}) {
            SCOPED_TRACE(::testing::Message() << "world " << world << " B " << batch_size << " size " << size
                                              << " drop_last " << drop_last << " shuffle " << shuffle);
            const DistributedSampler single(size, 0, 1, world * batch_size, shuffle, 5, drop_last);
            for (int64_t epoch : {0, 3}) {
              const Batches expected = batches_of(single, epoch);
              const std::vector<Batches> ranks = all_ranks(size, world, batch_size, shuffle, 5, drop_last, epoch);
              for (int r = 0; r < world; ++r) {
                ASSERT_EQ(ranks[r].size(), expected.size()) << "rank " << r << "'s batches per epoch";
                EXPECT_EQ(DistributedSampler(size, r, world, batch_size, shuffle, 5, drop_last).batches_per_epoch(),
                          single.batches_per_epoch());
              }
              for (size_t b = 0; b < expected.size(); ++b) {
                std::vector<int64_t> joined;
                for (int r = 0; r < world; ++r) joined.insert(joined.end(), ranks[r][b].begin(), ranks[r][b].end());
                EXPECT_EQ(joined, expected[b]) << "global batch " << b << " of epoch " << epoch;
              }
            }
          }
        }
      }
    }
  }
}

TEST(DistributedSampler, WithoutDropLastEveryItemOnceAndEmptyLastBatches) {
  for (int64_t size : {1, 2, 7, 10, 23, 101}) {
    for (int world : {1, 2, 3, 4, 7}) {
      for (int64_t batch_size : {1, 3, 4}) {
        SCOPED_TRACE(::testing::Message() << "size " << size << " world " << world << " B " << batch_size);
        const int64_t global = world * batch_size;
        const int64_t batches = (size + global - 1) / global;
        const int64_t remainder = size - (batches - 1) * global;
        std::map<int64_t, int> seen;
        int64_t total = 0;
        for (int r = 0; r < world; ++r) {
          const DistributedSampler sampler(size, r, world, batch_size, true, 3, false);
          ASSERT_EQ(sampler.batches_per_epoch(), batches);
          const int64_t last = std::clamp<int64_t>(remainder - r * batch_size, 0, batch_size);
          EXPECT_EQ(sampler.batch_count(batches - 1), last) << "rank " << r;
          EXPECT_EQ(sampler.num_samples(), (batches - 1) * batch_size + last) << "rank " << r;
          for (int64_t i : sampler.indices(1)) {
            ASSERT_GE(i, 0);
            ASSERT_LT(i, size);
            ++seen[i];
          }
          total += sampler.num_samples();
        }
        EXPECT_EQ(total, size);
        EXPECT_EQ(static_cast<int64_t>(seen.size()), size);
        for (auto [index, times] : seen) EXPECT_EQ(times, 1) << "index " << index;
      }
    }
  }
  // The highest ranks' last batch is empty when the remainder ends early: 23 items over 4 x 4.
  for (int r = 0; r < 4; ++r) {
    const DistributedSampler sampler(23, r, 4, 4, false, 0, false);
    EXPECT_EQ(sampler.batches_per_epoch(), 2);
    EXPECT_EQ(sampler.batch_count(1), (std::vector<int64_t>{4, 3, 0, 0})[r]) << "rank " << r;
  }
}

TEST(DistributedSampler, WithDropLastDisjointFullBatches) {
  for (int64_t size : {7, 10, 23, 101}) {
    for (int world : {1, 2, 3, 4}) {
      for (int64_t batch_size : {1, 2, 3}) {
        if (size < world * batch_size) continue;  // rejected (RejectsBadArguments)
        SCOPED_TRACE(::testing::Message() << "size " << size << " world " << world << " B " << batch_size);
        std::map<int64_t, int> seen;
        for (int r = 0; r < world; ++r) {
          const DistributedSampler sampler(size, r, world, batch_size, true, 9, true);
          ASSERT_EQ(sampler.batches_per_epoch(), size / (world * batch_size));
          EXPECT_EQ(sampler.num_samples(), sampler.batches_per_epoch() * batch_size);
          for (int64_t b = 0; b < sampler.batches_per_epoch(); ++b) EXPECT_EQ(sampler.batch_count(b), batch_size);
          for (int64_t i : sampler.indices(4)) ++seen[i];
        }
        EXPECT_EQ(static_cast<int64_t>(seen.size()), size / (world * batch_size) * world * batch_size);
        for (auto [index, times] : seen) EXPECT_EQ(times, 1) << "index " << index;
      }
    }
  }
}

TEST(DistributedSampler, OrderDependsOnSeedAndEpochOnly) {
  const DistributedSampler a(1000, 1, 4, 16, true, 7, false), b(1000, 1, 4, 16, true, 7, false),
      c(1000, 1, 4, 16, true, 8, false);
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
  const DistributedSampler plain(1000, 1, 4, 16, false, 7, false);
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

TEST(DistributedSampler, RejectsBadArguments) {
  EXPECT_TRUE(throws_with([] { DistributedSampler(10, 3, 3, 2, true, 0, false); },
                          {"rank 3", "world size 3", "0 <= rank"}));
  EXPECT_TRUE(throws_with([] { DistributedSampler(10, -1, 3, 2, true, 0, false); }, {"rank -1", "0 <= rank"}));
  EXPECT_TRUE(throws_with([] { DistributedSampler(10, 0, 0, 2, true, 0, false); }, {"world size 0"}));
  EXPECT_TRUE(throws_with([] { DistributedSampler(10, 0, 2, 0, true, 0, false); }, {"batch_size is 0", "positive"}));
  EXPECT_TRUE(throws_with([] { DistributedSampler(10, 0, 2, -3, true, 0, true); }, {"batch_size is -3"}));
  EXPECT_TRUE(throws_with([] { DistributedSampler(0, 0, 1, 2, true, 0, false); }, {"empty"}));
  EXPECT_TRUE(throws_with([] { DistributedSampler(5, 0, 1, 2, true, 0, false).indices(-1); }, {"epoch -1"}));
  EXPECT_TRUE(throws_with([] { DistributedSampler(22, 1, 4, 8, true, 0, true); },
                          {"world size 4", "batch_size 8", "4 x 8 = 32", "has only 22", "drop_last = false"}));
  EXPECT_TRUE(throws_with([] { DistributedSampler(10, 0, 2, 3, true, 0, true).batch_count(1); },
                          {"batch 1", "1 batches"}));
  // Exactly one global batch is enough, and without drop_last any size is.
  EXPECT_EQ(DistributedSampler(32, 3, 4, 8, true, 0, true).batches_per_epoch(), 1);
  EXPECT_EQ(DistributedSampler(3, 3, 4, 8, true, 0, false).num_samples(), 0);
}

}  // namespace
