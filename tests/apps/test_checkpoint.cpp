// Training checkpoints: a round trip restores weights, optimizer state and trainer state bit for
// bit; every damaged or mismatched file is an error that names it, and every file but trainer.json
// is checked against the checksum trainer.json records for it.
#include <gtest/gtest.h>

#include <spdlog/sinks/ostream_sink.h>

#include <filesystem>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "apps/checkpoint.h"
#include "autograd/ops.h"
#include "core/checksum.h"
#include "core/checksum_json.h"
#include "core/log.h"
#include "distributed/fsdp.h"
#include "distributed/process_group.h"
#include "models/vit.h"
#include "nn/fp8.h"
#include "nn/layers.h"
#include "nn/safetensors.h"
#include "optim/optim.h"
#include "tests/log_capture.h"
#include "tests/testing.h"

namespace octet {
namespace {

using octet::testing::slurp;
using octet::testing::spit;

using octet::testing::CapturedLog;
using octet::testing::occurrences;
namespace fs = std::filesystem;
using testing::throws_with;

// embed_dim 16: the blocks' Linears (16 -> 48, 16 -> 16, 16 -> 32, 32 -> 16) suit FP8.
models::ViTConfig tiny_config(int64_t depth = 2, int64_t embed_dim = 8) {
  return {.name = "tiny_test", .img_size = 8, .patch_size = 4, .in_chans = 1, .num_classes = 3, .embed_dim = embed_dim,
          .depth = depth, .num_heads = 2, .mlp_ratio = 2.0, .qkv_bias = true, .drop_rate = 0.0, .attn_drop_rate = 0.0,
          .drop_path_rate = 0.1};
}

// A model and optimizer that have taken `steps` AdamW steps on random data; with `fp8`, each
// forward ran under Fp8Autocast with that recipe (so the blocks' Linears carry FP8 state).
struct TrainedRun {
  models::VisionTransformer model;
  optim::AdamW optimizer;
  explicit TrainedRun(uint64_t seed, int steps, int64_t depth = 2, std::optional<nn::Fp8Recipe> fp8 = std::nullopt)
      : model(tiny_config(depth, fp8 ? 16 : 8), true, &generator(seed)),
        optimizer(optim::weight_decay_groups(model.named_parameters(), 1e-2, 0.05), 1e-2) {
    Generator data(seed + 100);
    for (int s = 0; s < steps; ++s) {
      const Tensor images = randn({4, 1, 8, 8}, data);
      const Tensor labels = from_vector<int64_t>({0, 1, 2, 1}, {4});
      Tensor loss;
      {
        nn::Fp8Autocast scope(fp8.has_value(), fp8.value_or(nn::Fp8Recipe()));
        loss = nn::CrossEntropyLoss(0.1)(model(images), labels);
      }
      loss.backward();
      optimizer.step();
      optimizer.zero_grad();
    }
  }
  static Generator& generator(uint64_t seed) {
    static thread_local Generator g;
    g.manual_seed(seed);
    return g;
  }
};

void expect_bitwise_equal(const nn::StateDict& a, const nn::StateDict& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    const Tensor& u = b.at(name);
    ASSERT_EQ(t.shape(), u.shape()) << name;
    ASSERT_EQ(t.dtype(), u.dtype()) << name;
    EXPECT_EQ(0, std::memcmp(t.data_ptr(), u.data_ptr(), t.nbytes())) << name;
  }
}

// Flips one bit in the middle of a safetensors file's data buffer, past its header: inside a tensor's
// data, where the file still parses.
void flip_bit_in_data(const fs::path& file) {
  std::string bytes = slurp(file);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data(), 8);
  const size_t data_start = 8 + header_bytes;
  ASSERT_LT(data_start, bytes.size()) << file;
  bytes[data_start + (bytes.size() - data_start) / 2] ^= 0x10;
  spit(file, bytes);
}

nlohmann::json read_json(const fs::path& file) { return nlohmann::json::parse(slurp(file)); }
void write_json(const fs::path& file, const nlohmann::json& j) { spit(file, j.dump(2)); }

// Records `name`'s current bytes in trainer.json, as if the save had written them.
void record_checksum(const fs::path& dir, const std::string& name) {
  nlohmann::json trainer = read_json(dir / "trainer.json");
  trainer["checksums"][name] = digests_to_json({{name, digest_of(slurp(dir / name))}})[name];
  write_json(dir / "trainer.json", trainer);
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root = fs::temp_directory_path() / ("octet_ckpt_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root);
  }
  void TearDown() override { fs::remove_all(root); }
  apps::TrainerState state() const {
    return {.step = 7, .loader = {.epoch = 2, .batch = 5}, .rng_seed = 11, .rng_offset = 12345,
            .run = {{"model", "tiny_test"}, {"lr", "0.01"}}};
  }
  fs::path root;
};

TEST_F(CheckpointTest, RoundTripRestoresEverythingBitForBit) {
  TrainedRun saved(1, 3);
  const std::string dir = apps::save_checkpoint(root.string(), saved.model, saved.optimizer, state());
  EXPECT_EQ(fs::path(dir).filename(), "step-00000007");

  TrainedRun fresh(2, 1);  // other weights, other optimizer state
  const apps::TrainerState loaded = apps::load_checkpoint(root.string(), fresh.model, fresh.optimizer);
  EXPECT_EQ(loaded.step, 7);
  EXPECT_EQ(loaded.loader.epoch, 2);
  EXPECT_EQ(loaded.loader.batch, 5);
  EXPECT_EQ(loaded.rng_seed, 11u);
  EXPECT_EQ(loaded.rng_offset, 12345u);
  EXPECT_EQ(loaded.run, state().run);
  expect_bitwise_equal(saved.model.state_dict(), fresh.model.state_dict());
  expect_bitwise_equal(saved.optimizer.state_dict(), fresh.optimizer.state_dict());
  EXPECT_FALSE(fs::exists(fs::path(dir) / "fp8.safetensors")) << "no Linear ran in FP8: nothing to save";
}

nn::Fp8Recipe short_history_recipe() { return nn::DelayedScaling{.margin = 1, .amax_history_len = 4}; }

TEST_F(CheckpointTest, Fp8ScalesAndAmaxHistoriesRoundTripBitForBit) {
  TrainedRun saved(1, 3, 2, short_history_recipe());
  const std::map<std::string, Tensor> fp8_saved = nn::fp8_state_dict(saved.model);
  // 2 blocks x 4 Linears (the head stays out of FP8) x {forward, backward} x 4 tensors.
  ASSERT_EQ(fp8_saved.size(), 2u * 4u * 2u * 4u);
  ASSERT_TRUE(fp8_saved.count("blocks.1.mlp.fc2.fp8.forward.amax_history"));
  ASSERT_FALSE(fp8_saved.count("head.fp8.forward.scale"));
  const std::string dir = apps::save_checkpoint(root.string(), saved.model, saved.optimizer, state());
  ASSERT_TRUE(fs::exists(fs::path(dir) / "fp8.safetensors"));

  // Other weights, same architecture, no FP8 state yet (it has not run): loading creates it.
  TrainedRun fresh(2, 0, 2, short_history_recipe());
  EXPECT_TRUE(nn::fp8_state_dict(fresh.model).empty());
  apps::load_checkpoint(root.string(), fresh.model, fresh.optimizer);
  expect_bitwise_equal(fp8_saved, nn::fp8_state_dict(fresh.model));
  expect_bitwise_equal(saved.model.state_dict(), fresh.model.state_dict());
}

TEST_F(CheckpointTest, ADamagedOrMismatchedFp8FileIsAnErrorThatNamesIt) {
  TrainedRun run(1, 2, 2, short_history_recipe());
  const fs::path dir = apps::save_checkpoint(root.string(), run.model, run.optimizer, state());
  auto load = [&] { apps::load_checkpoint(dir.string(), run.model, run.optimizer); };
  load();

  fs::resize_file(dir / "fp8.safetensors", fs::file_size(dir / "fp8.safetensors") - 8);
  EXPECT_TRUE(throws_with(load, {"fp8.safetensors"}));

  // The FP8 state of a deeper model: a block this model lacks. Its checksum is not the recorded one;
  // once it is, the load finds that it does not fit.
  TrainedRun deeper(1, 1, /*depth=*/3, short_history_recipe());
  nn::save_safetensors((dir / "fp8.safetensors").string(), nn::fp8_state_dict(deeper.model));
  EXPECT_TRUE(throws_with(load, {"fp8.safetensors is corrupt"}));
  record_checksum(dir, "fp8.safetensors");
  EXPECT_TRUE(throws_with(load, {"fp8.safetensors", "does not fit this model's FP8 layers", "blocks.2"}));
}

// trainer.json records the size and CRC-32 of every other file the save wrote, as they are on disk.
TEST_F(CheckpointTest, TrainerJsonRecordsTheChecksumOfEveryOtherFile) {
  TrainedRun run(1, 2, 2, short_history_recipe());
  const fs::path dir = apps::save_checkpoint(root.string(), run.model, run.optimizer, state());
  const nlohmann::json trainer = read_json(dir / "trainer.json");
  EXPECT_EQ(trainer["format_version"], 2);
  const FileDigests recorded = digests_from_json(trainer["checksums"], "trainer.json");
  FileDigests on_disk;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name != "trainer.json") on_disk[name] = digest_of(slurp(entry.path()));
  }
  EXPECT_EQ(on_disk.size(), 3u) << "model, optimizer and fp8 state";
  EXPECT_EQ(recorded, on_disk);
}

// A flipped bit inside a tensor's data parses as a valid file; only its checksum tells. Each file is
// checked before anything is loaded into the model, and the error names it and the way out.
TEST_F(CheckpointTest, AFlippedBitInATensorsDataIsAnErrorNamingTheFile) {
  TrainedRun saved(1, 2, 2, short_history_recipe());
  const fs::path dir = apps::save_checkpoint(root.string(), saved.model, saved.optimizer, state());
  for (const std::string name : {"model.safetensors", "optimizer.safetensors", "fp8.safetensors"}) {
    SCOPED_TRACE(name);
    const std::string intact = slurp(dir / name);
    flip_bit_in_data(dir / name);
    ASSERT_NE(slurp(dir / name), intact);
    TrainedRun fresh(2, 1, 2, short_history_recipe());
    const nn::StateDict before = fresh.model.state_dict();
    EXPECT_TRUE(throws_with([&] { apps::load_checkpoint(root.string(), fresh.model, fresh.optimizer); },
                            {(dir / name).string() + " is corrupt", (dir / "trainer.json").string() + " recorded",
                             "CRC-32", "resume from an older checkpoint in " + root.string()}));
    expect_bitwise_equal(before, fresh.model.state_dict());  // nothing was loaded
    spit(dir / name, intact);
    apps::load_checkpoint(root.string(), fresh.model, fresh.optimizer);
    expect_bitwise_equal(saved.model.state_dict(), fresh.model.state_dict());
  }
}

// A file trainer.json records must be there, except the FP8 state, without which a run goes on with
// fresh scales (tests/e2e/resume_fp8.sh relies on that) and a warning. A file trainer.json does not
// record is not part of the checkpoint and is never read.
TEST_F(CheckpointTest, AMissingFileIsAnErrorAndAnUnrecordedOneIsNotRead) {
  TrainedRun fp8_run(1, 1, 2, short_history_recipe());
  const fs::path dir = apps::save_checkpoint(root.string(), fp8_run.model, fp8_run.optimizer, state());
  const std::string fp8_state = slurp(dir / "fp8.safetensors");
  fs::remove(dir / "fp8.safetensors");
  {
    const CapturedLog log;
    TrainedRun fresh(2, 0, 2, short_history_recipe());
    apps::load_checkpoint(dir.string(), fresh.model, fresh.optimizer);
    EXPECT_TRUE(nn::fp8_state_dict(fresh.model).empty());
    EXPECT_NE(log.text().find("fp8.safetensors is missing"), std::string::npos) << log.text();
  }
  fs::remove(dir / "optimizer.safetensors");
  EXPECT_TRUE(throws_with([&] { apps::load_checkpoint(dir.string(), fp8_run.model, fp8_run.optimizer); },
                          {"optimizer.safetensors is missing", "trainer.json records it", "resume from an older"}));
  // A checkpoint without FP8 state that gains an fp8.safetensors (of a wider model, which would not fit).
  TrainedRun plain(1, 1);
  apps::TrainerState s = state();
  s.step = 8;
  const fs::path plain_dir = apps::save_checkpoint(root.string(), plain.model, plain.optimizer, s);
  ASSERT_FALSE(fs::exists(plain_dir / "fp8.safetensors"));
  spit(plain_dir / "fp8.safetensors", fp8_state);
  apps::load_checkpoint(plain_dir.string(), plain.model, plain.optimizer);
  EXPECT_TRUE(nn::fp8_state_dict(plain.model).empty());
}

// A checkpoint of format version 1 recorded no checksums: it loads as it is, unchecked, and says so
// once. A version 2 trainer.json that lost its checksums is damaged, not old.
TEST_F(CheckpointTest, ACheckpointWithoutChecksumsLoadsUncheckedWithOneWarning) {
  TrainedRun saved(1, 2);
  const fs::path dir = apps::save_checkpoint(root.string(), saved.model, saved.optimizer, state());
  nlohmann::json trainer = read_json(dir / "trainer.json");
  trainer.erase("checksums");
  write_json(dir / "trainer.json", trainer);
  EXPECT_TRUE(throws_with([&] { apps::load_checkpoint(dir.string(), saved.model, saved.optimizer); },
                          {"trainer.json has no \"/checksums\""}));

  trainer["format_version"] = 1;
  write_json(dir / "trainer.json", trainer);
  flip_bit_in_data(dir / "model.safetensors");  // goes unnoticed: nothing to check it against
  const CapturedLog log;
  TrainedRun fresh(2, 1);
  EXPECT_EQ(apps::load_checkpoint(root.string(), fresh.model, fresh.optimizer).step, 7);
  apps::load_checkpoint(root.string(), fresh.model, fresh.optimizer);
  expect_bitwise_equal(saved.optimizer.state_dict(), fresh.optimizer.state_dict());
  EXPECT_EQ(occurrences(log.text(), "records no checksums"), 1u) << log.text();
  EXPECT_NE(log.text().find(dir.string()), std::string::npos) << log.text();
}

TEST_F(CheckpointTest, LatestPointsAtTheNewestAndRewritingAStepLeavesNoTemporaries) {
  TrainedRun run(1, 1);
  apps::TrainerState s = state();
  apps::save_checkpoint(root.string(), run.model, run.optimizer, s);
  s.step = 9;
  apps::save_checkpoint(root.string(), run.model, run.optimizer, s);
  apps::save_checkpoint(root.string(), run.model, run.optimizer, s);  // same step again
  EXPECT_EQ(apps::resolve_checkpoint(root.string()), (root / "step-00000009").string());
  EXPECT_EQ(apps::resolve_checkpoint((root / "step-00000007").string()), (root / "step-00000007").string());
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(root)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000007", "step-00000009"}));
}

TEST_F(CheckpointTest, DamagedFilesAreErrorsThatNameThem) {
  TrainedRun run(1, 2);
  const fs::path dir = apps::save_checkpoint(root.string(), run.model, run.optimizer, state());
  auto rewrite = [](const fs::path& file, const std::string& bytes) { std::ofstream(file, std::ios::trunc) << bytes; };
  auto load = [&] { apps::load_checkpoint(dir.string(), run.model, run.optimizer); };

  const std::string json = [&] { std::ifstream in(dir / "trainer.json"); return std::string(std::istreambuf_iterator<char>(in), {}); }();
  rewrite(dir / "trainer.json", json.substr(0, json.size() / 2));
  EXPECT_TRUE(throws_with(load, {"trainer.json is not valid JSON"}));
  rewrite(dir / "trainer.json", R"({"format_version": 1, "step": 3, "rng": {"seed": 1, "offset": 2}, "run": {}})");
  EXPECT_TRUE(throws_with(load, {"has no \"/loader/epoch\""}));
  rewrite(dir / "trainer.json", R"({"format_version": 1, "step": "x", "loader": {"epoch": 0, "batch": 0},
                                    "rng": {"seed": 1, "offset": 2}, "run": {}})");
  EXPECT_TRUE(throws_with(load, {"\"/step\" is \"x\""}));
  rewrite(dir / "trainer.json", json);
  load();  // restored: loads again

  const auto size = fs::file_size(dir / "model.safetensors");
  fs::resize_file(dir / "model.safetensors", size - 100);
  EXPECT_TRUE(throws_with(load, {"model.safetensors"}));
  apps::save_checkpoint(root.string(), run.model, run.optimizer, state());  // whole again
  load();
  fs::remove(dir / "optimizer.safetensors");
  EXPECT_TRUE(throws_with(load, {"optimizer.safetensors"}));
}

// Under FSDP, index.json records the checksums of trainer.json and fp8.safetensors with the shards';
// each is checked as the load reads it.
TEST_F(CheckpointTest, ShardedCheckpointsCheckTrainerJsonAgainstIndexJson) {
  Generator gen(1);
  auto model = std::make_shared<models::VisionTransformer>(tiny_config(), true, &gen);
  distributed::FullyShardedDataParallel fsdp(model, std::make_shared<distributed::LocalProcessGroup>());
  optim::AdamW optimizer(fsdp.parameters(), 1e-2);
  const fs::path dir = apps::save_sharded_checkpoint(root.string(), fsdp, optimizer, *model, state());
  const FileDigests recorded = digests_from_json(read_json(dir / "index.json")["checksums"], "index.json");
  ASSERT_TRUE(recorded.count("trainer.json"));
  EXPECT_EQ(recorded.at("trainer.json"), digest_of(slurp(dir / "trainer.json")));
  EXPECT_EQ(apps::load_sharded_checkpoint(root.string(), fsdp, optimizer, *model).step, 7);

  // Still valid JSON, another step: only the checksum tells.
  const std::string intact = slurp(dir / "trainer.json");
  const size_t at = intact.find("\"step\": 7");
  ASSERT_NE(at, std::string::npos) << intact;
  std::string altered = intact;
  altered[at + 8] = '8';
  spit(dir / "trainer.json", altered);
  EXPECT_TRUE(throws_with([&] { apps::load_sharded_checkpoint(root.string(), fsdp, optimizer, *model); },
                          {(dir / "trainer.json").string() + " is corrupt", "index.json recorded",
                           "load an older checkpoint"}));
}

TEST_F(CheckpointTest, ACheckpointOfAnotherModelNamesTheMismatch) {
  TrainedRun run(1, 1);
  apps::save_checkpoint(root.string(), run.model, run.optimizer, state());
  TrainedRun deeper(1, 1, /*depth=*/3);
  EXPECT_TRUE(throws_with([&] { apps::load_checkpoint(root.string(), deeper.model, deeper.optimizer); },
                          {"was the checkpoint written with another --model?"}));
}

TEST_F(CheckpointTest, BadResumePathsSayWhatToPass) {
  EXPECT_TRUE(throws_with([&] { apps::resolve_checkpoint((root / "nope").string()); }, {"the path does not exist"}));
  fs::create_directories(root);
  EXPECT_TRUE(throws_with([&] { apps::resolve_checkpoint(root.string()); }, {"neither trainer.json nor a `latest`"}));
  std::ofstream(root / "latest") << "step-00000042\n";
  EXPECT_TRUE(throws_with([&] { apps::resolve_checkpoint(root.string()); },
                          {"step-00000042, which does not exist", "the step-* folders beside it"}));
  fs::create_directories(root / "step-00000042");
  EXPECT_TRUE(throws_with([&] { apps::resolve_checkpoint(root.string()); }, {"holds no trainer.json"}));
  EXPECT_TRUE(throws_with([&] { apps::resolve_checkpoint((root / "latest").string()); },
                          {"is a file", "pass the checkpoint folder that holds it"}));
}

}  // namespace
}  // namespace octet
