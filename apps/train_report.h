#pragma once
// What train_vit reports around its steps (apps/train_step.h): the log lines, the --metrics file
// (JSON Lines), the FP8 numbers of --fp8-log-layer, FSDP's memory ledger and the --trace window.
// Rank 0 writes the metrics; every rank traces, and logs (ranks other than 0 at warn level only).
//
//   report.start();                       the run's setup, and the "start" event
//   report.begin_step(step);              before each step
//   report.read_ledger();                 inside it, after the optimizer step (TrainStep's hook)
//   report.end_step(step, lr, result);    after it: the "step" event, a log line every --log-every
//   report.eval(step, epoch, result);     after an evaluation
//   report.end(step);                     the "end" event
#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "apps/parallel.h"
#include "apps/run_options.h"
#include "apps/train_step.h"
#include "core/device.h"
#include "distributed/process_group.h"
#include "models/vit.h"
#include "nn/layers.h"
#include "optim/optimizer.h"

namespace octet {

namespace nn {
class ModuleTracer;
}
class Fp8LayerMonitor;  // train_report.cpp

struct EvalResult {
  double accuracy = 0, loss = 0;  // over the whole test set
};

class TrainReport {
 public:
  // `fp8_layer` is --fp8-log-layer's Linear under --precision fp8, else null. `group` is null in one
  // process; `first_step` is the step the run starts at (the checkpoint's under --resume). Opens the
  // --metrics file, appending to it under --resume.
  TrainReport(const RunOptions& o, models::VisionTransformer& model, ParallelModel& parallel,
              const optim::Optimizer& optimizer, distributed::ProcessGroup* group,
              std::shared_ptr<nn::Linear> fp8_layer, int64_t first_step, int64_t total_steps);
  ~TrainReport();
  TrainReport(const TrainReport&) = delete;
  TrainReport& operator=(const TrainReport&) = delete;

  void start();
  // Steps count from 0 before a step and from 1 after it: end_step(1, ...) follows begin_step(0).
  void begin_step(int64_t step);
  void read_ledger();  // between the optimizer step and zero_grad: the step's high-water mark
  void end_step(int64_t step, double lr, const StepResult& result);
  void eval(int64_t step, int64_t epoch, const EvalResult& result);
  void end(int64_t step);

 private:
  using Clock = std::chrono::steady_clock;
  void write(const nlohmann::json& event);
  void log_first_ledger(const nlohmann::json& ledger) const;
  void log_fp8(const nlohmann::json& numbers) const;

  const RunOptions& o_;
  const Device device_;
  models::VisionTransformer& model_;
  ParallelModel& parallel_;
  const optim::Optimizer& optimizer_;
  distributed::ProcessGroup* group_;
  const int rank_, world_;
  const int64_t first_step_, total_steps_, global_batch_;  // global_batch_: images per optimizer step
  const double flops_per_image_;                           // forward + backward
  std::ofstream metrics_;
  std::unique_ptr<Fp8LayerMonitor> fp8_monitor_;
  // --trace: forward and backward per module (two levels: "blocks.3") and every collective, for
  // --trace-steps steps after an untraced first one.
  std::unique_ptr<nn::ModuleTracer> module_tracer_;
  int64_t trace_first_ = 0, trace_end_ = 0;

  Clock::time_point run_start_, step_start_;
  int64_t step_start_us_ = 0;
  bool log_now_ = false, ledger_now_ = false;  // this step's
  nlohmann::json ledger_;
  // The log line's figures are over the steps since the last one.
  double window_seconds_ = 0, window_loss_ = 0;
  int64_t window_steps_ = 0;
};

}  // namespace octet
