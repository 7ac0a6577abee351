#include "apps/train_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#if OCTET_HAS_CUDA
#include "core/cuda_stream.h"
#endif

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/cuda_memory.h"
#include "core/log.h"
#include "core/trace.h"
#include "kernels/elementwise.h"
#include "kernels/optimizers.h"
#include "nn/fp8.h"
#include "nn/module_trace.h"

namespace octet {

using nlohmann::json;

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds)) return "?";
  const auto s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s < 60) return std::to_string(s) + "s";
  char text[32];
  if (s < 3600) {
    std::snprintf(text, sizeof text, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(text, sizeof text, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
  }
  return text;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}



// "1.23 GiB in use, 2.34 GiB peak, 3.45 GiB reserved" for a GPU; the CPU has no counters.
std::string memory_summary(Device device) {
  const cuda_memory::MemoryStats m = cuda_memory::memory_stats(device.index);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  return fmt::format("{:.2f} GiB in use, {:.2f} GiB peak, {:.2f} GiB reserved", m.in_use / gib, m.peak / gib,
                     m.reserved / gib);
}

json memory_json(Device device) {
  if (!device.is_cuda()) return json::object();
  const cuda_memory::MemoryStats m = cuda_memory::memory_stats(device.index);
  return {{"in_use_bytes", m.in_use}, {"peak_bytes", m.peak}, {"reserved_bytes", m.reserved}};
}

// "trace.json" for rank 0 of 1; "trace.rank2.json" for rank 2 of several.
std::string trace_path(const std::string& path, int rank, int world) {
  if (world == 1) return path;
  const size_t dot = path.find_last_of('.'), slash = path.find_last_of('/');
  const bool has_extension = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  const std::string stem = has_extension ? path.substr(0, dot) : path, ext = has_extension ? path.substr(dot) : "";
  return fmt::format("{}.rank{}{}", stem, rank, ext);
}

}  // namespace

// The FP8 numbers of one Linear (--fp8-log-layer) on log steps: its scales and amaxes, and how far
// its FP8 output is from the bf16 output of the same input and weights, measured by a forward hook
// (the extra GEMM and reductions are counted in those steps' step_ms).
//
// The error is ||y_fp8 - y_bf16|| / ||y_bf16|| over the log step's first micro-batch on every rank:
// each rank sums the two squares over its own images, and under DDP and FSDP the sums are added over
// the ranks, so the number describes the whole global batch, as the logged loss and the
// (max-reduced) amaxes do, and one process at --batch-size N·B logs the same number to rounding.
// Under FSDP the hook runs inside the unit's forward, while the unit is gathered, so the weight it
// reads is the gathered one. With --fp8-all-gather the FP8 pass gathers that weight as E4M3 bytes
// only and the parameter holds no data: on log steps the monitor gathers the bf16 weight itself
// before the step (one flat's all-gather, every rank), the values the bf16 gather would have given.
class Fp8LayerMonitor {
 public:
  Fp8LayerMonitor(std::shared_ptr<nn::Linear> layer, std::string name, distributed::ProcessGroup* group,
                  distributed::FullyShardedDataParallel* fp8_all_gather_fsdp)
      : layer_(std::move(layer)), name_(std::move(name)), group_(group), fp8_all_gather_fsdp_(fp8_all_gather_fsdp) {
    hook_ = layer_->register_forward_hook([this](nn::Module&, const Tensor& input, const Tensor& output) {
      if (measure_next_forward_) {
        measure_next_forward_ = false;
        const Tensor weight = layer_->weight.storage()->allocated() ? layer_->weight : gathered_weight_;
        OCTET_CHECK(weight.defined(), "--fp8-log-layer ", name_, ": the layer's weight holds no data in its forward "
                    "and none was gathered for it; the FP8 monitor cannot compute the bf16 output");
        NoGradGuard no_grad;
        // The plain path of Linear::forward: bf16 GEMM, f32 accumulation.
        const Tensor reference = linear(input, weight, layer_->bias);
        diff_squares_ = kernels::sum_of_squares(kernels::sub(output, reference));
        reference_squares_ = kernels::sum_of_squares(reference);
        gathered_weight_ = Tensor();
      }
      return Tensor();  // the layer's output goes on unchanged
    });
  }
  ~Fp8LayerMonitor() { layer_->remove_hook(hook_); }
  Fp8LayerMonitor(const Fp8LayerMonitor&) = delete;
  Fp8LayerMonitor& operator=(const Fp8LayerMonitor&) = delete;

  // The layer's next forward also computes its bf16 output (once: a log step's training forward).
  // Before the step, on every rank: under --fp8-all-gather it gathers the layer's weight.
  void measure_next_forward() {
    measure_next_forward_ = true;
    diff_squares_ = reference_squares_ = std::numeric_limits<double>::quiet_NaN();
    if (fp8_all_gather_fsdp_) {
      gathered_weight_ = fp8_all_gather_fsdp_->full_parameter(name_ + ".weight").to(layer_->weight.dtype());
    }
  }

  // Reads the layer's state (a host sync) and adds the squares over the ranks (a collective): call
  // it on every rank on log steps only, after the step.
  json numbers() const {
    OCTET_CHECK(layer_->fp8_state != nullptr, "--fp8-log-layer ", name_, " has not run in FP8; pass a Linear "
                "of the transformer blocks");
    const nn::Fp8LinearState::Snapshot s = layer_->fp8_state->snapshot();
    double diff = diff_squares_, ref = reference_squares_;
    if (group_ && group_->size() > 1) {
      const Tensor sums = from_vector<double>({diff, ref}, {2}, DType::f64, group_->device());
      group_->all_reduce(sums, distributed::ReduceOp::Sum)->wait();
      const std::vector<double> summed = sums.to_vector<double>();
      diff = summed[0], ref = summed[1];
    }
    const double rel_error = ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
    return {{"layer", name_},
            {"input_scale", s.input_scale},
            {"weight_scale", s.weight_scale},
            {"grad_output_scale", s.grad_output_scale},
            {"input_amax", s.input_amax},
            {"weight_amax", s.weight_amax},
            {"grad_output_amax", s.grad_output_amax},
            {"output_rel_error_vs_bf16", std::isnan(rel_error) ? json(nullptr) : json(rel_error)}};
  }

 private:
  std::shared_ptr<nn::Linear> layer_;
  std::string name_;
  distributed::ProcessGroup* group_;                          // null in one process
  distributed::FullyShardedDataParallel* fp8_all_gather_fsdp_;  // set under FSDP with --fp8-all-gather
  size_t hook_ = 0;
  bool measure_next_forward_ = false;
  Tensor gathered_weight_;  // the bf16 weight for the next measurement, under --fp8-all-gather
  // The measured forward's sums of squares on this rank: of y_fp8 - y_bf16 and of y_bf16 (NaN unmeasured).
  double diff_squares_ = std::numeric_limits<double>::quiet_NaN();
  double reference_squares_ = std::numeric_limits<double>::quiet_NaN();
};

// How long each step took, measured without a host sync. On a GPU: CUDA events recorded on the
// compute stream at the step's start and end, read once the work behind them has finished (after
// read_losses' read); the time is the GPU's, which is what a run that never waits for its device
// takes per step. On the CPU, which computes as it goes: the host clock, taken by the caller.
class StepClock {
 public:
  explicit StepClock(Device device) : device_(device) {}

  // Marks the start and the end of queued step `i` (counted from the last read of the losses).
  void start(size_t i) { record(2 * i); }
  void stop(size_t i) { record(2 * i + 1); }
  // Step i's seconds, or `host_seconds` on the CPU. Once the step's work has finished.
  double seconds(size_t i, double host_seconds) const {
#if OCTET_HAS_CUDA
    if (device_.is_cuda()) return events_[2 * i + 1]->elapsed_ms(*events_[2 * i]) / 1e3;
#endif
    (void)i;
    return host_seconds;
  }

 private:
  void record([[maybe_unused]] size_t k) {
#if OCTET_HAS_CUDA
    if (!device_.is_cuda()) return;
    cuda::DeviceGuard guard(device_.index);
    while (events_.size() <= k) events_.push_back(std::make_unique<cuda::Event>(/*timing=*/true));
    events_[k]->record(cuda::compute_stream(device_.index));
#endif
  }

  Device device_;
#if OCTET_HAS_CUDA
  std::vector<std::unique_ptr<cuda::Event>> events_;  // reused: 2i and 2i + 1 for queued step i
#endif
};

TrainReport::TrainReport(const RunOptions& o, models::VisionTransformer& model, ParallelModel& parallel,
                         const optim::Optimizer& optimizer, distributed::ProcessGroup* group,
                         std::shared_ptr<nn::Linear> fp8_layer, int64_t first_step, int64_t total_steps)
    : o_(o),
      device_(Device::parse(o.device)),
      model_(model),
      parallel_(parallel),
      optimizer_(optimizer),
      group_(group),
      rank_(group ? group->rank() : 0),
      world_(group ? group->size() : 1),
      first_step_(first_step),
      total_steps_(total_steps),
      global_batch_(o.batch_size * world_ * o.grad_accum),
      flops_per_image_(3.0 * model.flops_per_image_forward()),
      step_clock_(std::make_unique<StepClock>(device_)) {
  if (rank_ == 0 && !o.metrics.empty()) {
    // JSON Lines: one object per event, flushed at once so that a crashed run keeps what it logged.
    metrics_.open(o.metrics, o.resume.empty() ? std::ios::trunc : std::ios::app);
    OCTET_CHECK(metrics_.good(), "cannot open --metrics file ", o.metrics, " for writing; pass a writable path");
  }
  if (fp8_layer) {
    fp8_monitor_ = std::make_unique<Fp8LayerMonitor>(std::move(fp8_layer), o.fp8_log_layer, group,
                                                     o.fp8_all_gather ? parallel.fsdp() : nullptr);
  }
  if (!o.trace.empty()) module_tracer_ = std::make_unique<nn::ModuleTracer>(model, /*max_depth=*/2);
  trace_first_ = first_step + 1 < total_steps ? first_step + 1 : first_step;
  trace_end_ = trace_first_ + o.trace_steps;
}

TrainReport::~TrainReport() = default;

void TrainReport::write(const json& event) {
  if (metrics_.is_open()) metrics_ << event.dump() << '\n' << std::flush;
}

void TrainReport::start() {
  const bool fp8 = o_.precision == "fp8";
  logging::info("{}: {} parameters, {:.1f} MFLOP per training image; {} steps of {} images in {}{} on {}",
                model_.config().name, model_.num_parameters(), flops_per_image_ / 1e6, total_steps_, global_batch_,
                o_.precision, fp8 ? " (" + fp8_recipe_from(o_.fp8).describe() + ")" : "",
                device_.is_cuda() ? device_.str() : fmt::format("the CPU ({} thread(s))", o_.threads));
  if (group_) logging::info("{}; {} images per rank per step", parallel_.describe(), o_.batch_size);
  if (parallel_.has_ledger()) {
    const json ledger = parallel_.ledger(optimizer_);
    logging::info("memory ledger (rank 0, at the start): {} parameter shard bytes; gradients and AdamW state follow "
                  "at the first step", ledger["parameters_bytes"].get<int64_t>());
  }
  if (device_.is_cuda()) logging::info("{} memory after setup: {}", device_.str(), memory_summary(device_));
  write({{"event", "start"}, {"model", model_.config().name}, {"parameters", model_.num_parameters()},
         {"total_steps", total_steps_}, {"flags", run_flags(o_)}, {"memory", memory_json(device_)}});
  run_start_ = Clock::now();
}

void TrainReport::begin_step(int64_t step) {
  if (module_tracer_ && step == trace_first_) trace::start(rank_);
  step_start_ = Clock::now();
  step_start_us_ = trace::now_us();
  log_now_ = (step + 1) % o_.log_every == 0 || step + 1 == total_steps_;
  ledger_now_ = step == first_step_ || log_now_;
  if (fp8_monitor_ && log_now_) fp8_monitor_->measure_next_forward();
  step_clock_->start(queued_.size());
}

void TrainReport::read_ledger() {
  ledger_ = !ledger_now_ ? json() : parallel_.has_ledger() ? parallel_.ledger(optimizer_) : json::object();
}

void TrainReport::end_step(int64_t step, double lr, const StepResult& result) {
  const size_t slot = queued_.size();
  // The loss goes into the device buffer of queued losses, unread: a GPU step never waits here.
  const Tensor loss = result.loss.detach();
  if (!losses_.defined()) {
    // Room for the steps between two log steps; a read before that (evaluation, checkpoint) frees it.
    losses_ = empty({std::max<int64_t>(1, std::min(o_.log_every, total_steps_))}, loss.dtype(), loss.device());
  }
  OCTET_CHECK(loss.dtype() == losses_.dtype() && loss.device() == losses_.device(), "TrainReport: the loss is ",
              loss.describe(), " but the earlier steps' were ", dtype_name(losses_.dtype()), " on ",
              losses_.device().str(), "; a run keeps its loss's dtype and device");
  const Tensor logged_loss = losses_.narrow(static_cast<int64_t>(slot), 1);
  logged_loss.copy_(loss);
  // The loss every rank logs is the mean over the ranks: the loss of the whole global batch, as one
  // process would log it. Under NCCL the all-reduce is ordered on the device; the host goes on.
  if (group_) group_->all_reduce(logged_loss, distributed::ReduceOp::Avg)->wait();
  step_clock_->stop(slot);
  const double host_seconds = seconds_since(step_start_);
  if (trace::enabled()) {
    trace::complete(fmt::format("step {}", step), "step", "compute", step_start_us_, trace::now_us());
    if (step == trace_end_ || step == total_steps_) {
      trace::stop();
      const std::string path = trace_path(o_.trace, rank_, world_);
      trace::write(path);
      logging::info("trace of steps {}..{} written to {}{}", trace_first_ + 1, step, path,
                    world_ > 1 ? " (one file per rank)" : "");
    }
  }

  // The event as far as the host knows it now; read_losses adds the loss and the timing.
  json event = {{"event", "step"}, {"step", step}, {"epoch", result.batch.epoch}, {"lr", lr}};
  if (device_.is_cuda()) event["memory"] = memory_json(device_);
  json fp8_numbers;
  if (fp8_monitor_ && log_now_) event["fp8"] = fp8_numbers = fp8_monitor_->numbers();  // a host read: log steps only
  if (ledger_now_) {
    ledger_["saved_activations_bytes"] = result.saved_activation_bytes;
    event["memory_ledger"] = ledger_;
    if (step == first_step_ + 1) log_first_ledger(ledger_);
  }
  queued_.push_back({step, std::move(event), host_seconds});
  if (!log_now_ && queued_.size() < static_cast<size_t>(losses_.numel())) return;

  // A log step (or a full buffer): the one host read of the losses since the last one.
  read_losses();
  if (!log_now_) return;
  const double ips = static_cast<double>(global_batch_ * window_steps_) / window_seconds_;
  const std::string memory = device_.is_cuda() ? " | " + memory_summary(device_) : "";
  // Time left at the pace of the run so far (evaluations and checkpoints included, as they recur).
  const double elapsed = seconds_since(run_start_);
  const double left = elapsed / static_cast<double>(step - first_step_) * static_cast<double>(total_steps_ - step);
  logging::info("step {:5d}/{} | epoch {} | loss {:.4f} | lr {:.2e} | {:.0f} img/s | {:.1f} ms/step | {:.1f} GFLOP/s{} | "
                "{} elapsed, {} left",
                step, total_steps_, result.batch.epoch, window_loss_ / window_steps_, lr, ips,
                1e3 * window_seconds_ / window_steps_, ips * flops_per_image_ / 1e9, memory, format_duration(elapsed),
                format_duration(left));
  window_seconds_ = window_loss_ = 0, window_steps_ = 0;
  if (fp8_monitor_) log_fp8(fp8_numbers);
}

void TrainReport::read_losses() {
  if (queued_.empty()) return;
  // NaN detection happens here, at the read of the queued losses (log steps, evaluations,
  // checkpoints), not through a device flag: the losses are read anyway, and the error names the
  // first step whose loss is not finite.
  const std::vector<double> losses = losses_.narrow(0, static_cast<int64_t>(queued_.size())).to_vector<double>();
  std::vector<QueuedStep> queued = std::move(queued_);
  queued_.clear();
  for (size_t i = 0; i < queued.size(); ++i) {
    const double loss = losses[i];
    OCTET_CHECK(std::isfinite(loss), "the loss became ", loss, " at step ", queued[i].step,
                "; lower --lr, raise --warmup-steps or set --clip-grad (losses are read on the host every --log-every "
                "steps, so the run went on to step ", queued.back().step, ")");
    const double step_seconds = step_clock_->seconds(i, queued[i].host_seconds);
    json& event = queued[i].event;
    event["loss"] = loss;
    event["images_per_sec"] = static_cast<double>(global_batch_) / step_seconds;
    event["step_ms"] = 1e3 * step_seconds;
    write(event);
    window_seconds_ += step_seconds, window_loss_ += loss, ++window_steps_;
  }
}

void TrainReport::log_first_ledger(const json& l) const {
  // Activations: the first step's forward, on rank 0; the blocks' inputs alone under --recompute blocks.
  const int64_t block_input = o_.batch_size * (model_.num_patches() + 1) * model_.config().embed_dim *
                              static_cast<int64_t>(dtype_size(o_.precision == "fp32" ? DType::f32 : DType::bf16));
  logging::info("activations saved for backward (rank 0): {} bytes, {:.1f} block inputs per block ({} bytes each; "
                "--recompute {})",
                l["saved_activations_bytes"].get<int64_t>(),
                static_cast<double>(l["saved_activations_bytes"].get<int64_t>()) /
                    static_cast<double>(block_input * model_.config().depth),
                block_input, o_.recompute);
  if (!parallel_.has_ledger()) return;
  logging::info("memory ledger (rank 0, bytes): parameters {} + gradients {} + optimizer {} = {} sharded (1/{} of "
                "every flat); gathered units and gradients in flight peaked at {} ({} units at once){}",
                l["parameters_bytes"].get<int64_t>(), l["gradients_bytes"].get<int64_t>(),
                l["optimizer_bytes"].get<int64_t>(), l["sharded_total_bytes"].get<int64_t>(),
                l["shard_group_size"].get<int>(),
                l["peak_gathered_bytes"].get<int64_t>(), l["max_units_gathered"].get<int>(),
                o_.precision == "fp8"
                    ? fmt::format("; the FP8 Linears' own weight casts hold {}{}",
                                  l["fp8_weight_casts_bytes"].get<int64_t>(),
                                  o_.fp8_all_gather ? " (--fp8-all-gather: they view the gathered units)"
                                                    : " (all blocks' weights; --fp8-all-gather makes it 0)")
                    : "");
}

void TrainReport::log_fp8(const json& n) const {
  logging::info("fp8 {} | scale x {:.4g} w {:.4g} dy {:.4g} | amax x {:.4g} w {:.4g} dy {:.4g} | "
                "output error vs bf16 {:.3e}",
                o_.fp8_log_layer, n["input_scale"].get<double>(), n["weight_scale"].get<double>(),
                n["grad_output_scale"].get<double>(), n["input_amax"].get<double>(), n["weight_amax"].get<double>(),
                n["grad_output_amax"].get<double>(),
                n["output_rel_error_vs_bf16"].is_null() ? std::nan("") : n["output_rel_error_vs_bf16"].get<double>());
}

void TrainReport::eval(int64_t step, int64_t epoch, const EvalResult& result) {
  logging::info("eval at step {}: test accuracy {:.2f}%, test loss {:.4f} ({:.0f} s elapsed)", step,
                100 * result.accuracy, result.loss, seconds_since(run_start_));
  write({{"event", "eval"}, {"step", step}, {"epoch", epoch}, {"accuracy", result.accuracy}, {"loss", result.loss},
         {"elapsed_s", seconds_since(run_start_)}});
}

void TrainReport::end(int64_t step) {
  read_losses();
  write({{"event", "end"}, {"step", step}, {"elapsed_s", seconds_since(run_start_)}});
}

}  // namespace octet
