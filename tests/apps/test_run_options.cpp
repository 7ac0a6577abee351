// train_vit's flags (apps/run_options.h, apps/flag_checks.h): a bad value, a flag that would do
// nothing, an output path the run could not write and a checkpoint trained with other shapes are each
// refused before the run trains, naming the flag, the value and the fix.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "apps/flag_checks.h"
#include "apps/run_options.h"
#include "tests/apps/parse_flags.h"
#include "tests/testing.h"

namespace octet {
namespace {
namespace fs = std::filesystem;
using testing::throws_with;

RunOptions parse(const std::vector<std::string>& args) {
  return testing::parse_flags(args, RunOptions{}, [](CLI::App& app, RunOptions& o) { add_run_flags(app, o); });
}

// The message of the CLI::ValidationError parsing `args` raises ("" if none).
std::string parse_error(const std::vector<std::string>& args) {
  try {
    parse(args);
  } catch (const CLI::ValidationError& e) {
    return e.what();
  }
  return "";
}

// Parsed and checked as train_vit does.
RunOptions checked(const std::vector<std::string>& args) {
  RunOptions o = parse(args);
  check_run_options(o);
  return o;
}

// A fresh folder under the test's temporary directory.
fs::path scratch(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("octet_run_options_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(RunOptions, NumbersOutOfRangeNameTheValueAndWhatToPass) {
  EXPECT_EQ(parse_error({"--steps", "0"}), "--steps: 0 is less than 1; pass a whole number of at least 1");
  EXPECT_EQ(parse_error({"--grad-accum", "1.5"}),
            "--grad-accum: '1.5' is not a whole number; pass a whole number of at least 1");
  EXPECT_EQ(parse_error({"--threads", "-1"}), "--threads: -1 is less than 0; pass a whole number of at least 0");
  EXPECT_EQ(parse_error({"--lr", "abc"}), "--lr: 'abc' is not a number; pass a number greater than 0");
  EXPECT_EQ(parse_error({"--lr", "0"}), "--lr: 0 is not greater than 0; pass a number greater than 0");
  EXPECT_EQ(parse_error({"--lr", "nan"}), "--lr: nan is not a finite number; pass a number greater than 0");
  EXPECT_EQ(parse_error({"--weight-decay", "-inf"}),
            "--weight-decay: -inf is not a finite number; pass a number of at least 0");
  EXPECT_EQ(parse_error({"--momentum", "2"}), "--momentum: 2 is outside 0 to 1; pass a number from 0 to 1");
  EXPECT_EQ(parse_error({"--batch-size", "99999999999999999999"}),
            "--batch-size: 99999999999999999999 is too large; pass a whole number of at least 1");
  // An int option's limit, where CLI11 alone would say only "Could not convert".
  EXPECT_EQ(parse_error({"--threads", "3000000000"}),
            "--threads: 3000000000 is too large; pass a whole number of at least 0 and at most 2147483647");
  // What passes still parses to its value: in decimal (CLI11 alone reads "010" as octal 8), a sign
  // allowed.
  EXPECT_EQ(parse({"--batch-size", "010"}).batch_size, 10);
  EXPECT_EQ(parse({"--steps", "+5"}).steps, 5);
  const RunOptions o = parse({"--steps", "3", "--lr", "1e-3", "--momentum", "1", "--weight-decay", "0"});
  EXPECT_EQ(o.steps, 3);
  EXPECT_DOUBLE_EQ(o.lr, 1e-3);
  EXPECT_DOUBLE_EQ(o.momentum, 1.0);
}

// What train_vit prints for a command line CLI11 cannot parse (explain_parse_error).
std::string parse_failure(const std::vector<std::string>& args) {
  CLI::App app;
  RunOptions o;
  add_run_flags(app, o);
  std::vector<const char*> argv{"train_vit"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return explain_parse_error(&app, e);
  }
  return "";
}

TEST(RunOptions, UnknownRepeatedAndStrayArgumentsAreNamed) {
  EXPECT_EQ(parse_failure({"--batchsize", "8"}),
            "--batchsize: no such flag; did you mean --batch-size?\n"
            "'8' is a value no flag takes (the flag before it takes none, or is misspelled)\n"
            "Run with --help for the flags and their values.\n");
  EXPECT_EQ(parse_failure({"--stesp", "3"}).substr(0, 46), "--stesp: no such flag; did you mean --steps?\n'");
  EXPECT_EQ(parse_failure({"--zzzz"}), "--zzzz: no such flag\nRun with --help for the flags and their values.\n");
  EXPECT_EQ(parse_failure({"--batch-size", "8", "--batch-size", "16"}),
            "--batch-size is given 2 times; pass it once\nRun with --help for the flags and their values.\n");
  EXPECT_NE(parse_failure({"--steps", "0"}).find("--steps: 0 is less than 1"), std::string::npos);
  // A lone dash, a second "--" and a negative number left over are stray values, not flags.
  for (const std::string stray : {"-", "-5"}) {
    EXPECT_EQ(parse_failure({"--steps", "3", stray}),
              "'" + stray + "' is a value no flag takes (the flag before it takes none, or is misspelled)\n"
              "Run with --help for the flags and their values.\n");
  }
}

TEST(RunOptions, AFlagThatWouldDoNothingIsRefused) {
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases = {
      {{"--sharding", "grad-op"}, {"--sharding", "--parallel fsdp", "--parallel is none"}},
      {{"--fsdp-prefetch", "post", "--parallel", "ddp"}, {"--fsdp-prefetch", "--parallel is ddp"}},
      {{"--bucket-cap-mb", "5", "--parallel", "fsdp"}, {"--bucket-cap-mb", "pass --parallel ddp"}},
      {{"--reduce-dtype", "bf16"}, {"--reduce-dtype", "--parallel ddp or fsdp"}},
      {{"--dist-backend", "mpi"}, {"--dist-backend", "--parallel ddp or fsdp"}},
      {{"--lora-alpha", "8"}, {"--lora-alpha", "--lora-rank is 0"}},
      {{"--momentum", "0.5"}, {"--momentum", "--optimizer is adamw", "pass --optimizer sgd"}},
      {{"--data-dir", "/nowhere", "--dataset", "synthetic"}, {"--data-dir", "--dataset is synthetic"}},
      {{"--synthetic-size", "10"}, {"--synthetic-size", "--dataset is fashion-mnist"}},
      {{"--min-lr", "0.01", "--lr", "0.001"}, {"--min-lr 0.01", "--lr 0.001", "pass --min-lr 0.001 or less"}},
      {{"--trace-steps", "5"}, {"--trace-steps", "no --trace file", "pass --trace FILE"}},
      {{"--device", "cpu", "--parallel", "ddp", "--dist-backend", "nccl"},
       {"--dist-backend nccl", "--dist-backend mpi"}},
  };
  for (const auto& [args, words] : cases) {
    SCOPED_TRACE(args.front());
    bool threw = false;
    try {
      checked(args);
    } catch (const Error& e) {
      threw = true;
      for (const std::string& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
    EXPECT_TRUE(threw);
  }
  // The same flags where they apply pass.
  checked({"--sharding", "grad-op", "--fsdp-prefetch", "post", "--parallel", "fsdp", "--reduce-dtype", "bf16",
           "--dist-backend", "mpi", "--device", "cpu"});
  checked({"--bucket-cap-mb", "5", "--parallel", "ddp", "--device", "cpu"});
  checked({"--lora-rank", "4", "--lora-alpha", "8", "--optimizer", "sgd", "--momentum", "0.5", "--device", "cpu",
           "--dataset", "synthetic", "--synthetic-size", "10", "--lr", "1e-06", "--min-lr", "0"});
  // --min-lr's default above a --lr given alone is lowered to it, not refused (the user asked nothing
  // of --min-lr).
  checked({"--lr", "1e-06", "--device", "cpu"});
}

// SGD's weight decay is L2 on the gradient (torch.optim.SGD's), which momentum 0.9 amplifies tenfold:
// without --weight-decay it is 1e-4, not AdamW's decoupled 0.05; given, it is what was given.
TEST(RunOptions, WeightDecayDefaultsToEachOptimizersOwn) {
  EXPECT_EQ(checked({}).weight_decay, 0.05);
  EXPECT_EQ(checked({"--optimizer", "sgd"}).weight_decay, 1e-4);
  EXPECT_EQ(checked({"--optimizer", "sgd", "--weight-decay", "0.05"}).weight_decay, 0.05);
  EXPECT_EQ(checked({"--optimizer", "adamw", "--weight-decay", "0"}).weight_decay, 0.0);
}

TEST(RunOptions, MoreThreadsThanCoresAreRefused) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (cores == 0) GTEST_SKIP() << "the standard library does not know this machine's cores";
  EXPECT_TRUE(throws_with([&] { checked({"--device", "cpu", "--threads", std::to_string(cores + 1)}); },
                          {"--threads " + std::to_string(cores + 1), "pass at most " + std::to_string(cores)}));
  EXPECT_EQ(checked({"--device", "cpu", "--threads", std::to_string(cores)}).threads, cores);
}

TEST(RunOptions, OutputPathsAreCheckedBeforeTheRun) {
  const fs::path dir = scratch("outputs");
  const std::string missing = (dir / "nowhere" / "m.safetensors").string();
  EXPECT_TRUE(throws_with([&] { checked({"--device", "cpu", "--save-model", missing}); },
                          {"--save-model", "nowhere", "does not exist", "create it first"}));
  EXPECT_TRUE(throws_with([&] { checked({"--device", "cpu", "--lora-rank", "2", "--lora-save", missing}); },
                          {"--lora-save", "does not exist"}));
  EXPECT_TRUE(throws_with([&] { checked({"--device", "cpu", "--trace", missing}); }, {"--trace", "does not exist"}));
  EXPECT_TRUE(throws_with([&] { checked({"--device", "cpu", "--metrics", dir.string()}); },
                          {"--metrics", "is a folder", "path of a file"}));
  const fs::path file = dir / "a_file";
  std::ofstream(file) << "x";
  EXPECT_TRUE(throws_with([&] { checked({"--device", "cpu", "--checkpoint-dir", file.string()}); },
                          {"--checkpoint-dir", "a file of that name is in the way"}));
  EXPECT_TRUE(throws_with([&] { checked({"--device", "cpu", "--save-model", (file / "m.safetensors").string()}); },
                          {"--save-model", "is a file, not a folder"}));
  // What can be written passes, and a checkpoint folder is made at once.
  const fs::path ckpt = dir / "deeper" / "ckpt";
  checked({"--device", "cpu", "--checkpoint-dir", ckpt.string(), "--save-model", (dir / "m.safetensors").string(),
           "--metrics", (dir / "m.jsonl").string(), "--trace", (dir / "t.json").string()});
  EXPECT_TRUE(fs::is_directory(ckpt));
}

TEST(RunOptions, ResumingWithOtherShapesOrDtypesNamesTheFlag) {
  const std::map<std::string, std::string> saved = {
      {"model", "vit_fashion_mnist"}, {"precision", "bf16"}, {"lora_rank", "0"}, {"batch_size", "8"}};
  auto now = [&](const std::string& key, const std::string& value) {
    std::map<std::string, std::string> m = saved;
    m[key] = value;
    return m;
  };
  EXPECT_TRUE(throws_with([&] { check_resume_flags("ck", saved, now("model", "vit_tiny_patch16_224")); },
                          {"--resume ck", "--model vit_fashion_mnist", "pass --model vit_fashion_mnist"}));
  EXPECT_TRUE(throws_with([&] { check_resume_flags("ck", saved, now("lora_rank", "4")); },
                          {"--lora-rank 0", "this run has --lora-rank 4", "pass --lora-rank 0"}));
  EXPECT_TRUE(throws_with([&] { check_resume_flags("ck", saved, now("precision", "fp32")); },
                          {"--precision bf16", "this run has --precision fp32", "pass --precision bf16"}));
  // bf16 and fp8 share their weights; the rest may change (with a warning when the run starts).
  check_resume_flags("ck", saved, now("precision", "fp8"));
  check_resume_flags("ck", saved, now("batch_size", "16"));
  check_resume_flags("ck", {}, now("model", "vit_tiny_patch16_224"));  // a checkpoint recording no flags
  // FSDP's shards are f32 whatever the precision: its checkpoints resume in any.
  std::map<std::string, std::string> sharded = saved;
  sharded["parallel"] = "fsdp";
  std::map<std::string, std::string> sharded_fp32 = sharded;
  sharded_fp32["precision"] = "fp32";
  check_resume_flags("ck", sharded, sharded_fp32);
}

TEST(RunOptions, AMicroBatchLargerThanTheTrainingSetNamesTheFlags) {
  RunOptions o = checked({"--device", "cpu", "--dataset", "synthetic", "--synthetic-size", "4", "--batch-size", "8"});
  const Datasets d = load_datasets(o, model_config(o));
  EXPECT_TRUE(throws_with([&] { check_batch_fits(o, d); },
                          {"--batch-size 8", "training set's 4", "lower --batch-size", "raise --synthetic-size"}));
  o.batch_size = 4;
  check_batch_fits(o, d);
}

}  // namespace
}  // namespace octet
