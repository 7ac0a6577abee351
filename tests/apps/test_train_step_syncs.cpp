// train_vit's step makes no host sync outside its log steps, checked on the CPU (CI has no GPU):
// TrainStep (apps/train_step.h) and TrainReport (apps/train_report.h) drive a tiny ViT as train_vit
// does, with gradient accumulation, a clip that binds, dropout and DropPath, and core/host_sync.h
// counts every item() and to_vector() (the reads a GPU would wait for) around each step. The count
// must stay still on the steps between log steps and move on a log step, where the losses are read.
// Then: the losses the report writes are the steps' own, in order, and a NaN loss ends the run at
// the next read, naming its step.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <unistd.h>

#include "apps/parallel.h"
#include "apps/run_options.h"
#include "apps/train_report.h"
#include "apps/train_step.h"
#include "core/host_sync.h"
#include "core/random.h"
#include "models/vit.h"
#include "optim/optim.h"
#include "tests/log_capture.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::throws_with;

models::ViTConfig tiny_config() {
  return {.name = "tiny_syncs", .img_size = 8, .patch_size = 4, .in_chans = 1, .num_classes = 5, .embed_dim = 16,
          .depth = 2, .num_heads = 2, .mlp_ratio = 2.0, .qkv_bias = true, .drop_rate = 0.1, .attn_drop_rate = 0.0,
          .drop_path_rate = 0.3};
}

RunOptions tiny_options(int64_t log_every, std::string metrics = "") {
  RunOptions o;
  o.device = "cpu";
  o.threads = 1;
  o.batch_size = 4;
  o.grad_accum = 2;
  o.clip_grad = 1e-3;  // binds at every step: the scaling runs
  o.log_every = log_every;
  o.metrics = std::move(metrics);
  return o;
}

// The model, its optimizer and train_vit's step and report around them.
struct TinyRun {
  RunOptions o;
  Generator init{3}, data{4};
  std::shared_ptr<models::VisionTransformer> model;
  ParallelModel parallel;
  optim::AdamW optimizer;
  TrainReport report;
  TrainStep step;

  TinyRun(RunOptions options, int64_t total_steps)
      : o(std::move(options)),
        model(std::make_shared<models::VisionTransformer>(tiny_config(), true, &init)),
        parallel(o, model, nullptr),
        optimizer(parallel.param_groups(o.lr, o.weight_decay), o.lr),
        report(o, *model, parallel, optimizer, nullptr, nullptr, 0, total_steps),
        step{.model = *model,
             .criterion = nn::CrossEntropyLoss(o.label_smoothing),
             .optimizer = optimizer,
             .backward = [this](const Tensor& loss, bool last) { parallel.backward(loss, last); },
             .clip_grad_norm = [this](double max_norm) { parallel.clip_grad_norm_(max_norm); },
             .grad_accum = o.grad_accum,
             .clip_grad = o.clip_grad} {
    model->train();
    report.start();
  }

  data::Batch next_batch() {
    return {randn({o.batch_size, 1, 8, 8}, data), from_vector<int64_t>({0, 1, 2, 4}, {4}), 0, 0};
  }
};

TEST(TrainStepSyncs, NoHostReadBetweenLogStepsAndOneAtEach) {
  const int64_t total_steps = 7, log_every = 3;  // log steps: 3, 6 and 7 (the last)
  TinyRun run(tiny_options(log_every), total_steps);
  for (int64_t step = 0; step < total_steps; ++step) {
    const uint64_t masks_before = run.init.offset();
    const host_sync::Counts before = host_sync::counts();
    run.report.begin_step(step);
    const StepResult result = run.step([&] { return run.next_batch(); });
    run.report.end_step(step + 1, run.o.lr, result);
    const host_sync::Counts during = host_sync::counts() - before;

    EXPECT_GT(run.init.offset(), masks_before) << "dropout and DropPath drew masks at step " << step + 1;
    const bool log_step = (step + 1) % log_every == 0 || step + 1 == total_steps;
    if (log_step) {
      // The read of the queued losses: what makes this test able to fail.
      EXPECT_EQ(during.of(host_sync::Kind::to_vector), 1) << "step " << step + 1 << ": " << during.describe();
    } else {
      EXPECT_EQ(during.total(), 0) << "step " << step + 1 << " read the host: " << during.describe();
    }
  }
}

TEST(TrainStepSyncs, TheCountSeesAHostReadInTheStep) {
  // The count is not blind to the step's code: a step whose clip reads the norm on the host, as the
  // step did before the norm stayed on the device, counts that read.
  TinyRun run(tiny_options(100), 10);
  TrainStep reading = run.step;
  double norm = 0;
  reading.clip_grad_norm = [&](double max_norm) { norm = run.parallel.clip_grad_norm_(max_norm); };
  const host_sync::Counts before = host_sync::counts();
  reading([&] { return run.next_batch(); });
  const host_sync::Counts during = host_sync::counts() - before;
  EXPECT_EQ(during.of(host_sync::Kind::item), 1) << during.describe();
  EXPECT_EQ(during.total(), 1) << during.describe();
  EXPECT_GT(norm, run.o.clip_grad);
}

TEST(TrainStepSyncs, TheReportWritesEveryStepsOwnLoss) {
  const std::filesystem::path metrics =
      std::filesystem::temp_directory_path() / ("octet_train_step_syncs_" + std::to_string(::getpid()) + ".jsonl");
  std::vector<double> losses;
  {
    const int64_t total_steps = 5;
    TinyRun run(tiny_options(2, metrics.string()), total_steps);
    for (int64_t step = 0; step < total_steps; ++step) {
      run.report.begin_step(step);
      const StepResult result = run.step([&] { return run.next_batch(); });
      run.report.end_step(step + 1, run.o.lr, result);
      losses.push_back(result.loss.item());
    }
    run.report.end(total_steps);
  }
  std::ifstream in(metrics);
  std::vector<double> written;
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json event = nlohmann::json::parse(line);
    if (event["event"] != "step") continue;
    written.push_back(event["loss"].get<double>());
    steps.push_back(event["step"].get<int64_t>());
    EXPECT_GT(event["step_ms"].get<double>(), 0);
  }
  std::filesystem::remove(metrics);
  EXPECT_EQ(written, losses);  // bit for bit, in order
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5}));
}

TEST(TrainStepSyncs, ANonFiniteLossEndsTheRunAtTheNextReadNamingItsStep) {
  TinyRun run(tiny_options(4), 10);
  const data::Batch batch = run.next_batch();
  auto end_step = [&](int64_t step, double loss) {
    run.report.begin_step(step - 1);
    run.report.end_step(step, run.o.lr, StepResult{full({}, loss), batch});
  };
  end_step(1, 2.0);
  end_step(2, std::numeric_limits<double>::quiet_NaN());  // not a log step: nothing read yet
  end_step(3, 2.0);
  EXPECT_TRUE(throws_with([&] { end_step(4, 2.0); }, {"the loss became nan at step 2", "--lr", "step 4"}));

  // An evaluation or a checkpoint reads the queued losses first (train_vit calls read_losses).
  TinyRun other(tiny_options(4), 10);
  other.report.begin_step(0);
  other.report.end_step(1, other.o.lr, StepResult{full({}, std::numeric_limits<double>::infinity()), batch});
  EXPECT_TRUE(throws_with([&] { other.report.read_losses(); }, {"the loss became inf at step 1"}));
}

TEST(TrainReport, LogLinesEndWithTheTimeElapsedAndTheTimeLeft) {
  EXPECT_EQ(format_duration(0.2), "0s");
  EXPECT_EQ(format_duration(42.4), "42s");
  EXPECT_EQ(format_duration(245), "4m05s");
  EXPECT_EQ(format_duration(3725), "1h02m");
  EXPECT_EQ(format_duration(-3), "0s");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::infinity()), "?");

  std::string log;
  {
    const testing::CapturedLog captured;
    const int64_t total_steps = 4, log_every = 2;
    TinyRun run(tiny_options(log_every), total_steps);
    for (int64_t step = 0; step < total_steps; ++step) {
      run.report.begin_step(step);
      const StepResult result = run.step([&] { return run.next_batch(); });
      run.report.end_step(step + 1, run.o.lr, result);
    }
    log = captured.text();
  }
  // Step 2 of 4: half the run is left, so the time left is the time elapsed, give or take rounding.
  const auto line_of = [&](const std::string& start) {
    const size_t at = log.find(start);
    return at == std::string::npos ? std::string() : log.substr(at, log.find('\n', at) - at);
  };
  const std::string second = line_of("step     2/4"), last = line_of("step     4/4");
  ASSERT_FALSE(second.empty()) << log;
  EXPECT_NE(second.find(" elapsed, "), std::string::npos) << second;
  EXPECT_NE(second.find(" left"), std::string::npos) << second;
  ASSERT_FALSE(last.empty()) << log;
  EXPECT_NE(last.find(", 0s left"), std::string::npos) << last;
}

}  // namespace
}  // namespace octet
