// DataLoader: batch contents are the dataset's items in the sampler's order, ranks together read
// the single-process global batch bit for bit, epochs follow one another, state()/set_state() resume
// bit for bit, evaluation reads a short (or, on high ranks, empty) last batch, worker errors reach
// the caller, and destruction never waits on the queue.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "data/loader.h"
#include "data/synthetic.h"
#include "tests/testing.h"

namespace {

using namespace octet;
using namespace octet::data;
using octet::testing::throws_with;
using Clock = std::chrono::steady_clock;

std::shared_ptr<const Dataset> small_dataset(int64_t size = 22) { return make_synthetic(size, {2, 3, 3}, 5, 11); }

// Checks that `batch` holds, in order, the dataset items at `indices`, bit for bit.
void expect_batch_holds(const Batch& batch, const Dataset& ds, const std::vector<int64_t>& indices) {
  const int64_t count = static_cast<int64_t>(indices.size());
  Shape shape{count};
  for (int64_t d : ds.image_shape()) shape.push_back(d);
  ASSERT_EQ(batch.images.shape(), shape);
  ASSERT_EQ(batch.images.dtype(), DType::f32);
  ASSERT_EQ(batch.labels.shape(), (Shape{count}));
  ASSERT_EQ(batch.labels.dtype(), DType::i64);
  const int64_t n = ds.image_shape().numel();
  std::vector<float> expected(n);
  for (int64_t k = 0; k < count; ++k) {
    int64_t label;
    ds.get(indices[k], expected.data(), &label);
    EXPECT_EQ(batch.labels.data<int64_t>()[k], label) << "item " << k;
    EXPECT_EQ(std::memcmp(batch.images.data<float>() + k * n, expected.data(), n * sizeof(float)), 0)
        << "item " << k << " is not dataset index " << indices[k];
  }
}

void expect_same_batch(const Batch& a, const Batch& b) {
  EXPECT_EQ(a.epoch, b.epoch);
  EXPECT_EQ(a.index, b.index);
  ASSERT_EQ(a.images.shape(), b.images.shape());
  if (a.images.nbytes() > 0) {
    EXPECT_EQ(std::memcmp(a.images.data<float>(), b.images.data<float>(), a.images.nbytes()), 0);
  }
  EXPECT_EQ(a.labels.to_vector<int64_t>(), b.labels.to_vector<int64_t>());
}

TEST(DataLoader, BatchesFollowTheSamplerAcrossEpochsOnEveryRank) {
  auto ds = small_dataset();
  for (int world : {1, 3}) {
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE(::testing::Message() << "rank " << rank << " of " << world);
      LoaderOptions options{.batch_size = 3,
                            .shuffle = true,
                            .drop_last = true,
                            .seed = 5,
                            .rank = rank,
                            .world_size = world,
                            .prefetch = 2};
      DataLoader loader(ds, options);
      const DistributedSampler sampler(22, rank, world, 3, true, 5, true);
      ASSERT_EQ(loader.batches_per_epoch(), world == 1 ? 7 : 2);  // floor(22 / (world x 3))
      for (int64_t epoch = 0; epoch < 3; ++epoch) {
        const std::vector<int64_t> order = sampler.indices(epoch);
        for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
          EXPECT_EQ(loader.state().epoch, epoch);
          EXPECT_EQ(loader.state().batch, b);
          const Batch batch = loader.next();
          EXPECT_EQ(batch.epoch, epoch);
          EXPECT_EQ(batch.index, b);
          expect_batch_holds(batch, *ds, std::vector<int64_t>(order.begin() + 3 * b, order.begin() + 3 * b + 3));
        }
      }
    }
  }
}

// Ranks' batch b, concatenated in rank order, against batch b of one process reading world x B.
void expect_ranks_join_into(const std::vector<Batch>& parts, const Batch& whole) {
  int64_t at = 0;
  const int64_t image_numel = whole.images.numel() / std::max<int64_t>(whole.labels.numel(), 1);
  for (size_t r = 0; r < parts.size(); ++r) {
    const Batch& part = parts[r];
    EXPECT_EQ(part.epoch, whole.epoch);
    EXPECT_EQ(part.index, whole.index);
    const int64_t count = part.labels.numel();
    ASSERT_EQ(part.images.shape()[0], count);
    ASSERT_LE(at + count, whole.labels.numel()) << "rank " << r;
    for (int64_t k = 0; k < count; ++k)
      EXPECT_EQ(part.labels.data<int64_t>()[k], whole.labels.data<int64_t>()[at + k]) << "rank " << r << " item " << k;
    if (count > 0) {
      EXPECT_EQ(std::memcmp(part.images.data<float>(), whole.images.data<float>() + at * image_numel,
                            count * image_numel * sizeof(float)),
                0)
          << "rank " << r << "'s images";
    }
    at += count;
  }
  EXPECT_EQ(at, whole.labels.numel()) << "the ranks' batches together are shorter than the global batch";
}

TEST(DataLoader, RanksTogetherReadTheSingleProcessBatches) {
  for (int world : {2, 3, 4}) {
    for (int64_t batch_size : {1, 3, 4}) {
      for (int64_t size : {23, 37}) {
        for (bool drop_last : {true, false}) {
          SCOPED_TRACE(::testing::Message() << "world " << world << " B " << batch_size << " size " << size
                                            << " drop_last " << drop_last);
          auto ds = small_dataset(size);
          DataLoader single(ds, {.batch_size = world * batch_size, .shuffle = true, .drop_last = drop_last,
                                 .seed = 21, .prefetch = 0});
          std::vector<std::unique_ptr<DataLoader>> ranks;
          for (int r = 0; r < world; ++r) {
            // Odd ranks assemble in next(), even ones on the prefetch thread: the batches are the same.
            ranks.push_back(std::make_unique<DataLoader>(
                ds, LoaderOptions{.batch_size = batch_size, .shuffle = true, .drop_last = drop_last, .seed = 21,
                                  .rank = r, .world_size = world, .prefetch = r % 2 == 0 ? 2 : 0}));
            ASSERT_EQ(ranks.back()->batches_per_epoch(), single.batches_per_epoch()) << "rank " << r;
          }
          // Two epochs and a bit: the second is a new permutation.
          for (int64_t step = 0; step < 2 * single.batches_per_epoch() + 1; ++step) {
            std::vector<Batch> parts;
            for (auto& rank : ranks) parts.push_back(rank->next());
            expect_ranks_join_into(parts, single.next());
          }
        }
      }
    }
  }
}

TEST(DataLoader, StateCarriesOverBetweenRankLayoutsWithTheSameGlobalBatch) {
  auto ds = small_dataset(37);
  DataLoader single(ds, {.batch_size = 6, .shuffle = true, .drop_last = true, .seed = 4, .prefetch = 0});
  ASSERT_EQ(single.batches_per_epoch(), 6);
  for (int i = 0; i < 8; ++i) single.next();
  const DataLoader::State saved = single.state();  // epoch 1, batch 2
  for (int world : {2, 3}) {
    SCOPED_TRACE(::testing::Message() << "resumed by " << world << " x " << 6 / world);
    std::vector<std::unique_ptr<DataLoader>> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.push_back(std::make_unique<DataLoader>(
          ds, LoaderOptions{.batch_size = 6 / world, .shuffle = true, .drop_last = true, .seed = 4, .rank = r,
                            .world_size = world}));
      ranks.back()->set_state(saved);
    }
    DataLoader reference(ds, single.options());
    reference.set_state(saved);
    for (int step = 0; step < 5; ++step) {
      std::vector<Batch> parts;
      for (auto& rank : ranks) parts.push_back(rank->next());
      expect_ranks_join_into(parts, reference.next());
    }
  }
}

TEST(DataLoader, EvaluationAcrossRanksReadsEveryItemOnceWithEmptyLastBatches) {
  // 10 items over 4 ranks x 2: global batches of 8, then 2 items that all go to rank 0.
  auto ds = small_dataset(10);
  const std::vector<std::vector<std::vector<int64_t>>> expected{
      {{0, 1}, {8, 9}}, {{2, 3}, {}}, {{4, 5}, {}}, {{6, 7}, {}}};
  for (int prefetch : {0, 2}) {
    for (int r = 0; r < 4; ++r) {
      SCOPED_TRACE(::testing::Message() << "rank " << r << " prefetch " << prefetch);
      DataLoader loader(ds, {.batch_size = 2, .shuffle = false, .drop_last = false, .rank = r, .world_size = 4,
                             .prefetch = prefetch});
      ASSERT_EQ(loader.batches_per_epoch(), 2);
      for (int64_t b = 0; b < 2; ++b) {
        const Batch batch = loader.next();
        EXPECT_EQ(batch.index, b);
        expect_batch_holds(batch, *ds, expected[r][b]);  // checks the [0, 2, 3, 3] and [0] shapes too
      }
      const Batch again = loader.next();  // the next epoch starts over
      EXPECT_EQ(again.epoch, 1);
      expect_batch_holds(again, *ds, expected[r][0]);
    }
  }
}

TEST(DataLoader, EpochsComeInDifferentOrders) {
  DataLoader loader(small_dataset(), {.batch_size = 22, .shuffle = true, .drop_last = true, .seed = 1});
  ASSERT_EQ(loader.batches_per_epoch(), 1);
  const Batch first = loader.next(), second = loader.next();
  EXPECT_EQ(second.epoch, 1);
  EXPECT_EQ(second.index, 0);
  EXPECT_NE(first.labels.to_vector<int64_t>(), second.labels.to_vector<int64_t>());
}

TEST(DataLoader, SetStateResumesBitForBit) {
  struct Case {
    int64_t size;
    int rank, world;
    int64_t batches_per_epoch;
  };
  // One process: 22 items, five full batches of 4 and one of 2. Rank 2 of 3: 17 items in global
  // batches of 12, so its last batch is empty (ranks 0 and 1 take the remaining 5).
  for (const Case c : {Case{22, 0, 1, 6}, Case{17, 2, 3, 2}}) {
    SCOPED_TRACE(::testing::Message() << "rank " << c.rank << " of " << c.world);
    auto ds = small_dataset(c.size);
    const LoaderOptions options{.batch_size = 4, .shuffle = true, .drop_last = false, .seed = 9, .rank = c.rank,
                                .world_size = c.world, .prefetch = 3};
    DataLoader original(ds, options);
    ASSERT_EQ(original.batches_per_epoch(), c.batches_per_epoch);
    for (int i = 0; i < 7; ++i) original.next();
    const DataLoader::State saved = original.state();
    EXPECT_EQ(saved.epoch, 7 / c.batches_per_epoch);
    EXPECT_EQ(saved.batch, 7 % c.batches_per_epoch);
    std::vector<Batch> expected;
    for (int i = 0; i < 13; ++i) expected.push_back(original.next());

    // A fresh loader (as after a restart), a synchronous one, one with several assembly threads, and
    // the original rewound with a full queue.
    DataLoader fresh(ds, options);
    fresh.set_state(saved);
    LoaderOptions sync_options = options, threaded_options = options;
    sync_options.prefetch = 0;
    threaded_options.threads = 3;
    DataLoader sync(ds, sync_options), threaded(ds, threaded_options);
    sync.set_state(saved);
    threaded.set_state(saved);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the original's queue fill
    original.set_state(saved);
    for (DataLoader* loader : {&fresh, &sync, &threaded, &original}) {
      EXPECT_EQ(loader->state().epoch, saved.epoch);
      EXPECT_EQ(loader->state().batch, saved.batch);
      for (const Batch& want : expected) expect_same_batch(loader->next(), want);
    }
  }
}

TEST(DataLoader, EvaluationReadsEveryItemOnceWithAShortLastBatch) {
  auto ds = small_dataset(10);
  DataLoader loader(ds, {.batch_size = 4, .shuffle = false, .drop_last = false});
  ASSERT_EQ(loader.batches_per_epoch(), 3);
  expect_batch_holds(loader.next(), *ds, {0, 1, 2, 3});
  expect_batch_holds(loader.next(), *ds, {4, 5, 6, 7});
  const Batch last = loader.next();
  EXPECT_EQ(last.index, 2);
  expect_batch_holds(last, *ds, {8, 9});
  const Batch again = loader.next();
  EXPECT_EQ(again.epoch, 1);
  expect_batch_holds(again, *ds, {0, 1, 2, 3});
}

// Fails on one index, and sleeps 20 ms in get() from another on, to exercise the worker's error
// and stop paths; counts the items it has been asked for.
class TroubledDataset : public Dataset {
 public:
  TroubledDataset(int64_t bad_index, int64_t slow_from) : bad_index_(bad_index), slow_from_(slow_from) {}
  int64_t size() const override { return 200; }
  Shape image_shape() const override { return {1, 2, 2}; }
  int64_t num_classes() const override { return 2; }
  void get(int64_t index, float* image, int64_t* label) const override {
    reads_.fetch_add(1);
    if (index >= slow_from_) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    OCTET_CHECK(index != bad_index_, "TroubledDataset: cannot read item ", index);
    for (int k = 0; k < 4; ++k) image[k] = static_cast<float>(index);
    *label = index % 2;
  }
  int64_t reads() const { return reads_.load(); }

 private:
  int64_t bad_index_, slow_from_;
  mutable std::atomic<int64_t> reads_{0};
};

TEST(DataLoader, WorkerErrorsReachTheCallerInOrder) {
  for (int threads : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << threads << " assembly threads");
    DataLoader loader(std::make_shared<TroubledDataset>(13, 1000),
                      {.batch_size = 4, .shuffle = false, .prefetch = 2, .threads = threads});
    for (int b = 0; b < 3; ++b) EXPECT_EQ(loader.next().labels.numel(), 4);  // items 0..11 are fine
    EXPECT_TRUE(throws_with([&] { loader.next(); }, {"cannot read item 13"}));
    EXPECT_TRUE(throws_with([&] { loader.next(); }, {"cannot read item 13"}));  // and it stays failed
    loader.set_state({0, 1});                                                   // a restart elsewhere works again
    EXPECT_EQ(loader.next().images.data<float>()[0], 4.0f);
  }
}

// What is measured is what the worker does, not how long it takes: destruction must not drain a
// full queue or finish the batch under way, whatever the machine's speed.
TEST(DataLoader, DestructionDoesNotWaitForTheQueue) {
  {  // a full prefetch queue: the worker, blocked on it, must see the stop (a deadlock here hangs,
     // and the 10 s bound, for what takes microseconds, only turns a hang into a failure)
    auto loader = std::make_unique<DataLoader>(small_dataset(), LoaderOptions{.batch_size = 2, .prefetch = 4});
    loader->next();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto start = Clock::now();
    loader.reset();
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  }
  {  // in the middle of a slow batch: items 32..63 take 20 ms each. The worker may finish the item
     // it is reading and one it had begun as the stop came, never the other 30 of the batch.
    const auto dataset = std::make_shared<TroubledDataset>(-1, 32);
    auto loader =
        std::make_unique<DataLoader>(dataset, LoaderOptions{.batch_size = 32, .shuffle = false, .prefetch = 2});
    loader->next();  // the fast first batch; the worker is now inside the slow second one
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (dataset->reads() <= 32 && Clock::now() < deadline) std::this_thread::yield();
    ASSERT_GT(dataset->reads(), 32) << "the worker never started the second batch";
    const int64_t before = dataset->reads();
    loader.reset();
    EXPECT_LE(dataset->reads() - before, 2) << "items read while the loader was being destroyed";
    EXPECT_LT(dataset->reads(), 64) << "the slow batch was read to its end";
  }
  {  // never started
    DataLoader loader(small_dataset(), {.batch_size = 2});
  }
}

TEST(DataLoader, RejectsBadOptionsAndStates) {
  auto ds = small_dataset();
  EXPECT_TRUE(throws_with([&] { DataLoader(ds, {.batch_size = 0}); }, {"batch_size is 0"}));
  EXPECT_TRUE(throws_with([&] { DataLoader(nullptr, {}); }, {"dataset is null"}));
  EXPECT_TRUE(throws_with([&] { DataLoader(ds, {.batch_size = 4, .prefetch = -1}); }, {"prefetch is -1"}));
  EXPECT_TRUE(throws_with([&] { DataLoader(ds, {.batch_size = 4, .threads = 0}); }, {"threads is 0"}));
  EXPECT_TRUE(throws_with([&] { DataLoader(ds, {.batch_size = 8, .drop_last = true, .world_size = 4}); },
                          {"world_size 4 x batch_size 8 = 32", "has only 22", "drop_last = false"}));
  EXPECT_TRUE(throws_with([&] { DataLoader(ds, {.batch_size = 4, .rank = 4, .world_size = 4}); },
                          {"rank 4", "world size 4"}));
  EXPECT_TRUE(throws_with([&] { DataLoader(ds, {.batch_size = -1}); }, {"batch_size is -1"}));
  // The same options without drop_last are fine: one short batch per rank (empty on rank 3).
  EXPECT_EQ(DataLoader(ds, {.batch_size = 8, .drop_last = false, .rank = 3, .world_size = 4}).next().labels.numel(),
            0);
  DataLoader loader(ds, {.batch_size = 4});
  EXPECT_TRUE(throws_with([&] { loader.set_state({0, 5}); }, {"set_state", "0 <= batch < 5"}));
  EXPECT_TRUE(throws_with([&] { loader.set_state({-1, 0}); }, {"set_state", "epoch >= 0"}));
}

}  // namespace
