#pragma once
// What train_vit reports around its steps (apps/train_step.h): the log lines, the --metrics file
// (JSON Lines), the FP8 numbers of --fp8-log-layer, FSDP's memory ledger and the --trace window.
// Rank 0 writes the metrics; every rank traces, and logs (ranks other than 0 at warn level only).
//
//   report.start();                       the run's setup, and the "start" event
//   report.begin_step(step);              before each step
//   report.read_ledger();                 inside it, after the optimizer step (TrainStep's hook)
//   report.end_step(step, lr, result);    after it: queues the "step" event; a log line every --log-every
//   report.read_losses();                 before an evaluation or a checkpoint (end_step does it on log steps)
//   report.eval(step, epoch, result);     after an evaluation
//   report.end(step);                     the "end" event
//
// A step's loss stays on the device until a log step: end_step copies it into a buffer there, and
// read_losses reads the buffer in one host read, checks the losses, and writes the queued steps'
// events in order. On a GPU the steps between log steps thus never wait for the device, and their
// step_ms is measured by CUDA events around each step (read with the losses), not by the host clock;
// on the CPU it is the host clock, as before. A non-finite loss ends the run at the read that finds
// it, naming its step: at the next log step, evaluation or checkpoint, so no checkpoint is written
// after it.
#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>
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

// "42s", "4m05s", "1h02m" (seconds rounded, never negative; "?" when not finite): the elapsed time
// and the time left that each log line ends with.
std::string format_duration(double seconds);

namespace nn {
class ModuleTracer;
}
class Fp8LayerMonitor;  // train_report.cpp
class StepClock;        // train_report.cpp

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
  // Reads the queued steps' losses (one host read, which waits for the device), throws naming the
  // first step whose loss is not finite, and writes their events. A no-op with nothing queued.
  void read_losses();
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
  // The steps whose losses are still on the device: their events without the loss and the timing,
  // and losses_[i] holds queued_[i]'s loss. step_clock_ times them.
  struct QueuedStep {
    int64_t step = 0;
    nlohmann::json event;
    double host_seconds = 0;
  };
  std::vector<QueuedStep> queued_;
  Tensor losses_;
  std::unique_ptr<StepClock> step_clock_;
  // The log line's figures are over the steps since the last one.
  double window_seconds_ = 0, window_loss_ = 0;
  int64_t window_steps_ = 0;
};

}  // namespace octet
