// bench_kernels: every memory-bound kernel of a ViT-H/16 training step at batch 64, timed against a
// device-to-device copy of the same bytes in the same run (issue 30).
//
//   build/bin/bench_kernels                     the whole table on the first GPU (well under a minute)
//   build/bin/bench_kernels --filter fp8_cast   only the rows whose kernel, variant or shape contain the text
//   build/bin/bench_kernels --list              the rows and their byte budgets, timing nothing (any machine)
//   build/bin/bench_kernels --json-only         one JSON line per kernel and the summary line, no table
//   build/bin/bench_kernels --profile --filter A --filter B
//                                               each row of A or B run once between cudaProfilerStart
//                                               and cudaProfilerStop, for a profiler started with
//                                               profiling off (ncu --profile-from-start off), untimed
//
// Without a CUDA device, or in a CPU-only build, it says it skipped and exits 0.
//
// The shapes and dtypes are the step's (train_vit --precision bf16 or fp8, apps/train_step.cpp):
// 64 images × 197 tokens = 12,608 rows of width 1280 (MLP 5120, qkv 3840); bf16 activations, bf16
// parameters (LayerNorm's weight and bias too) with f32 master weights and f32 optimizer state; FP8 as
// nn/fp8_linear.cpp casts under the delayed recipe: E4M3 for activations and weights, E5M2 for output
// gradients, each activation or gradient cast writing the row-major copy and the transposed one, a
// gradient cast with its Linear's bias gradient in bf16, a weight cast without amax (the weight's amax is
// its own fp8_amax_ pass). Each row calls the public entry point the step calls (kernels::layernorm_forward,
// kernels::fp8_cast, kernels::sgd_step_multi_, Tensor::to, ...), with its checks, its allocations and
// every launch it makes, so its time is the step's. Nothing is verified here: the tests do that.
//
// How a row is timed:
//   - inputs are random, never zeros; the FP8 scales are fp8_max / 8, so inputs of about unit scale
//     stay in range, and amax slots start at +0, as the step's do;
//   - a row keeps `sets` copies of its inputs and of its latest outputs, with sets × (the row's bytes)
//     at least 4 × the L2 cache, and run i reads copy i mod sets: no run finds in L2 what an earlier run
//     left there (the optimizers, far larger than L2, keep one);
//   - warm-up runs first, untimed and waited for; then the timed runs are queued behind a host gate
//     (cudaLaunchHostFunc holds the stream until they are all queued) with a CUDA event between
//     consecutive runs, so they execute back to back, the host's share (checks, allocation, launch)
//     stays out of them, and a run's time is the interval between its two events. Rows report the median;
//   - the reference is cudaMemcpyAsync device-to-device of bytes/2, which reads bytes/2 and writes
//     bytes/2: it moves the row's bytes, and its GB/s counts both directions as the row's does. It is
//     timed the same way, right after the row, from two 512 MiB regions at rotating offsets (larger
//     copies go as 512 MiB pieces back to back). ratio = copy µs / kernel µs = kernel GB/s ÷ copy
//     GB/s; issue 30's target is 0.75 for every kernel.
//
// The rows themselves are in bench_kernels_cases.cpp (this file times them). The byte budget of each
// row, in the comment beside it there, is what the kernel must move: each input read
// once and each output written once at its dtype (weights, biases, statistics and the FP8 scalars
// included; scratch such as per-tile partial sums not).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/bench_kernels_cases.h"
#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "core/tensor.h"

#if OCTET_HAS_CUDA
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include "core/cuda_stream.h"
#endif

using namespace octet;
using namespace octet::bench;

namespace {

constexpr double kTarget = 0.75;           // issue 30: every kernel at ≥ 0.75 of the copy
constexpr int64_t kLaunchBound = 1 << 20;  // rows under 1 MB measure launches, not bandwidth

// ---- timing (CUDA builds) ---------------------------------------------------------------------------------

#if OCTET_HAS_CUDA

// Holds the stream until the host has queued a batch of runs. Gives up after 2 s, so that an entry point
// that waits for the device (a host sync), or a launch queue too full to take the batch, cannot hang the
// benchmark; the timer then queues every later run without a gate, and those times may include the host's.
struct Gate {
  std::atomic<bool> open{false}, gave_up{false};
};
void CUDART_CB hold_until_open(void* arg) {
  auto* gate = static_cast<Gate*>(arg);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!gate->open.load(std::memory_order_acquire)) {
    if (std::chrono::steady_clock::now() > deadline) {
      gate->gave_up.store(true);
      return;
    }
    std::this_thread::yield();
  }
}

class Timer {
 public:
  Timer(int device, int warmup, int reps) : stream_(octet::cuda::launch_stream(device)), warmup_(warmup), reps_(reps) {
    for (int i = 0; i <= kMaxBatch; ++i) events_.push_back(std::make_unique<octet::cuda::Event>(/*timing=*/true));
  }
  // Microseconds of each timed run of `run`, which makes at most `launches` launches.
  std::vector<double> time(const Run& run, int launches) {
    for (int i = 0; i < warmup_; ++i) run(i);
    octet::cuda::check(cudaStreamSynchronize(stream_), "bench_kernels: warm-up");
    // At most ~256 launches queued behind the gate: a full launch queue would block the host.
    const int batch = std::clamp(kQueuedLaunches / std::max(launches, 1), 1, kMaxBatch);
    std::vector<double> us;
    for (int done = 0; done < reps_;) {
      const int n = std::min(batch, reps_ - done);
      Gate gate;
      if (gated_) {
        octet::cuda::check(cudaLaunchHostFunc(stream_, hold_until_open, &gate), "cudaLaunchHostFunc");
      } else {
        host_paced_ = true;
      }
      try {
        events_[0]->record(stream_);
        for (int k = 0; k < n; ++k) {
          run(warmup_ + done + k);
          events_[static_cast<size_t>(k + 1)]->record(stream_);
        }
      } catch (...) {
        gate.open.store(true, std::memory_order_release);
        cudaStreamSynchronize(stream_);
        throw;
      }
      gate.open.store(true, std::memory_order_release);
      events_[static_cast<size_t>(n)]->synchronize();
      if (gate.gave_up.load()) {
        gated_ = false;
        host_paced_ = true;
        logging::warn(
            "bench_kernels: the stream waited 2 s for the host to queue {} run(s) of {} launch(es); the "
            "remaining runs are queued without a gate, and their times may include the host's",
            n, launches);
      }
      for (int k = 0; k < n; ++k) {
        us.push_back(1e3 * events_[static_cast<size_t>(k + 1)]->elapsed_ms(*events_[static_cast<size_t>(k)]));
      }
      done += n;
    }
    return us;
  }
  // Whether some run since the last call was queued without a gate, or behind one that gave up.
  bool take_host_paced() { return std::exchange(host_paced_, false); }

 private:
  static constexpr int kMaxBatch = 32, kQueuedLaunches = 256;
  cudaStream_t stream_;
  int warmup_, reps_;
  std::vector<std::unique_ptr<octet::cuda::Event>> events_;
  bool gated_ = true, host_paced_ = false;
};

// cudaMemcpyAsync device to device between two 512 MiB regions: a copy of bytes/2 moves `bytes`.
class CopyReference {
 public:
  static constexpr int64_t kRegion = int64_t{512} << 20;
  explicit CopyReference(Device device)
      : src_(empty({kRegion}, DType::u8, device)),
        dst_(empty({kRegion}, DType::u8, device)),
        stream_(octet::cuda::current_stream(device.index)) {
    src_.fill_(1.0);
    dst_.zero_();
  }
  // Copies bytes/2 (rounded down to 16, at least 16) per run, from an offset that moves on by the copy's size every
  // run (wrapping around the region), in pieces of at most the region.
  Run copying(int64_t bytes) const {
    const int64_t half = std::max<int64_t>(16, bytes / 2 / 16 * 16);
    auto* src = static_cast<const char*>(src_.data_ptr());
    auto* dst = static_cast<char*>(dst_.data_ptr());
    cudaStream_t stream = stream_;
    return [=](int64_t i) {
      for (int64_t left = half; left > 0;) {
        const int64_t piece = std::min(left, kRegion);
        const int64_t stride = (piece + 4095) / 4096 * 4096;
        const int64_t offset = piece == kRegion ? 0 : (i * stride) % (kRegion - piece) / 256 * 256;
        octet::cuda::check(
            cudaMemcpyAsync(dst + offset, src + offset, static_cast<size_t>(piece), cudaMemcpyDeviceToDevice, stream),
            "bench_kernels: the reference copy");
        left -= piece;
      }
    };
  }
  static int launches(int64_t bytes) { return static_cast<int>(bytes / 2 / kRegion + 1); }

 private:
  Tensor src_, dst_;
  cudaStream_t stream_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Options {
  int reps = 30, warmup = 3;
  bool json_only = false;
};

// --profile: each row prepared, run once to warm up (its first launch may load the module), then run
// once more with the profiler on. Nothing is timed here: the profiler measures the launches it sees.
int profile_cases(const std::vector<Case>& cases, Device device) {
  for (const Case& c : cases) {
    const Run run = c.prepare(2);
    run(0);
    octet::cuda::synchronize(device.index);
    octet::cuda::check(cudaProfilerStart(), "cudaProfilerStart");
    run(1);
    octet::cuda::synchronize(device.index);
    octet::cuda::check(cudaProfilerStop(), "cudaProfilerStop");
    std::printf("profiled: %s (%lld bytes in its budget)\n", c.label().c_str(), static_cast<long long>(c.bytes));
    std::fflush(stdout);
  }
  return 0;
}

int time_cases(const std::vector<Case>& cases, Device gpu, const Options& o) {
  const int device = gpu.index;
  cudaDeviceProp props{};
  octet::cuda::check(cudaGetDeviceProperties(&props, device), "cudaGetDeviceProperties");
  const int64_t l2 = props.l2CacheSize;
  Timer timer(device, o.warmup, o.reps);
  const CopyReference copy(gpu);

  // The copy's own rate, the ceiling the rows are held to.
  const double peak_copy_us = median(timer.time(copy.copying(CopyReference::kRegion), 1));
  timer.take_host_paced();
  const bool text = !o.json_only;
  if (text) {
    std::printf(
        "bench_kernels: the memory-bound kernels of a ViT-H/16 training step at batch 64: %lld tokens of width "
        "%lld (MLP %lld, qkv %lld), bf16 activations\n",
        static_cast<long long>(kRows), static_cast<long long>(kWidth), static_cast<long long>(kHidden),
        static_cast<long long>(kQkv));
    std::printf(
        "device: %s, %d SMs, L2 %.1f MB, %.1f GiB; a %lld MiB device-to-device copy moves %.0f GB/s "
        "(read + written)\n",
        props.name, props.multiProcessorCount, static_cast<double>(l2) / 1e6,
        static_cast<double>(props.totalGlobalMem) / (1 << 30), static_cast<long long>(CopyReference::kRegion >> 21),
        static_cast<double>(CopyReference::kRegion) / peak_copy_us / 1e3);
    std::printf(
        "µs: the median of %d runs after %d warm-ups, CUDA events between runs that execute back to back; a "
        "row's inputs rotate over `sets` copies (sets x bytes >= 4 x L2): no run reads from L2 what an earlier "
        "run left there\n",
        o.reps, o.warmup);
    std::printf(
        "MB: the byte budget, each input read once and each output written once (1 MB = 1e6 bytes); GB/s = "
        "bytes / time\n");
    std::printf(
        "copy: cudaMemcpyAsync device-to-device of bytes/2 in the same run, which reads bytes/2 and writes "
        "bytes/2: the same bytes moved, its GB/s counted the same way; ratio = copy µs / kernel µs = kernel "
        "GB/s / copy GB/s (target %.2f)\n\n",
        kTarget);
    // "µs" is one column wide and two bytes long: its fields are one wider.
    std::printf("%-28s %-36s %-26s %10s %9s %7s %10s %7s %6s %4s\n", "kernel", "variant", "shape", "µs", "MB", "GB/s",
                "copy µs", "copy", "ratio", "sets");
  }

  std::vector<nlohmann::json> rows;
  double worst = 1e300;
  std::string worst_label;
  int counted = 0, under = 0, launch_bound = 0, gemms = 0;
  for (const Case& c : cases) {
    const int64_t sets = c.one_set ? 1 : std::clamp<int64_t>((4 * l2 + c.bytes - 1) / c.bytes, 2, 64);
    std::vector<double> us, copy_us;
    {
      const Run run = c.prepare(sets);
      us = timer.time(run, c.launches);
    }  // the row's inputs and outputs go back to the pool before the next row
    copy_us = timer.time(copy.copying(c.bytes), CopyReference::launches(c.bytes));
    const bool host_paced = timer.take_host_paced();
    const double t = median(us), tc = median(copy_us);
    const double gbps = static_cast<double>(c.bytes) / t / 1e3, copy_gbps = static_cast<double>(c.bytes) / tc / 1e3;
    const double ratio = tc / t;
    const bool tiny = c.bytes < kLaunchBound;
    if (tiny) {
      ++launch_bound;
    } else if (c.gemm) {
      ++gemms;
    } else {
      ++counted;
      if (ratio < kTarget) ++under;
      if (ratio < worst) worst = ratio, worst_label = c.label();
    }
    if (text) {
      std::printf("%-28s %-36s %-26s %9.1f %9.2f %7.0f %9.1f %7.0f %6.2f %4lld%s%s\n", c.kernel.c_str(),
                  c.variant.c_str(), c.shape.c_str(), t, static_cast<double>(c.bytes) / 1e6, gbps, tc, copy_gbps, ratio,
                  static_cast<long long>(sets),
                  tiny     ? "  (launch-bound: not counted)"
                  : c.gemm ? "  (GEMM: compute-bound, not counted)"
                           : "",
                  host_paced ? "  (host-paced: may include host time)" : "");
      std::fflush(stdout);
    }
    rows.push_back({{"bench", "bench_kernels"},
                    {"kernel", c.kernel},
                    {"variant", c.variant},
                    {"shape", c.shape},
                    {"us", t},
                    {"us_min", *std::min_element(us.begin(), us.end())},
                    {"bytes", c.bytes},
                    {"gbps", gbps},
                    {"copy_us", tc},
                    {"copy_gbps", copy_gbps},
                    {"ratio", ratio},
                    {"runs", us.size()},
                    {"sets", sets},
                    {"launch_bound", tiny},
                    {"gemm", c.gemm},
                    {"host_paced", host_paced}});
  }
  if (text) std::printf("\n");
  for (const nlohmann::json& row : rows) std::printf("%s\n", row.dump().c_str());
  if (text && counted > 0) {
    std::printf("worst ratio %.2f (%s); %d of %d kernels under the %.2f target (%d launch-bound row%s, %d GEMM "
                "row%s not counted)\n",
                worst, worst_label.c_str(), under, counted, kTarget, launch_bound, launch_bound == 1 ? "" : "s", gemms,
                gemms == 1 ? "" : "s");
  }
  const nlohmann::json summary = {{"bench", "bench_kernels"},
                                  {"summary", true},
                                  {"device", props.name},
                                  {"kernels", counted},
                                  {"under_target", under},
                                  {"target", kTarget},
                                  {"worst_ratio", counted > 0 ? nlohmann::json(worst) : nlohmann::json(nullptr)},
                                  {"worst", worst_label},
                                  {"copy_gbps", static_cast<double>(CopyReference::kRegion) / peak_copy_us / 1e3}};
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}

#endif  // OCTET_HAS_CUDA

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "bench_kernels: the memory-bound kernels of a ViT-H/16 training step (batch 64) against a "
      "device-to-device copy of the same bytes"};
  std::vector<std::string> filters;
  int reps = 30, warmup = 3;
  bool json_only = false, list = false, profile = false;
  app.add_option("--filter", filters,
                 "only the rows whose label (kernel, variant and shape, as --list shows them) contains this text; "
                 "repeat it for the rows that match any");
  app.add_option("--reps", reps, "timed runs per row (the median is reported)")
      ->check(CLI::Range(20, 1000))
      ->capture_default_str();
  app.add_option("--warmup", warmup, "untimed runs first")->check(CLI::Range(1, 100))->capture_default_str();
  app.add_flag("--json-only", json_only, "print only the JSON lines (one per row, then the summary)");
  app.add_flag("--list", list, "list the rows and their byte budgets without timing anything (no GPU needed)");
  app.add_flag("--profile", profile,
               "run each row once more between cudaProfilerStart and cudaProfilerStop, untimed, for a profiler "
               "started with profiling off (ncu --profile-from-start off)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // Without a device there is nothing to time (--list needs none).
#if OCTET_HAS_CUDA
  const char* no_device = cuda::is_available() ? nullptr : "this CUDA build sees no GPU";
#else
  const char* no_device = "this is a CPU-only build";
#endif
  if (no_device != nullptr && !list) {
    std::printf("bench_kernels: skipped: no CUDA device/build (%s)\n", no_device);
    return 0;
  }
  try {
    const Device gpu = Device::cuda(0);
    const auto ws = make_workspace(gpu);
    std::vector<Case> cases;
    for (Case& c : step_cases(ws)) {
      const bool match = filters.empty() || std::any_of(filters.begin(), filters.end(), [&](const std::string& f) {
                           return c.label().find(f) != std::string::npos;
                         });
      if (match) cases.push_back(std::move(c));
    }
    if (cases.empty()) {
      std::string given;
      for (const std::string& f : filters) given += " '" + f + "'";
      logging::error("bench_kernels: no row matches --filter{}; --list shows them", given);
      return 2;
    }
    if (list) {
      std::printf("%-28s %-36s %-26s %14s\n", "kernel", "variant", "shape", "bytes");
      for (const Case& c : cases) {
        std::printf("%-28s %-36s %-26s %14lld\n", c.kernel.c_str(), c.variant.c_str(), c.shape.c_str(),
                    static_cast<long long>(c.bytes));
      }
      return 0;
    }
#if OCTET_HAS_CUDA
    if (profile) return profile_cases(cases, gpu);
    return time_cases(cases, gpu, {.reps = reps, .warmup = warmup, .json_only = json_only});
#else
    return 0;  // not reached: a CPU-only build skipped above
#endif
  } catch (const std::exception& e) {
    logging::error("{}", e.what());
    return 1;
  }
}
