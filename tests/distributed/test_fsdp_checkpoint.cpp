// Sharded FSDP checkpoints (distributed/fsdp_checkpoint.h), run by mpirun at 4 ranks: a checkpoint
// saved at N = 4 after 3 AdamW steps must continue, at N = 4, 2 and 1, with the losses of the run
// that never stopped (bit for bit at the same N, within 1e-5 at another), a consolidated export must
// load into a single-process model, and damaged checkpoints (a truncated, altered, swapped or missing
// file, each caught by its size or its checksum in index.json) or mismatched models must give errors
// that name the problem, on every rank. Under hybrid sharding (2 shard groups of 2) one replica
// writes a checkpoint of 2 shards, which FULL_SHARD at 3 ranks resumes, and the other way round.
//
// N = 2 inside a 4-rank job: ranks {0, 1} and {2, 3} each form a 2-rank group (ProcessGroup::split).
// N = 1: every rank loads the checkpoint alone, through a LocalProcessGroup, and trains on the whole
// batch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include "autograd/ops.h"
#include "core/atomic_file.h"
#include "core/checksum.h"
#include "core/checksum_json.h"
#include "distributed/fsdp_checkpoint.h"
#include "models/vit.h"
#include "nn/safetensors.h"
#include "optim/optim.h"
#include "tests/distributed/model_testing.h"
#include "tests/distributed/mpi_main.h"
#include "tests/testing.h"

namespace octet {
namespace {

using octet::testing::slurp;
using octet::testing::spit;

namespace fs = std::filesystem;
using distributed::FsdpOptions;
using distributed::FullyShardedDataParallel;
using distributed::ProcessGroup;
using testing::Batch;
using testing::make_vit;
using testing::throws_with;
using testing::world;

// 12-wide, 3 blocks: flat parameters that 4 and 2 do not all divide, so padding moves on re-sharding.
const models::ViTConfig kTinyVit = testing::tiny_vit_config("tiny_fsdp", /*embed_dim=*/12, /*depth=*/3);

// The tests split the world into pairs and name shard files of 4 ranks: mpirun -np 4.
std::shared_ptr<ProcessGroup> world_group() {
  OCTET_CHECK(world().size() == 4, "test_fsdp_checkpoint runs at 4 ranks, not ", world().size(), "; mpirun -np 4");
  return testing::world_group();
}

constexpr int64_t kGlobalBatch = 8;
constexpr int kSaveAfter = 3, kContinueFor = 3;

// Step s's global batch of kGlobalBatch (or `global`): images from seed 3000 + s, labels (3i + s) mod 5.
const testing::SeededBatches kBatches{.image_seed = 3000, .label_stride = 3, .label_step = 1};

// Step `step`'s global batch; rank r of an n-rank group trains on its n-th of it.
Batch batch_of(const ProcessGroup& group, int step, int64_t global = kGlobalBatch) {
  return kBatches.global_batch(global, step).shard(group.rank(), global / group.size());
}

// AdamW steps [first, first + count); the mean loss over the group's ranks at each.
std::vector<double> train(FullyShardedDataParallel& fsdp, optim::Optimizer& optimizer, ProcessGroup& group,
                          int first, int count, int64_t global = kGlobalBatch) {
  std::vector<double> losses;
  for (int step = first; step < first + count; ++step) {
    const auto [images, labels] = batch_of(group, step, global);
    const Tensor loss = cross_entropy(fsdp(images), labels);
    loss.backward();
    optimizer.step();
    optimizer.zero_grad();
    const Tensor mean = loss.detach().clone();
    group.all_reduce(mean, distributed::ReduceOp::Avg)->wait();
    losses.push_back(mean.item());
  }
  return losses;
}

// lr 1e-3 as in test_fsdp.cpp: Adam turns last-bit gradient differences into ~lr·ε moves.
std::unique_ptr<optim::AdamW> adamw(FullyShardedDataParallel& fsdp, double lr = 1e-3) {
  return std::make_unique<optim::AdamW>(fsdp.parameters(), lr, 0.9, 0.999, 1e-8, 0.05);
}

// A directory every rank sees, named after rank 0's process; rank 0 removes it at exit.
const fs::path& shared_directory() {
  struct Directory {
    fs::path path;
    bool owner = false;  // rank 0; the group is gone when statics are destroyed
    ~Directory() {
      std::error_code ignored;
      if (owner) fs::remove_all(path, ignored);
    }
  };
  static const Directory dir = [] {
    const Tensor pid = from_vector<double>({static_cast<double>(::getpid())}, {1}, DType::f64);
    world().broadcast(pid, 0)->wait();
    Directory d{fs::temp_directory_path() / ("octet_fsdp_checkpoint_" + std::to_string(static_cast<int64_t>(pid.item()))),
                world().rank() == 0};
    if (world().rank() == 0) fs::create_directories(d.path);
    world().barrier()->wait();
    return d;
  }();
  return dir.path;
}

// The uninterrupted 4-rank run, made once: its checkpoint after kSaveAfter steps and the losses of
// the kContinueFor steps after it.
struct Reference {
  std::string checkpoint;
  std::vector<double> continued;
};

const Reference& reference() {
  static const Reference ref = [] {
    const int rank = world().rank();
    // Ranks other than 0 start elsewhere: wrapping broadcasts rank 0's weights.
    FullyShardedDataParallel fsdp(make_vit(kTinyVit, rank == 0 ? 9 : 50 + rank), world_group());
    auto optimizer = adamw(fsdp);
    train(fsdp, *optimizer, world(), 0, kSaveAfter);
    Reference r;
    r.checkpoint = (shared_directory() / "step-3").string();
    distributed::save_fsdp_checkpoint(r.checkpoint, fsdp, optimizer.get());
    r.continued = train(fsdp, *optimizer, world(), kSaveAfter, kContinueFor);
    return r;
  }();
  return ref;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& expected, double rtol) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_NEAR(got[k], expected[k], rtol * std::abs(expected[k])) << "step " << kSaveAfter + k;
  }
}

TEST(FsdpCheckpoint, ResumesBitForBitAtTheSameWorldSize) {
  const Reference& ref = reference();
  // Other weights and another lr: the load must replace both.
  FullyShardedDataParallel fsdp(make_vit(kTinyVit, 77), world_group());
  auto optimizer = adamw(fsdp, 5e-3);
  const auto info = distributed::load_fsdp_checkpoint(ref.checkpoint, fsdp, optimizer.get());
  EXPECT_EQ(info.saved_world_size, 4);
  EXPECT_EQ(optimizer->param_groups()[0].lr, 1e-3);
  EXPECT_EQ(optimizer->step_count(0, 0), kSaveAfter);
  EXPECT_EQ(train(fsdp, *optimizer, world(), kSaveAfter, kContinueFor), ref.continued);
}

TEST(FsdpCheckpoint, ResumesAtTwoRanks) {
  const Reference& ref = reference();
  const auto pair = world().split(world().rank() / 2, world().rank());
  ASSERT_EQ(pair->size(), 2);
  FullyShardedDataParallel fsdp(make_vit(kTinyVit, 77), pair);
  auto optimizer = adamw(fsdp, 5e-3);
  distributed::load_fsdp_checkpoint(ref.checkpoint, fsdp, optimizer.get());
  expect_close(train(fsdp, *optimizer, *pair, kSaveAfter, kContinueFor), ref.continued, 1e-5);
}

TEST(FsdpCheckpoint, ResumesAtOneRank) {
  const Reference& ref = reference();
  auto alone = std::make_shared<distributed::LocalProcessGroup>();
  FullyShardedDataParallel fsdp(make_vit(kTinyVit, 77), alone);
  auto optimizer = adamw(fsdp, 5e-3);
  distributed::load_fsdp_checkpoint(ref.checkpoint, fsdp, optimizer.get());
  expect_close(train(fsdp, *optimizer, *alone, kSaveAfter, kContinueFor), ref.continued, 1e-5);
}

TEST(FsdpCheckpoint, ConsolidatedExportLoadsIntoOneProcessModel) {
  const Reference& ref = reference();
  FullyShardedDataParallel fsdp(make_vit(kTinyVit, 77), world_group());
  distributed::load_fsdp_checkpoint(ref.checkpoint, fsdp, nullptr);
  const std::string path = (shared_directory() / "export" / "model.safetensors").string();
  distributed::export_consolidated(path, fsdp);
  const auto gathered = fsdp.full_parameters();

  models::VisionTransformer single(kTinyVit, /*initialize=*/false);
  single.load_state_dict(nn::load_safetensors(path).tensors, /*strict=*/true);
  const auto loaded = single.named_parameters();
  ASSERT_EQ(loaded.size(), gathered.size());
  for (size_t k = 0; k < loaded.size(); ++k) {
    EXPECT_EQ(loaded[k].first, gathered[k].first);
    EXPECT_EQ(loaded[k].second.to_vector<float>(), gathered[k].second.to_vector<float>()) << loaded[k].first;
  }
  // The single-process model computes the loss the sharded run computed at that step.
  const auto [images, labels] = batch_of(distributed::LocalProcessGroup(), kSaveAfter);
  EXPECT_NEAR(cross_entropy(single(images), labels).item(), ref.continued[0], 1e-5 * ref.continued[0]);
}

TEST(FsdpCheckpoint, SavingAgainReplacesTheCheckpointAndLeavesNoTemporaries) {
  const fs::path dir = shared_directory() / "resaved";
  FullyShardedDataParallel fsdp(make_vit(kTinyVit, 5), world_group());
  auto optimizer = adamw(fsdp);
  distributed::save_fsdp_checkpoint(dir.string(), fsdp, nullptr);  // weights only, step 0
  train(fsdp, *optimizer, world(), 0, 1);
  distributed::save_fsdp_checkpoint(dir.string() + "/", fsdp, optimizer.get(),
                                    [](const std::string& staging, FileDigests& digests) {
                                      const std::string trainer = "{\"step\": 1}\n";
                                      write_file_atomic(staging + "/trainer.json", trainer);
                                      digests["trainer.json"] = digest_of(trainer);
                                    });
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(shared_directory())) names.push_back(entry.path().filename().string());
  for (const std::string& name : names) {
    EXPECT_EQ(name.find(".tmp-"), std::string::npos) << name;
    EXPECT_EQ(name.find(".old-"), std::string::npos) << name;
  }
  EXPECT_TRUE(fs::exists(dir / "trainer.json"));
  EXPECT_TRUE(fs::exists(dir / "shard-3-of-4.safetensors"));
  FullyShardedDataParallel loaded(make_vit(kTinyVit, 6), world_group());
  auto loaded_optimizer = adamw(loaded);
  distributed::load_fsdp_checkpoint(dir.string(), loaded, loaded_optimizer.get());
  EXPECT_EQ(loaded_optimizer->step_count(0, 0), 1) << "the second save replaced the first";
  EXPECT_EQ(loaded.parameters()[0].to_vector<float>(), fsdp.parameters()[0].to_vector<float>());
}

// NO_SHARD keeps a full replica per rank, saved once as a world of one: it loads a sharded
// checkpoint, and its own checkpoint loads into a sharded model.
TEST(FsdpCheckpoint, NoShardLoadsShardedCheckpointsAndWritesOnesThatShardedModelsLoad) {
  const Reference& ref = reference();
  FsdpOptions no_shard;
  no_shard.sharding = distributed::ShardingStrategy::NoShard;
  FullyShardedDataParallel replicated(make_vit(kTinyVit, 77), world_group(), no_shard);
  auto optimizer = adamw(replicated, 5e-3);
  distributed::load_fsdp_checkpoint(ref.checkpoint, replicated, optimizer.get());
  expect_close(train(replicated, *optimizer, world(), kSaveAfter, kContinueFor), ref.continued, 1e-5);

  const std::string dir = (shared_directory() / "no_shard_saved").string();
  distributed::save_fsdp_checkpoint(dir, replicated, optimizer.get());
  EXPECT_TRUE(fs::exists(fs::path(dir) / "shard-0-of-1.safetensors"));
  FullyShardedDataParallel sharded(make_vit(kTinyVit, 78), world_group());
  auto sharded_optimizer = adamw(sharded);
  const auto info = distributed::load_fsdp_checkpoint(dir, sharded, sharded_optimizer.get());
  EXPECT_EQ(info.saved_world_size, 1);
  EXPECT_EQ(sharded_optimizer->step_count(0, 2), kSaveAfter + kContinueFor);
  const auto expected = replicated.full_parameters(), got = sharded.full_parameters();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_EQ(got[k].second.to_vector<float>(), expected[k].second.to_vector<float>()) << got[k].first;
  }
}

std::shared_ptr<models::VisionTransformer> freeze_first_block(std::shared_ptr<models::VisionTransformer> model) {
  for (const auto& [name, p] : model->named_parameters()) {
    if (name.rfind("blocks.0.", 0) == 0) Tensor(p).requires_grad_(false);
  }
  return model;
}

// Frozen parameters (a LoRA base) have flat parameters of their own, with no optimizer state: they
// are saved and re-sharded like the others, and a model that freezes differently is refused.
TEST(FsdpCheckpoint, FrozenFlatParametersAreSavedAndReshardedWithoutOptimizerState) {
  FullyShardedDataParallel fsdp(freeze_first_block(make_vit(kTinyVit, 11)), world_group());
  auto optimizer = adamw(fsdp);
  train(fsdp, *optimizer, world(), 0, 1);
  const std::string dir = (shared_directory() / "frozen").string();
  distributed::save_fsdp_checkpoint(dir, fsdp, optimizer.get());
  const auto expected = fsdp.full_parameters();

  auto alone = std::make_shared<distributed::LocalProcessGroup>();
  FullyShardedDataParallel single(freeze_first_block(make_vit(kTinyVit, 12)), alone);
  auto single_optimizer = adamw(single);
  distributed::load_fsdp_checkpoint(dir, single, single_optimizer.get());
  EXPECT_EQ(single_optimizer->step_count(0, 0), 1);
  const auto got = single.full_parameters();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_EQ(got[k].second.to_vector<float>(), expected[k].second.to_vector<float>()) << got[k].first;
  }
  FullyShardedDataParallel unfrozen(make_vit(kTinyVit, 12), alone);
  EXPECT_TRUE(throws_with([&] { distributed::load_fsdp_checkpoint(dir, unfrozen, nullptr); },
                          {"unit 'blocks.0'", "frozen", "is trainable"}));
}

// A copy of the reference checkpoint that rank 0 damages with `damage`; every rank sees it after.
fs::path damaged_copy(const std::string& name, const std::function<void(const fs::path&)>& damage) {
  const fs::path dir = shared_directory() / name;
  if (world().rank() == 0) {
    fs::copy(reference().checkpoint, dir, fs::copy_options::recursive);
    damage(dir);
  }
  world().barrier()->wait();
  return dir;
}

TEST(FsdpCheckpoint, ATruncatedShardIsAClearErrorOnEveryRankAndChangesNothing) {
  const fs::path dir = damaged_copy("truncated", [](const fs::path& d) {
    const fs::path shard = d / "shard-2-of-4.safetensors";
    fs::resize_file(shard, fs::file_size(shard) / 2);
  });
  FullyShardedDataParallel fsdp(make_vit(kTinyVit, 77), world_group());
  auto optimizer = adamw(fsdp);
  const auto before = fsdp.parameters()[1].to_vector<float>();
  // At N = 4 only rank 2 reads that file; every rank reports its error.
  EXPECT_TRUE(throws_with([&] { distributed::load_fsdp_checkpoint(dir.string(), fsdp, optimizer.get()); },
                          {"shard-2-of-4.safetensors", "damaged", "load another checkpoint"}));
  EXPECT_EQ(fsdp.parameters()[1].to_vector<float>(), before) << "a failed load changed the weights";
  EXPECT_EQ(optimizer->step_count(0, 1), 0);
  // At N = 1 every rank reads every file.
  auto alone = std::make_shared<distributed::LocalProcessGroup>();
  FullyShardedDataParallel single(make_vit(kTinyVit, 77), alone);
  EXPECT_TRUE(throws_with([&] { distributed::load_fsdp_checkpoint(dir.string(), single, nullptr); },
                          {"shard-2-of-4.safetensors", "truncated"}));
}

TEST(FsdpCheckpoint, AMissingShardOrIndexIsAClearError) {
  const fs::path no_shard = damaged_copy("no_shard", [](const fs::path& d) { fs::remove(d / "shard-1-of-4.safetensors"); });
  const fs::path no_index = damaged_copy("no_index", [](const fs::path& d) { fs::remove(d / "index.json"); });
  FullyShardedDataParallel fsdp(make_vit(kTinyVit, 77), world_group());
  auto optimizer = adamw(fsdp);
  EXPECT_TRUE(throws_with([&] { distributed::load_fsdp_checkpoint(no_shard.string(), fsdp, optimizer.get()); },
                          {"shard-1-of-4.safetensors", "is missing"}));
  EXPECT_TRUE(throws_with([&] { distributed::load_fsdp_checkpoint(no_index.string(), fsdp, optimizer.get()); },
                          {"index.json", "no FSDP checkpoint"}));
}

TEST(FsdpCheckpoint, AModelWithOtherFlatParametersIsAClearError) {
  const Reference& ref = reference();
  // Decayed and undecayed parameters in separate flats: more flat parameters than were saved.
  FsdpOptions split_keys;
  split_keys.flat_param_key = [](const std::string&, const Tensor& p) { return p.dim() <= 1 ? 1 : 0; };
  FullyShardedDataParallel split(make_vit(kTinyVit, 77), world_group(), split_keys);
  EXPECT_TRUE(throws_with([&] { distributed::load_fsdp_checkpoint(ref.checkpoint, split, nullptr); },
                          {"flat parameters but this model has", "flat_param_key"}));
  // Same flats and names, other widths: the first differing parameter is named.
  const models::ViTConfig wider_vit = testing::tiny_vit_config("tiny_fsdp", /*embed_dim=*/16, /*depth=*/3);
  FullyShardedDataParallel wider(make_vit(wider_vit, 77), world_group());
  EXPECT_TRUE(throws_with([&] { distributed::load_fsdp_checkpoint(ref.checkpoint, wider, nullptr); },
                          {"in flat parameter 0", "has shape", "same configuration"}));
  // Another optimizer.
  FullyShardedDataParallel fsdp(make_vit(kTinyVit, 77), world_group());
  optim::SGD sgd(fsdp.parameters(), 0.1, 0.9);
  EXPECT_TRUE(throws_with([&] { distributed::load_fsdp_checkpoint(ref.checkpoint, fsdp, &sgd); },
                          {"AdamW", "SGD"}));
}

// index.json records the size and CRC-32 of every other file, as they are on disk.
TEST(FsdpCheckpoint, IndexJsonRecordsTheChecksumOfEveryOtherFile) {
  const fs::path dir = reference().checkpoint;
  const nlohmann::json index = nlohmann::json::parse(slurp(dir / "index.json"));
  EXPECT_EQ(index["format_version"], 2);
  FileDigests on_disk;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name != "index.json") on_disk[name] = digest_of(slurp(entry.path()));
  }
  EXPECT_EQ(on_disk.size(), 5u) << "four shards and the optimizer's groups";
  EXPECT_EQ(digests_from_json(index["checksums"], "index.json"), on_disk);
}

// A flipped bit inside a shard's data still parses; its checksum catches it, before anything changes.
TEST(FsdpCheckpoint, AFlippedBitInAShardIsAClearErrorOnEveryRankAndChangesNothing) {
  const fs::path dir = damaged_copy("flipped", [](const fs::path& d) {
    const fs::path shard = d / "shard-2-of-4.safetensors";
    std::string bytes = slurp(shard);
    uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, bytes.data(), 8);
    bytes[8 + header_bytes + (bytes.size() - 8 - header_bytes) / 2] ^= 0x04;
    spit(shard, bytes);
  });
  FullyShardedDataParallel fsdp(make_vit(kTinyVit, 77), world_group());
  auto optimizer = adamw(fsdp);
  const auto before = fsdp.parameters()[1].to_vector<float>();
  EXPECT_TRUE(throws_with([&] { distributed::load_fsdp_checkpoint(dir.string(), fsdp, optimizer.get()); },
                          {(dir / "shard-2-of-4.safetensors").string() + " is corrupt",
                           (dir / "index.json").string() + " recorded", "CRC-32", "load an older checkpoint"}));
  EXPECT_EQ(fsdp.parameters()[1].to_vector<float>(), before) << "a failed load changed the weights";
  EXPECT_EQ(optimizer->step_count(0, 1), 0);
}

// Two ranks' shard files exchanged: each holds the bytes recorded for the other.
TEST(FsdpCheckpoint, SwappedShardFilesAreAClearError) {
  const fs::path dir = damaged_copy("swapped", [](const fs::path& d) {
    fs::rename(d / "shard-0-of-4.safetensors", d / "shard-0.tmp");
    fs::rename(d / "shard-1-of-4.safetensors", d / "shard-0-of-4.safetensors");
    fs::rename(d / "shard-0.tmp", d / "shard-1-of-4.safetensors");
  });
  FullyShardedDataParallel fsdp(make_vit(kTinyVit, 77), world_group());
  auto optimizer = adamw(fsdp);
  // Ranks 0 and 1 each find the other's shard; the rest report rank 0's error.
  const std::string mine = world().rank() == 1 ? "shard-1-of-4.safetensors" : "shard-0-of-4.safetensors";
  const std::string theirs = world().rank() == 1 ? "shard-0-of-4.safetensors" : "shard-1-of-4.safetensors";
  EXPECT_TRUE(throws_with([&] { distributed::load_fsdp_checkpoint(dir.string(), fsdp, optimizer.get()); },
                          {mine + " is corrupt", "recorded for " + theirs, "swapped"}));
  // At N = 1 one rank reads both, and stops at the first.
  auto alone = std::make_shared<distributed::LocalProcessGroup>();
  FullyShardedDataParallel single(make_vit(kTinyVit, 77), alone);
  EXPECT_TRUE(throws_with([&] { distributed::load_fsdp_checkpoint(dir.string(), single, nullptr); },
                          {"shard-0-of-4.safetensors is corrupt", "swapped"}));
}

// An index of format version 1 recorded no checksums: the checkpoint loads as it is, unchecked, and
// resumes bit for bit; a version 2 index without them is damaged.
TEST(FsdpCheckpoint, ACheckpointWithoutChecksumsLoadsUnchecked) {
  const fs::path no_checksums = damaged_copy("no_checksums", [](const fs::path& d) {
    nlohmann::json index = nlohmann::json::parse(slurp(d / "index.json"));
    index.erase("checksums");
    spit(d / "index.json", index.dump(2));
  });
  const fs::path old = damaged_copy("version_1", [](const fs::path& d) {
    nlohmann::json index = nlohmann::json::parse(slurp(d / "index.json"));
    index.erase("checksums");
    index["format_version"] = 1;
    spit(d / "index.json", index.dump(2));
  });
  FullyShardedDataParallel fsdp(make_vit(kTinyVit, 77), world_group());
  auto optimizer = adamw(fsdp, 5e-3);
  EXPECT_TRUE(throws_with([&] { distributed::load_fsdp_checkpoint(no_checksums.string(), fsdp, optimizer.get()); },
                          {"index.json", "has no \"checksums\""}));
  distributed::load_fsdp_checkpoint(old.string(), fsdp, optimizer.get());
  EXPECT_EQ(train(fsdp, *optimizer, world(), kSaveAfter, kContinueFor), reference().continued);
}

// ---- hybrid sharding ---------------------------------------------------------------------------------
// Shard groups {0, 1} and {2, 3}, replicas across them. Global batches of 12: 3 images on each of 4
// ranks, 4 on each of 3.

FsdpOptions hybrid_2x2() {
  return FsdpOptions{.sharding = distributed::ShardingStrategy::HybridShard, .shard_group_size = 2};
}

// A FULL_SHARD checkpoint of 4 shards loads into the 2 × 2 hybrid layout and continues as the
// uninterrupted 4-rank run.
TEST(FsdpCheckpoint, HybridLoadsAFullShardCheckpoint) {
  const Reference& ref = reference();
  FullyShardedDataParallel fsdp(make_vit(kTinyVit, 77), world_group(), hybrid_2x2());
  auto optimizer = adamw(fsdp, 5e-3);
  const auto info = distributed::load_fsdp_checkpoint(ref.checkpoint, fsdp, optimizer.get());
  EXPECT_EQ(info.saved_world_size, 4);
  expect_close(train(fsdp, *optimizer, world(), kSaveAfter, kContinueFor), ref.continued, 1e-5);
}

// Saved under 2 × 2 hybrid sharding: one copy of each of the 2 shards, from the first shard group,
// with their checksums in index.json. FULL_SHARD at 3 ranks resumes it as the hybrid run continues;
// its own checkpoint, of 3 shards, resumes under hybrid sharding as it continues in turn.
TEST(FsdpCheckpoint, HybridAndFullShardAtAnotherWorldSizeResumeEachOther) {
  const int rank = world().rank();
  const fs::path hybrid_dir = shared_directory() / "hybrid", full3_dir = shared_directory() / "full3";
  FullyShardedDataParallel hybrid(make_vit(kTinyVit, rank == 0 ? 9 : 50 + rank), world_group(), hybrid_2x2());
  auto hybrid_optimizer = adamw(hybrid);
  train(hybrid, *hybrid_optimizer, world(), 0, kSaveAfter, 12);
  distributed::save_fsdp_checkpoint(hybrid_dir.string(), hybrid, hybrid_optimizer.get());
  const std::vector<double> hybrid_continued = train(hybrid, *hybrid_optimizer, world(), kSaveAfter, kContinueFor, 12);

  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(hybrid_dir)) files.push_back(entry.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"index.json", "optimizer_groups.safetensors", "shard-0-of-2.safetensors",
                                             "shard-1-of-2.safetensors"}));
  const nlohmann::json index = nlohmann::json::parse(slurp(hybrid_dir / "index.json"));
  EXPECT_EQ(index["world_size"], 2);
  FileDigests on_disk;
  for (const std::string& name : files) {
    if (name != "index.json") on_disk[name] = digest_of(slurp(hybrid_dir / name));
  }
  EXPECT_EQ(digests_from_json(index["checksums"], "index.json"), on_disk);

  // Ranks 0-2 as a world of 3; rank 3 sits out until the hybrid run below.
  const auto trio = world().split(rank < 3 ? 0 : ProcessGroup::kNoColor, rank);
  std::vector<double> full3_continued;
  if (trio) {
    FullyShardedDataParallel full3(make_vit(kTinyVit, 78), trio);
    auto optimizer = adamw(full3, 5e-3);
    EXPECT_EQ(distributed::load_fsdp_checkpoint(hybrid_dir.string(), full3, optimizer.get()).saved_world_size, 2);
    expect_close(train(full3, *optimizer, *trio, kSaveAfter, kContinueFor, 12), hybrid_continued, 1e-5);
    distributed::save_fsdp_checkpoint(full3_dir.string(), full3, optimizer.get());
    full3_continued = train(full3, *optimizer, *trio, kSaveAfter + kContinueFor, kContinueFor, 12);
  }
  world().barrier()->wait();
  EXPECT_TRUE(fs::exists(full3_dir / "shard-2-of-3.safetensors"));
  FullyShardedDataParallel back(make_vit(kTinyVit, 79), world_group(), hybrid_2x2());
  auto optimizer = adamw(back, 5e-3);
  EXPECT_EQ(distributed::load_fsdp_checkpoint(full3_dir.string(), back, optimizer.get()).saved_world_size, 3);
  EXPECT_EQ(optimizer->step_count(0, 0), kSaveAfter + kContinueFor);
  const std::vector<double> resumed = train(back, *optimizer, world(), kSaveAfter + kContinueFor, kContinueFor, 12);
  if (trio) {
    for (size_t k = 0; k < resumed.size(); ++k) EXPECT_NEAR(resumed[k], full3_continued[k], 1e-5 * full3_continued[k]);
  }
}

}  // namespace
}  // namespace octet
