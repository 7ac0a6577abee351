// bench_vit: training throughput of a ViT config on a GPU or the CPU.
//
//   build/bin/bench_vit --device cuda --model vit_huge_patch16_224 --batch-size 64 --precision bf16
//   build/bin/bench_vit --device cuda --model vit_huge_patch16_224 --batch-size 64 --precision fp8
//   build/bin/bench_vit --device cpu                       the Fashion-MNIST model, batch 128
//   build/bin/bench_vit --device cpu --model vit_tiny_patch16_224 --batch-size 8
//   build/bin/bench_vit --device cuda --model vit_huge_patch16_224 --batch-size 64 --recompute blocks
//   build/bin/bench_vit --device cuda --model vit_huge_patch16_224 --batch-size 64 --precision bf16
//       --bias-grad epilogue                                     (the GPU kernel design still on trial)
//
// One step is train_vit's (apps/train_step.h) in one process: forward, cross-entropy, backward and
// the optimizer (SGD with momentum 0.9 by default, as the PyTorch comparator
// bench/pytorch_reference.py runs it), without gradient clipping, on synthetic images and labels made
// once on the device. Under --precision fp8 the forward runs inside an Fp8Autocast scope with the
// --fp8-* recipe (the FLOP count is the same; only the GEMMs' precision changes). It prints the
// median step time, images/s, achieved TFLOP/s, MFU and peak memory, then the same figures as one
// JSON line (tools/gpu_check.sh builds its table from it), with the bytes of activations the forward
// saved for backward (StepResult::saved_activation_bytes; --recompute blocks keeps each block's input).
//
// FLOPs come from the config: flops_per_image_forward() counts the model's GEMM and
// attention-matmul FLOPs; a training image costs three times that (backward's two GEMMs per forward
// GEMM). Time spent elsewhere (layernorm, GELU, softmax, copies, the optimizer) is the gap to peak.
// Timing uses CUDA events on the GPU and steady_clock on the CPU, where the step is also compared
// with OpenBLAS's sgemm measured in the same run (the ceiling a CPU step can approach). On the GPU it
// also prints how long the host took to queue a step and how far ahead of the GPU that left it
// (`host:`), and --head-start MS holds each step's work on the stream while the host queues it, so
// that a run with it against one without says how long the GPU waited on launches. Both print the
// wall-clock window of their timed steps, which the GPU check matches with its samples of the GPU's
// clocks and power (tools/gpu_clocks.py).
#include <cblas.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "apps/flag_checks.h"
#include "apps/fp8_flags.h"
#include "apps/autotune_flag.h"
#include "apps/kernel_design_flags.h"
#include "apps/train_step.h"
#include "core/cuda_memory.h"
#include "core/error.h"
#include "core/log.h"
#include "core/op_ledger.h"
#include "core/random.h"
#include "data/loader.h"
#include "kernels/threads.h"
#include "models/vit.h"
#include "nn/fp8.h"
#include "nn/layers.h"
#include "optim/optim.h"

#if OCTET_HAS_CUDA
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include "core/cuda_stream.h"
#endif

using namespace octet;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

#if OCTET_HAS_CUDA
// --head-start: a host function at the head of each step's work holds the stream for that many
// milliseconds, so the host queues that much of the step before the GPU starts it.
void CUDART_CB hold_stream(void* milliseconds) {
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(*static_cast<const double*>(milliseconds)));
}
#endif

// The wall clock, to match the timed steps with samples taken outside the program (the GPU check
// samples the GPU's clocks and power with nvidia-smi while the benchmarks run).
double epoch_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// OpenBLAS sgemm on C[m,n] = A[m,k]·B[n,k]ᵀ (the layout of a Linear's forward), median of `reps`.
double sgemm_gflops(int64_t m, int64_t n, int64_t k, int reps) {
  const kernels::OpenBlasThreads blas_threads(kernels::num_threads());  // OpenBLAS as it runs on its own
  Generator gen(7);
  const Tensor a = randn({m, k}, gen), b = randn({n, k}, gen), c = zeros({m, n});
  std::vector<double> times;
  for (int r = 0; r < reps + 2; ++r) {
    const auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, a.data<float>(), static_cast<int>(k), b.data<float>(), static_cast<int>(k),
                0.0f, c.data<float>(), static_cast<int>(n));
    if (r >= 2) times.push_back(seconds(t0, Clock::now()));
  }
  return 2.0 * static_cast<double>(m * n * k) / median(times) / 1e9;
}

// Four marks per step (start, after forward, after backward, after the optimizer), read as three
// intervals once the step is done: CUDA events on a GPU, whose work the host only queues; the host
// clock on the CPU. On a GPU the host clock is read at the marks too: it says how long the host took
// to queue each phase, which is how far ahead of the GPU it ran (the step makes no host sync).
class StepMarks {
 public:
  explicit StepMarks(Device device) : device_(device) {
#if OCTET_HAS_CUDA
    if (device.is_cuda()) {
      cuda::DeviceGuard guard(device.index);
      for (int i = 0; i < 4; ++i) events_.push_back(std::make_unique<cuda::Event>(/*timing=*/true));
    }
#endif
  }
  void mark(int i) {
    times_[static_cast<size_t>(i)] = Clock::now();
#if OCTET_HAS_CUDA
    if (device_.is_cuda()) events_[static_cast<size_t>(i)]->record(cuda::current_stream(device_.index));
#endif
  }
  // Seconds of forward, backward and optimizer; waits for the step on a GPU.
  std::array<double, 3> intervals() {
#if OCTET_HAS_CUDA
    if (device_.is_cuda()) {
      std::array<double, 3> out{};
      events_[3]->synchronize();
      for (size_t i = 0; i < 3; ++i) out[i] = 1e-3 * events_[i + 1]->elapsed_ms(*events_[i]);
      return out;
    }
#endif
    return host_intervals();
  }
  // Seconds the host spent between the marks: on a GPU, queuing each phase.
  std::array<double, 3> host_intervals() const {
    std::array<double, 3> out{};
    for (size_t i = 0; i < 3; ++i) out[i] = seconds(times_[i], times_[i + 1]);
    return out;
  }

 private:
  Device device_;
  std::array<Clock::time_point, 4> times_{};
#if OCTET_HAS_CUDA
  std::vector<std::unique_ptr<cuda::Event>> events_;
#endif
};

std::string device_name(Device device) {
#if OCTET_HAS_CUDA
  if (device.is_cuda()) {
    cudaDeviceProp props{};
    cuda::check(cudaGetDeviceProperties(&props, device.index), "cudaGetDeviceProperties");
    return props.name;
  }
#endif
  return "cpu";
}

// Dense tensor-core peaks from NVIDIA's H100/H200 datasheets (SXM: bf16 989 TFLOP/s, fp32 without
// tensor cores 67; H100 PCIe: 756 and 51). 0 = unknown: pass --peak-tflops to get an MFU.
double default_peak_tflops(const std::string& name, const std::string& precision) {
  const bool hopper = name.find("H100") != std::string::npos || name.find("H200") != std::string::npos;
  if (!hopper) return 0;
  const bool pcie = name.find("PCIe") != std::string::npos;
  // FP8 GEMMs peak at twice bf16, but layernorm, attention and the loss stay bf16: the bf16 peak is
  // the honest yardstick for a whole step (MFU then says how much faster than bf16 it goes).
  if (precision == "bf16" || precision == "fp8") return pcie ? 756 : 989;
  return pcie ? 51 : 67;
}

// What one benchmark run trains: the model in --precision on the device, its optimizer, and one
// batch of synthetic images and labels, made once and kept on the device (the benchmark measures
// the step, not the input pipeline).
struct RunSpec {
  models::ViTConfig config;
  std::string precision, optimizer_name;
  int64_t batch_size;
  Device device;
  bool recompute = false;  // --recompute blocks
};
struct Run {
  Generator gen{0};  // the model's Dropout and DropPath modules keep it: it must outlive them
  std::unique_ptr<models::VisionTransformer> model;
  std::unique_ptr<optim::Optimizer> optimizer;
  data::Batch batch;

  explicit Run(const RunSpec& spec) {
    const models::ViTConfig& config = spec.config;
    model = std::make_unique<models::VisionTransformer>(config, /*initialize=*/true, &gen);
    if (spec.precision == "bf16" || spec.precision == "fp8") model->to(DType::bf16);
    model->to(spec.device);
    for (const auto& block : model->transformer_blocks()) block->recompute = spec.recompute;
    if (spec.optimizer_name == "sgd") {
      optimizer = std::make_unique<optim::SGD>(model->parameters(), 1e-3, 0.9);
    } else {
      optimizer = std::make_unique<optim::AdamW>(optim::weight_decay_groups(model->named_parameters(), 1e-3, 0.05),
                                                 1e-3);
    }
    const int64_t b = spec.batch_size;
    batch.images = randn({b, config.in_chans, config.img_size, config.img_size}, gen).to(spec.device);
    std::vector<int64_t> label_values(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) label_values[static_cast<size_t>(i)] = i % config.num_classes;
    batch.labels = from_vector(label_values, {b}, DType::i64, spec.device);
  }
};

// The op ledgers (core/op_ledger.h) of one training step (the second: the first may differ, e.g.
// FP8's first scales) of the spec's model with `depth` blocks: forward + backward, and the optimizer.
struct StepLedger {
  OpTallies forward_backward, optimizer;
};
StepLedger ledger_of_step(RunSpec spec, int64_t depth, const nn::Fp8Recipe& fp8_recipe) {
  spec.config.depth = depth;
  Run run(spec);
  std::unique_ptr<OpLedger> optimizer_ledger;  // takes over from `ledger` once backward is done
  const TrainStep train_step{.model = *run.model,
                             .criterion = nn::CrossEntropyLoss(),
                             .optimizer = *run.optimizer,
                             .backward = [](const Tensor& loss, bool) { loss.backward(); },
                             .fp8 = spec.precision == "fp8",
                             .fp8_recipe = fp8_recipe,
                             .hooks = {.after_backward = [&] { optimizer_ledger = std::make_unique<OpLedger>(); }}};
  train_step([&] { return run.batch; });
  optimizer_ledger.reset();
  OpLedger ledger;
  train_step([&] { return run.batch; });
  StepLedger out{ledger.ops(), optimizer_ledger->ops()};
  optimizer_ledger.reset();
  return out;
}

// --ledger: one block's forward + backward (a depth-2 step minus a depth-1 step: the same stem,
// head and loss, one block more), and a whole step's, optimizer included (the depth-1 step plus
// depth - 1 blocks, each with its parameters' share of the optimizer), per image. Counting needs
// no full-depth model, so ViT-Huge counts on the CPU at a small batch.
int print_ledger(const RunSpec& spec, const nn::Fp8Recipe& fp8_recipe) {
  const StepLedger one = ledger_of_step(spec, 1, fp8_recipe), two = ledger_of_step(spec, 2, fp8_recipe);
  const OpTallies block = ledger_difference(two.forward_backward, one.forward_backward);
  const OpTallies block_optimizer = ledger_difference(two.optimizer, one.optimizer);
  const int64_t more = spec.config.depth - 1;
  const OpTallies step =
      ledger_plus(ledger_plus(ledger_plus(one.forward_backward, block, more), one.optimizer), block_optimizer, more);
  const double images = static_cast<double>(spec.batch_size);
  std::printf("op ledger: model %s (depth %lld), %s, %s, batch %lld, on %s\n", spec.config.name.c_str(),
              static_cast<long long>(spec.config.depth), spec.precision.c_str(), spec.optimizer_name.c_str(),
              static_cast<long long>(spec.batch_size), spec.device.str().c_str());
  std::printf("\none transformer block, forward + backward (calls per step; bytes and FLOPs per image):\n");
  std::printf("%s", ledger_table(block, images).c_str());
  std::printf("\none training step, %lld blocks, with the loss and the optimizer (calls per step; bytes and FLOPs "
              "per image):\n",
              static_cast<long long>(spec.config.depth));
  std::printf("%s", ledger_table(step, images).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_vit: ViT training throughput (images/s, TFLOP/s, MFU, peak memory)"};
  app.failure_message(explain_parse_error);
  std::string model_name = "vit_fashion_mnist", device_flag = "auto", precision = "fp32", optimizer_name = "sgd";
  int64_t batch_size = 128;
  int steps = 20, warmup = 3, threads = 0;
  double peak_tflops = -1;
  Fp8Options fp8_options;
  app.add_option("--model", model_name, "model config")->check(CLI::IsMember(models::vit_config_names()))
      ->capture_default_str();
  app.add_option("--device", device_flag, "auto (the first GPU if there is one), cpu, cuda or cuda:N")
      ->capture_default_str();
  app.add_option("--precision", precision,
                 "fp32, bf16 (bf16 model, f32 master weights), or fp8 (the bf16 model with the blocks' Linears "
                 "in FP8 under the --fp8-* recipe)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp8"}))->capture_default_str();
  add_fp8_flags(app, fp8_options);
  app.add_option("--batch-size", batch_size, "images per step")->transform(whole_at_least(1))->capture_default_str();
  app.add_option("--steps", steps, "timed steps")->transform(whole_at_least(1, INT_MAX))->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->transform(whole_at_least(0, INT_MAX))->capture_default_str();
  app.add_option("--optimizer", optimizer_name, "sgd (momentum 0.9, as the PyTorch reference) or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}))->capture_default_str();
  app.add_option("--peak-tflops", peak_tflops,
                 "the device's peak for MFU (default: NVIDIA's datasheet figure for an H100/H200, dense bf16 989 "
                 "TFLOP/s or fp32 67 on SXM, 756/51 on PCIe; none for other devices)")
      ->check(number_above(0));
  app.add_option("--threads", threads, "CPU threads (default: every core)")->transform(whole_at_least(0, INT_MAX));
  std::string gelu = "erf";
  app.add_option("--gelu", gelu,
                 "the MLPs' GELU: erf (timm's ViTs) or tanh (computed in fc1's GEMM epilogue on the GPU in bf16)")
      ->check(CLI::IsMember({"erf", "tanh"}))->capture_default_str();
  std::string autotune = "off";
  add_autotune_flag(app, autotune);
  KernelDesignFlags designs;
  add_kernel_design_flags(app, designs);
  std::string recompute = "none";
  app.add_option("--recompute", recompute, "none, or blocks: activation recompute (each block reruns in backward)")
      ->check(CLI::IsMember({"none", "blocks"}))->capture_default_str();
  bool ledger = false;
  app.add_flag("--ledger", ledger,
               "count what a step moves instead of timing it: the op ledger per block and per step, per image");
  double head_start_ms = 0;
  app.add_option("--head-start", head_start_ms,
                 "GPU only: hold each step's work on the stream for this many milliseconds while the host queues "
                 "it, so the GPU starts with a queue already filled; against a run without it, the difference is "
                 "the time the GPU spent waiting on the host's launches")
      ->check(number_between(0, 1000))->capture_default_str();
  bool profile_last_step = false;
  app.add_flag("--profile-last-step", profile_last_step,
               "bracket the last step with cudaProfilerStart/Stop, so that a profiler started with profiling off "
               "(ncu --profile-from-start off) sees one steady-state step: not the first, whose one-off work "
               "(master weights, FP8 state, momentum buffers) a step never repeats");
  try {
    app.parse(argc, argv);
    check_fp8_options(precision, fp8_options);
    apply_fp8_switches(fp8_options);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const Error& e) {
    logging::error("{}", e.what());
    return 2;
  }
  try {
    if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    kernels::set_num_threads(threads);
    const Device device = device_flag == "auto" ? (cuda::is_available() ? Device::cuda(0) : Device::cpu())
                                                : Device::parse(device_flag);
    OCTET_CHECK(device.is_cpu() || cuda::is_available(), "bench_vit: --device ", device.str(),
                " but no CUDA device is visible (or this build has no CUDA); pass --device cpu");
    OCTET_CHECK(head_start_ms == 0 || device.is_cuda(), "bench_vit: --head-start ", head_start_ms,
                " holds a GPU stream, and the run is on ", device.str(), "; drop the flag or run on a GPU");
    apply_autotune(autotune, device);
    apply_kernel_design_flags(designs, device);
    const std::string name = device_name(device);
    if (peak_tflops < 0) peak_tflops = default_peak_tflops(name, precision);

    models::ViTConfig config = models::vit_config(model_name);
    config.gelu = models::vit_gelu(gelu);
    const bool fp8 = precision == "fp8";
    const nn::Fp8Recipe fp8_recipe = fp8_recipe_from(fp8_options);
    const RunSpec spec{config, precision, optimizer_name, batch_size, device, recompute == "blocks"};
    if (ledger) return print_ledger(spec, fp8_recipe);
    Run run(spec);
    models::VisionTransformer& model = *run.model;
    const std::unique_ptr<optim::Optimizer>& optimizer = run.optimizer;
    const data::Batch& batch = run.batch;

    std::vector<double> forward_s, backward_s, optimizer_s, step_s;
    std::vector<double> host_forward_s, host_backward_s, host_step_s;  // queuing, on a GPU
    double timed_from = 0, timed_to = 0;  // the timed steps, in seconds since the epoch
    StepMarks marks(device);
    // The marks split the step into forward (with the FP8 scales' update as its scope ends), backward
    // and optimizer (step and zero_grad).
    const TrainStep train_step{.model = model,
                               .criterion = nn::CrossEntropyLoss(),
                               .optimizer = *optimizer,
                               .backward = [](const Tensor& loss, bool /*last_micro_batch*/) { loss.backward(); },
                               .fp8 = fp8,
                               .fp8_recipe = fp8_recipe,
                               .hooks = {.after_forward = [&] { marks.mark(1); },
                                         .after_backward = [&] { marks.mark(2); }},
                               .held_bytes = [&] {
                                 return nn::fp8_weight_cast_bytes(model) + nn::fp8_scaling_bytes(model);
                               }};
    Tensor loss;
    int64_t saved_activations = 0;  // the last step's
    const bool profile = profile_last_step && device.is_cuda();
    if (profile_last_step && !profile) {
      logging::warn("--profile-last-step brackets a GPU step for a GPU profiler; on {} it does nothing", device.str());
    }
    for (int s = 0; s < warmup + steps; ++s) {
      const bool profiled = profile && s == warmup + steps - 1;
#if OCTET_HAS_CUDA
      if (profiled) {
        cuda::synchronize(device.index);
        cuda::check(cudaProfilerStart(), "cudaProfilerStart");
      }
#endif
      if (s == warmup) timed_from = epoch_seconds();
#if OCTET_HAS_CUDA
      if (head_start_ms > 0) {
        cuda::check(cudaLaunchHostFunc(cuda::current_stream(device.index), hold_stream, &head_start_ms),
                    "cudaLaunchHostFunc (bench_vit --head-start)");
      }
#endif
      marks.mark(0);
      const StepResult result = train_step([&] { return batch; });
      loss = result.loss, saved_activations = result.saved_activation_bytes;
      marks.mark(3);
      const std::array<double, 3> t = marks.intervals();
      const std::array<double, 3> host = marks.host_intervals();
#if OCTET_HAS_CUDA
      if (profiled) cuda::check(cudaProfilerStop(), "cudaProfilerStop");
#endif
      if (s < warmup) continue;
      forward_s.push_back(t[0]), backward_s.push_back(t[1]), optimizer_s.push_back(t[2]);
      step_s.push_back(t[0] + t[1] + t[2]);
      host_forward_s.push_back(host[0]), host_backward_s.push_back(host[1]);
      host_step_s.push_back(host[0] + host[1] + host[2]);
    }
    timed_to = epoch_seconds();
    const double last_loss = loss.item();
    OCTET_CHECK(std::isfinite(last_loss), "bench_vit: the loss became ", last_loss,
                "; the step is broken, the timings mean nothing");

    const double step = median(step_s);
    const double flops_per_image = 3.0 * model.flops_per_image_forward();
    const double images_per_s = static_cast<double>(batch_size) / step;
    const double tflops = flops_per_image * images_per_s / 1e12;
    const double mfu = peak_tflops > 0 ? tflops / peak_tflops : 0;
    const cuda_memory::MemoryStats memory =
        device.is_cuda() ? cuda_memory::memory_stats(device.index) : cuda_memory::MemoryStats{};
    const double gib = 1024.0 * 1024.0 * 1024.0;

    const std::string precision_text = fp8 ? "fp8 " + fp8_recipe.describe() : precision;
    const std::string chosen_designs = designs.describe().empty() ? "" : ", kernel designs " + designs.describe();
    char head_start_text[96] = "";
    if (head_start_ms > 0) {
      std::snprintf(head_start_text, sizeof head_start_text,
                    ", each step held %.4g ms on the stream while queued (--head-start)", head_start_ms);
    }
    std::printf("model %s (GELU %s), batch %lld, %s, %s, %s%s%s%s, %lld parameters\n", config.name.c_str(),
                gelu.c_str(), static_cast<long long>(batch_size), precision_text.c_str(), optimizer_name.c_str(),
                device.is_cuda() ? (device.str() + " (" + name + ")").c_str()
                                 : ("cpu, " + std::to_string(threads) + " thread(s)").c_str(),
                autotune == "on" ? ", cuBLASLt and cuDNN candidates timed (--autotune on)" : "",
                chosen_designs.c_str(), head_start_text, static_cast<long long>(model.num_parameters()));
    std::printf("%.4g GFLOP per training image (3x forward)%s\n", flops_per_image / 1e9,
                config.name == "vit_huge_patch16_224" ? "; the issue's figure for this model: 764" : "");
    std::printf("step %.2f ms (forward %.2f, backward %.2f, optimizer %.2f; medians of %d)\n", 1e3 * step,
                1e3 * median(forward_s), 1e3 * median(backward_s), 1e3 * median(optimizer_s), steps);
    if (device.is_cuda()) {
      // How far ahead of the GPU the host ran: the GPU starts the step when the host queues its first
      // kernel (with --head-start, that much later) and runs idle whenever it catches up, so a lead
      // near zero (or below) means launches, not kernels, set the pace there.
      const double forward_lead = 1e-3 * head_start_ms + median(forward_s) - median(host_forward_s);
      const double step_lead = 1e-3 * head_start_ms + step - median(host_step_s);
      std::printf("host: queued a step in %.2f ms (forward %.2f, backward %.2f; medians); done queuing %.2f ms "
                  "before the GPU finished the forward and %.2f ms before it finished the step\n",
                  1e3 * median(host_step_s), 1e3 * median(host_forward_s), 1e3 * median(host_backward_s),
                  1e3 * forward_lead, 1e3 * step_lead);
    }
    std::printf("timed steps: %.3f to %.3f s since the epoch\n", timed_from, timed_to);
    if (device.is_cuda()) {
      std::printf("training: %.1f images/s, %.1f TFLOP/s", images_per_s, tflops);
    } else {
      std::printf("training: %.1f images/s, %.2f GFLOP/s", images_per_s, 1e3 * tflops);
    }
    if (mfu > 0) {
      std::printf(", MFU %.1f%% of %.0f TFLOP/s\n", 100 * mfu, peak_tflops);
    } else {
      std::printf(" (no MFU: unknown peak, pass --peak-tflops)\n");
    }
    const int64_t block_input = batch_size * (model.num_patches() + 1) * config.embed_dim *
                                static_cast<int64_t>(dtype_size(precision == "fp32" ? DType::f32 : DType::bf16));
    std::printf("activations saved for backward: %.1f MB, %.2f block inputs per block (--recompute %s)\n",
                static_cast<double>(saved_activations) / 1e6,
                static_cast<double>(saved_activations) / static_cast<double>(block_input * config.depth),
                recompute.c_str());
    if (device.is_cuda()) {
      std::printf("memory: peak %.2f GiB in use, %.2f GiB reserved at peak\n", memory.peak / gib,
                  memory.reserved_peak / gib);
    } else {
      const int64_t tokens = model.num_patches() + 1;
      const auto hidden = static_cast<int64_t>(static_cast<double>(config.embed_dim) * config.mlp_ratio);
      const double gemm_model = sgemm_gflops(batch_size * tokens, hidden, config.embed_dim, 10);
      const double gemm_square = sgemm_gflops(1024, 1024, 1024, 10);
      const double achieved = 1e3 * tflops;
      std::printf("OpenBLAS sgemm at the model's fc1 shape %lldx%lldx%lld: %.1f GFLOP/s -> ratio %.3f\n",
                  static_cast<long long>(batch_size * tokens), static_cast<long long>(hidden),
                  static_cast<long long>(config.embed_dim), gemm_model, achieved / gemm_model);
      std::printf("OpenBLAS sgemm at 1024x1024x1024: %.1f GFLOP/s -> ratio %.3f\n", gemm_square,
                  achieved / gemm_square);
    }
    const nlohmann::json summary = {
        {"bench", "octet"},
        {"model", config.name},
        {"device", name},
        {"precision", precision},
        {"gelu", gelu},
        {"autotune", autotune == "on"},
        {"bias_grad", designs.bias_grad},
        {"fp8_recipe", fp8 ? nlohmann::json(fp8_recipe.describe()) : nlohmann::json(nullptr)},
        {"optimizer", optimizer_name},
        {"batch_size", batch_size},
        {"steps", steps},
        {"step_ms", 1e3 * step},
        {"images_per_s", images_per_s},
        {"tflops", tflops},
        {"mfu", peak_tflops > 0 ? nlohmann::json(mfu) : nlohmann::json(nullptr)},
        {"peak_tflops", peak_tflops > 0 ? nlohmann::json(peak_tflops) : nlohmann::json(nullptr)},
        {"peak_memory_gib", device.is_cuda() ? nlohmann::json(memory.peak / gib) : nlohmann::json(nullptr)},
        {"gflop_per_image", flops_per_image / 1e9},
        {"recompute", recompute},
        {"saved_activations_bytes", saved_activations},
        {"loss", last_loss},
        {"host_queue_ms", device.is_cuda() ? nlohmann::json(1e3 * median(host_step_s)) : nlohmann::json(nullptr)},
        {"head_start_ms", head_start_ms},
        {"timed_from", timed_from},
        {"timed_to", timed_to},
    };
    std::printf("%s\n", summary.dump().c_str());
  } catch (const std::exception& e) {
    logging::error("{}", e.what());
    return 1;
  }
  return 0;
}
