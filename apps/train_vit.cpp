// train_vit: trains a Vision Transformer with Octet, the project's main program.
//
//   build/bin/train_vit                       Fashion-MNIST with the defaults below (the README's main job)
//   build/bin/train_vit --dataset synthetic --model vit_small_patch16_224 --steps 20
//   build/bin/train_vit --steps 200 --checkpoint-dir ckpt --checkpoint-every 100
//   build/bin/train_vit --steps 200 --resume ckpt          continues bitwise-exactly from ckpt/latest
//   build/bin/train_vit --device cuda --precision bf16     on the first GPU, bf16 with f32 master weights
//   build/bin/train_vit --precision fp8 --fp8-recipe delayed --fp8-amax-history 16   FP8 GEMMs in the blocks
//   mpirun -np 4 build/bin/train_vit --parallel ddp --batch-size 32   data parallel: 4 × 32 images per step
//
// The step reads top to bottom: next batch, forward, loss, backward, clip, schedule, optimizer step.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <limits>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps/checkpoint.h"
#include "apps/run_options.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/cuda_memory.h"
#include "core/log.h"
#include "core/random.h"
#include "data/device_prefetcher.h"
#include "data/loader.h"
#include "apps/parallel.h"
#include "distributed/fsdp_checkpoint.h"
#include "distributed/launch.h"
#include "kernels/elementwise.h"
#include "kernels/optimizers.h"
#include "kernels/reduce.h"
#include "kernels/threads.h"
#include "models/vit.h"
#include "nn/fp8.h"
#include "core/trace.h"
#include "nn/layers.h"
#include "nn/lora.h"
#include "nn/module_trace.h"
#include "nn/safetensors.h"
#include "optim/optim.h"

using namespace octet;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// JSON Lines: one object per event, flushed at once so that a crashed run keeps what it logged.
class MetricsFile {
 public:
  MetricsFile(const std::string& path, bool append) {
    if (path.empty()) return;
    out_.open(path, append ? std::ios::app : std::ios::trunc);
    OCTET_CHECK(out_.good(), "cannot open --metrics file ", path, " for writing; pass a writable path");
  }
  void write(const json& event) {
    if (out_.is_open()) out_ << event.dump() << '\n' << std::flush;
  }

 private:
  std::ofstream out_;
};

// Training batches on the run's device: straight from the loader on the CPU; on a GPU through the
// prefetcher, which copies batch k+1 on its own stream while step k computes.
class TrainBatches {
 public:
  TrainBatches(data::DataLoader& loader, Device device) : loader_(loader) {
#if OCTET_HAS_CUDA
    if (device.is_cuda()) prefetcher_ = std::make_unique<data::DevicePrefetcher>(loader, device);
#else
    OCTET_CHECK(device.is_cpu(), "train_vit: ", device.str(), " needs a CUDA build");
#endif
  }
  data::Batch next() {
#if OCTET_HAS_CUDA
    if (prefetcher_) return prefetcher_->next();
#endif
    return loader_.next();
  }
  // The position of the batch next() returns next.
  data::DataLoader::State state() const {
#if OCTET_HAS_CUDA
    if (prefetcher_) return prefetcher_->state();
#endif
    return loader_.state();
  }
  void set_state(data::DataLoader::State state) {
#if OCTET_HAS_CUDA
    if (prefetcher_) return prefetcher_->set_state(state);
#endif
    loader_.set_state(state);
  }

 private:
  data::DataLoader& loader_;
#if OCTET_HAS_CUDA
  std::unique_ptr<data::DevicePrefetcher> prefetcher_;
#endif
};

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

// The FP8 numbers of one Linear (--fp8-log-layer) on log steps: its scales and amaxes, and how far
// its FP8 output is from the bf16 output of the same input and weights, measured by a forward hook
// (the extra GEMM and reductions are counted in those steps' step_ms).
class Fp8LayerMonitor {
 public:
  Fp8LayerMonitor(std::shared_ptr<nn::Linear> layer, std::string name)
      : layer_(std::move(layer)), name_(std::move(name)) {
    hook_ = layer_->register_forward_hook([this](nn::Module&, const Tensor& input, const Tensor& output) {
      if (measure_next_forward_) {
        measure_next_forward_ = false;
        // FSDP's FP8 all-gather hands the layer its weight in FP8 only: there is no bf16 weight to
        // compare with, and the error is reported as null.
        if (!layer_->weight.storage()->allocated()) return Tensor();
        NoGradGuard no_grad;
        // The plain path of Linear::forward: bf16 GEMM, f32 accumulation.
        rel_error_ = relative_error(output, linear(input, layer_->weight, layer_->bias));
      }
      return Tensor();  // the layer's output goes on unchanged
    });
  }
  ~Fp8LayerMonitor() { layer_->remove_hook(hook_); }
  Fp8LayerMonitor(const Fp8LayerMonitor&) = delete;
  Fp8LayerMonitor& operator=(const Fp8LayerMonitor&) = delete;

  // The layer's next forward also computes its bf16 output (once: a log step's training forward).
  void measure_next_forward() {
    measure_next_forward_ = true;
    rel_error_ = std::numeric_limits<double>::quiet_NaN();
  }

  // Reads the layer's state (a host sync): call it on log steps only, after the step.
  json numbers() const {
    OCTET_CHECK(layer_->fp8_state != nullptr, "--fp8-log-layer ", name_, " has not run in FP8; pass a Linear "
                "of the transformer blocks");
    const nn::Fp8LinearState::Snapshot s = layer_->fp8_state->snapshot();
    return {{"layer", name_},
            {"input_scale", s.input_scale},
            {"weight_scale", s.weight_scale},
            {"grad_output_scale", s.grad_output_scale},
            {"input_amax", s.input_amax},
            {"weight_amax", s.weight_amax},
            {"grad_output_amax", s.grad_output_amax},
            {"output_rel_error_vs_bf16", std::isnan(rel_error_) ? json(nullptr) : json(rel_error_)}};
  }

 private:
  // ||a - b|| / ||b|| over all elements: the difference (in a's dtype) and both sums of squares (in
  // double) on the tensors' device, so only two numbers come back to the host.
  static double relative_error(const Tensor& a, const Tensor& b) {
    const double diff = kernels::sum_of_squares(kernels::sub(a, b)), ref = kernels::sum_of_squares(b);
    return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
  }

  std::shared_ptr<nn::Linear> layer_;
  std::string name_;
  size_t hook_ = 0;
  bool measure_next_forward_ = false;
  double rel_error_ = std::numeric_limits<double>::quiet_NaN();
};

struct EvalResult {
  double accuracy = 0, loss = 0;
};

// Accuracy and mean cross-entropy (no label smoothing) over the whole test set, on `device`.
// Under --precision fp8 this runs outside any Fp8Autocast scope, as a plain bf16 forward: evaluation
// then never touches the FP8 scaling state (amax histories, scales), so how often a run evaluates
// cannot change its training.
// Under data parallelism each rank evaluates its share of the test set and the counts are summed
// over the ranks. A rank's last batch may be empty; under FSDP every forward gathers parameters
// collectively, so such a rank still runs one (on a single blank image) and counts nothing.
EvalResult evaluate(models::VisionTransformer& model, data::DataLoader& loader, Device device,
                    distributed::ProcessGroup* group, bool forward_every_batch) {
  NoGradGuard no_grad;
  model.eval();
  int64_t correct = 0, seen = 0;
  double loss_sum = 0;
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    const data::Batch batch = loader.next();
    if (batch.labels.numel() == 0) {
      if (forward_every_batch) {
        Shape blank = batch.images.shape();
        blank[0] = 1;
        model(zeros(blank, DType::f32, device));
      }
      continue;
    }
    const Tensor logits = model(batch.images.to(device));
    const int64_t n = batch.labels.numel();
    loss_sum += cross_entropy(logits, batch.labels.to(device)).item() * static_cast<double>(n);
    // The arg-max of a few hundred rows is read on the host anyway: take it there.
    const Tensor predicted = kernels::max(logits.to(Device::cpu()), 1).indices;
    const int64_t* p = predicted.data<int64_t>();
    const int64_t* y = batch.labels.data<int64_t>();
    for (int64_t i = 0; i < n; ++i) correct += p[i] == y[i];
    seen += n;
  }
  model.train();
  if (group != nullptr) {
    const Tensor totals = from_vector<double>({static_cast<double>(correct), static_cast<double>(seen), loss_sum}, {3})
                              .to(group->device());
    group->all_reduce(totals, distributed::ReduceOp::Sum)->wait();
    const std::vector<double> t = totals.to_vector<double>();
    return {t[0] / t[1], t[2] / t[1]};
  }
  return {static_cast<double>(correct) / static_cast<double>(seen), loss_sum / static_cast<double>(seen)};
}

std::unique_ptr<optim::Optimizer> make_optimizer(const RunOptions& o, const ParallelModel& parallel) {
  auto groups = parallel.param_groups(o.lr, o.weight_decay);
  if (o.optimizer == "sgd") return std::make_unique<optim::SGD>(groups, o.lr, o.momentum, 0.0, /*nesterov=*/true);
  return std::make_unique<optim::AdamW>(groups, o.lr, o.beta1, o.beta2, 1e-8, o.weight_decay);
}

// "trace.json" for rank 0 of 1; "trace.rank2.json" for rank 2 of several.
std::string trace_path(const std::string& path, int rank, int world) {
  if (world == 1) return path;
  const size_t dot = path.find_last_of('.'), slash = path.find_last_of('/');
  const bool has_extension = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  const std::string stem = has_extension ? path.substr(0, dot) : path, ext = has_extension ? path.substr(dot) : "";
  return fmt::format("{}.rank{}{}", stem, rank, ext);
}

int train(const RunOptions& o) {
  kernels::set_num_threads(o.threads);
  const models::ViTConfig config = model_config(o);
  const Device device = Device::parse(o.device);

  // Data parallelism: one process group for the job; --batch-size images per rank per step.
  std::shared_ptr<distributed::ProcessGroup> group;
  if (o.parallel != "none") group = distributed::init_process_group(device, distributed::parse_backend(o.dist_backend));
  const int rank = group ? group->rank() : 0, world = group ? group->size() : 1;
  const bool lead = rank == 0;  // writes the metrics and checkpoints, and logs; other ranks log warnings only
  if (!lead) logging::set_level("warn");
  const int64_t global_batch = o.batch_size * world * o.grad_accum;  // images per optimizer step

  const Datasets datasets = load_datasets(o, config);
  Generator init_generator(o.seed);
  auto model_ptr = std::make_shared<models::VisionTransformer>(config, /*initialize=*/true, &init_generator);
  models::VisionTransformer& model = *model_ptr;
  // bf16 and fp8 train bf16 weights (ParallelModel says how); fp8 is the bf16 model whose blocks'
  // Linears run their GEMMs in FP8 inside the step's Fp8Autocast scope below.
  const bool fp8 = o.precision == "fp8";
  model.to(device);
  // LoRA: adapters on the blocks' Linears, everything else frozen but the head (before any wrapper
  // or optimizer takes the parameters).
  if (o.lora_rank > 0) {
    Generator lora_generator(o.seed + 2);
    const auto adapted = nn::apply_lora(model, {.rank = o.lora_rank, .alpha = o.lora_alpha, .generator = &lora_generator},
                                        nn::lora_targets({"qkv", "proj", "fc1", "fc2"}), {"head.weight", "head.bias"});
    int64_t trainable = 0;
    for (const Tensor& p : model.parameters()) trainable += p.requires_grad() ? p.numel() : 0;
    logging::info("LoRA rank {} (alpha {}) on {} Linears: {} of {} parameters train", o.lora_rank, o.lora_alpha,
                  adapted.size(), trainable, model.num_parameters());
  }
  // The default generator draws dropout and drop-path masks: each rank its own stream (rank 0's is
  // a single process's), so ranks do not drop the same rows of their shards.
  manual_seed(o.seed + 1 + static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ull);
  ParallelModel parallel(o, model_ptr, group);
  const nn::AmaxReducer amax_reducer = group ? distributed::fp8_amax_reducer(group) : nullptr;
  auto optimizer = make_optimizer(o, parallel);
  const nn::Fp8Recipe fp8_recipe = fp8_recipe_from(o.fp8);
  std::unique_ptr<Fp8LayerMonitor> fp8_monitor;
  if (fp8) fp8_monitor = std::make_unique<Fp8LayerMonitor>(fp8_log_linear(model, o.fp8_log_layer), o.fp8_log_layer);
  nn::CrossEntropyLoss criterion(o.label_smoothing);

  // On a GPU the host has nothing else to do: let every core assemble batches (synthetic 224x224
  // images cost milliseconds each).
  data::LoaderOptions train_options{.batch_size = o.batch_size, .shuffle = true, .drop_last = true, .seed = o.seed,
                                    .rank = rank, .world_size = world, .threads = device.is_cuda() ? o.threads : 1};
  data::DataLoader train_loader(datasets.train, train_options);
  TrainBatches train_batches(train_loader, device);
  data::DataLoader test_loader(datasets.test, {.batch_size = o.eval_batch_size, .shuffle = false, .drop_last = false,
                                               .rank = rank, .world_size = world});
  const int64_t total_steps =
      o.steps > 0 ? o.steps : std::max<int64_t>(1, o.epochs * train_loader.batches_per_epoch() / o.grad_accum);
  const int64_t warmup_steps = std::min(o.warmup_steps, total_steps);  // a short run warms up throughout
  const optim::WarmupCosineSchedule schedule(o.lr, warmup_steps, total_steps, std::min(o.min_lr, o.lr));

  int64_t step = 0;
  if (!o.resume.empty()) {
    const apps::TrainerState state =
        parallel.fsdp() ? apps::load_sharded_checkpoint(o.resume, *parallel.fsdp(), *optimizer, model)
                        : apps::load_checkpoint(o.resume, model, *optimizer);
    warn_about_changed_flags(state.run, run_flags(o));
    step = state.step;
    train_batches.set_state(state.loader);
    // Every rank has drawn as many numbers as rank 0, whose offset the checkpoint holds.
    default_generator().set_state(default_generator().seed(), state.rng_offset);
    logging::info("resumed from {} at step {} (epoch {}, batch {})", apps::resolve_checkpoint(o.resume), step,
                  state.loader.epoch, state.loader.batch);
  }
  OCTET_CHECK(step < total_steps, "the checkpoint is at step ", step, " but the run ends at step ", total_steps,
              "; raise --steps or --epochs to train further");

  MetricsFile metrics(lead ? o.metrics : "", /*append=*/!o.resume.empty());
  const double flops_per_image = 3.0 * model.flops_per_image_forward();  // forward + backward
  logging::info("{}: {} parameters, {:.1f} MFLOP per training image; {} steps of {} images in {}{} on {}",
                config.name, model.num_parameters(), flops_per_image / 1e6, total_steps, global_batch, o.precision,
                fp8 ? " (" + fp8_recipe.describe() + ")" : "",
                device.is_cuda() ? device.str() : fmt::format("the CPU ({} thread(s))", o.threads));
  if (group) logging::info("{}; {} images per rank per step", parallel.describe(), o.batch_size);
  if (parallel.has_ledger()) {
    const json ledger = parallel.ledger(*optimizer);
    logging::info("memory ledger (rank 0, at the start): {} parameter shard bytes; gradients and AdamW state follow "
                  "at the first step", ledger["parameters_bytes"].get<int64_t>());
  }
  if (device.is_cuda()) logging::info("{} memory after setup: {}", device.str(), memory_summary(device));
  metrics.write({{"event", "start"}, {"model", config.name}, {"parameters", model.num_parameters()},
                 {"total_steps", total_steps}, {"flags", run_flags(o)}, {"memory", memory_json(device)}});

  // --trace: forward and backward per module (two levels: "blocks.3") and every collective, for
  // --trace-steps steps after an untraced first one.
  std::unique_ptr<nn::ModuleTracer> module_tracer;
  if (!o.trace.empty()) module_tracer = std::make_unique<nn::ModuleTracer>(model, /*max_depth=*/2);
  const int64_t trace_first = step + 1 < total_steps ? step + 1 : step, trace_end = trace_first + o.trace_steps;

  const int64_t first_step = step;
  const auto run_start = Clock::now();
  double window_seconds = 0, window_loss = 0;
  int64_t window_steps = 0;
  model.train();
  while (step < total_steps) {
    if (module_tracer && step == trace_first) trace::start(rank);
    const auto step_start = Clock::now();
    const int64_t step_start_us = trace::now_us();
    const double lr = schedule.lr(step);
    optimizer->set_lr(lr);

    const bool log_now = (step + 1) % o.log_every == 0 || step + 1 == total_steps;
    if (fp8_monitor && log_now) fp8_monitor->measure_next_forward();

    // --grad-accum micro-batches, each loss scaled by 1/N so the gradients sum to the mean's. Under
    // DDP all but the last backward skip the all-reduce (no_sync); the last reduces the sum.
    Tensor loss;  // the step's loss: the mean over its micro-batches
    data::Batch batch;
    for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
      batch = train_batches.next();
      Tensor micro_loss;
      {
        // FP8 covers the forward only (off unless --precision fp8). Leaving the scope updates the
        // forward scales; the backward, which runs after it, updates the gradient scales at its end.
        nn::Fp8Autocast fp8_scope(fp8, fp8_recipe, amax_reducer);
        micro_loss = criterion(model(batch.images), batch.labels);
      }
      const Tensor scaled = o.grad_accum > 1 ? micro_loss * (1.0 / static_cast<double>(o.grad_accum)) : micro_loss;
      parallel.backward(scaled, micro + 1 == o.grad_accum);
      loss = micro == 0 ? scaled.detach() : loss + scaled.detach();
    }
    if (o.clip_grad > 0) parallel.clip_grad_norm_(o.clip_grad);
    optimizer->step();
    // The ledger is read before zero_grad frees the gradient shards: the step's high-water mark.
    const bool ledger_now = parallel.has_ledger() && (step == first_step || log_now);
    const json ledger = ledger_now ? parallel.ledger(*optimizer) : json();
    optimizer->zero_grad();
    ++step;

    // The loss every rank logs is the mean over the ranks: the loss of the whole global batch, as one
    // process would log it.
    Tensor logged_loss = loss.detach();
    if (group) {
      logged_loss = logged_loss.clone();
      group->all_reduce(logged_loss, distributed::ReduceOp::Avg)->wait();
    }
    const double loss_value = logged_loss.item();  // on a GPU this waits for the step to finish
    OCTET_CHECK(std::isfinite(loss_value), "the loss became ", loss_value, " at step ", step,
                "; lower --lr, raise --warmup-steps or set --clip-grad");
    const double step_seconds = seconds_since(step_start);
    const double images_per_sec = static_cast<double>(global_batch) / step_seconds;
    if (trace::enabled()) {
      trace::complete(fmt::format("step {}", step), "step", "compute", step_start_us, trace::now_us());
      if (step == trace_end || step == total_steps) {
        trace::stop();
        const std::string path = trace_path(o.trace, rank, world);
        trace::write(path);
        logging::info("trace of steps {}..{} written to {}{}", trace_first + 1, step, path,
                      world > 1 ? " (one file per rank)" : "");
      }
    }
    json event = {{"event", "step"}, {"step", step}, {"epoch", batch.epoch}, {"loss", loss_value}, {"lr", lr},
                  {"images_per_sec", images_per_sec}, {"step_ms", 1e3 * step_seconds}};
    if (device.is_cuda()) event["memory"] = memory_json(device);
    if (fp8_monitor && log_now) event["fp8"] = fp8_monitor->numbers();
    if (ledger_now) {
      event["memory_ledger"] = ledger;
      if (step == first_step + 1) {
        const json& l = ledger;
        logging::info("memory ledger (rank 0, bytes): parameters {} + gradients {} + optimizer {} = {} sharded; "
                      "gathered units and gradients in flight peaked at {} ({} units at once){}",
                      l["parameters_bytes"].get<int64_t>(), l["gradients_bytes"].get<int64_t>(),
                      l["optimizer_bytes"].get<int64_t>(), l["sharded_total_bytes"].get<int64_t>(),
                      l["peak_gathered_bytes"].get<int64_t>(), l["max_units_gathered"].get<int>(),
                      fp8 ? fmt::format("; the FP8 Linears' own weight casts hold {}{}",
                                        l["fp8_weight_casts_bytes"].get<int64_t>(),
                                        o.fp8_all_gather ? " (--fp8-all-gather: they view the gathered units)"
                                                         : " (all blocks' weights; --fp8-all-gather makes it 0)")
                          : "");
      }
    }
    metrics.write(event);
    window_seconds += step_seconds, window_loss += loss_value, ++window_steps;
    if (log_now) {
      const double ips = static_cast<double>(global_batch * window_steps) / window_seconds;
      const std::string memory = device.is_cuda() ? " | " + memory_summary(device) : "";
      logging::info("step {:5d}/{} | epoch {} | loss {:.4f} | lr {:.2e} | {:.0f} img/s | {:.1f} ms/step | {:.1f} GFLOP/s{}",
                    step, total_steps, batch.epoch, window_loss / window_steps, lr, ips,
                    1e3 * window_seconds / window_steps, ips * flops_per_image / 1e9, memory);
      window_seconds = window_loss = 0, window_steps = 0;
      if (fp8_monitor) {
        const json& n = event["fp8"];
        logging::info("fp8 {} | scale x {:.4g} w {:.4g} dy {:.4g} | amax x {:.4g} w {:.4g} dy {:.4g} | "
                      "output error vs bf16 {:.3e}",
                      o.fp8_log_layer, n["input_scale"].get<double>(), n["weight_scale"].get<double>(),
                      n["grad_output_scale"].get<double>(), n["input_amax"].get<double>(),
                      n["weight_amax"].get<double>(), n["grad_output_amax"].get<double>(),
                      n["output_rel_error_vs_bf16"].is_null() ? std::nan("")
                                                              : n["output_rel_error_vs_bf16"].get<double>());
      }
    }

    const bool end_of_epoch = train_batches.state().batch == 0;
    const bool eval_now = o.eval_every > 0 ? step % o.eval_every == 0 : end_of_epoch;
    if (eval_now || step == total_steps) {
      const EvalResult r = evaluate(model, test_loader, device, group.get(), /*forward_every_batch=*/parallel.fsdp() != nullptr);
      logging::info("eval at step {}: test accuracy {:.2f}%, test loss {:.4f} ({:.0f} s elapsed)", step,
                    100 * r.accuracy, r.loss, seconds_since(run_start));
      metrics.write({{"event", "eval"}, {"step", step}, {"epoch", batch.epoch}, {"accuracy", r.accuracy},
                     {"loss", r.loss}, {"elapsed_s", seconds_since(run_start)}});
    }
    const bool checkpoint_now = o.checkpoint_every > 0 ? step % o.checkpoint_every == 0 : step == total_steps;
    // Under FSDP every rank writes its shards; otherwise the ranks hold the same model and optimizer
    // state, and rank 0 writes them.
    if (!o.checkpoint_dir.empty() && (checkpoint_now || step == total_steps) && (lead || parallel.fsdp())) {
      const Generator& rng = default_generator();
      const apps::TrainerState state{.step = step, .loader = train_batches.state(), .rng_seed = rng.seed(),
                                     .rng_offset = rng.offset(), .run = run_flags(o)};
      const std::string where =
          parallel.fsdp() ? apps::save_sharded_checkpoint(o.checkpoint_dir, *parallel.fsdp(), *optimizer, model, state)
                          : apps::save_checkpoint(o.checkpoint_dir, model, *optimizer, state);
      logging::info("checkpoint written to {}", where);
    }
  }
  if (!o.save_model.empty()) {
    if (parallel.fsdp()) {
      distributed::export_consolidated(o.save_model, *parallel.fsdp());  // gathers; rank 0 writes
    } else if (lead) {
      nn::save_safetensors(o.save_model, model.state_dict(), {{"format", "pt"}});
    }
    logging::info("model weights written to {}", o.save_model);
  }
  if (!o.lora_save.empty()) {
    // The adapters and the head alone, under their full names (gathered from the shards under FSDP).
    nn::StateDict adapters;
    for (auto& [name, tensor] : parallel.full_parameters()) {
      if (nn::is_lora_parameter_name(name) || name == "head.weight" || name == "head.bias") adapters[name] = tensor;
    }
    if (lead) {
      nn::save_safetensors(o.lora_save, adapters, {{"lora_rank", std::to_string(o.lora_rank)},
                                                   {"lora_alpha", std::to_string(o.lora_alpha)}});
      logging::info("LoRA adapters and head ({} tensors) written to {}", adapters.size(), o.lora_save);
    }
  }
  metrics.write({{"event", "end"}, {"step", step}, {"elapsed_s", seconds_since(run_start)}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"train_vit: train a Vision Transformer with Octet (Fashion-MNIST by default)"};
  RunOptions options;
  add_run_flags(app, options);
  try {
    app.parse(argc, argv);
    check_run_options(options);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, or the error and a pointer to --help
    return code == 0 ? 0 : 2;
  } catch (const Error& e) {
    logging::error("{}", e.what());
    return 2;
  }
  // An exception on any rank ends every rank of the job (MPI_Abort), naming the rank that failed.
  return distributed::run_rank_main([&] { return train(options); });
}
