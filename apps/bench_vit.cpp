// bench_vit: training throughput of a ViT config, next to OpenBLAS's own sgemm rate measured in the
// same run (the ceiling a CPU training step can approach: every FLOP of a ViT is in a GEMM).
//
//   build/bin/bench_vit --device cpu                       the Fashion-MNIST model, batch 128
//   build/bin/bench_vit --device cpu --model vit_tiny_patch16_224 --batch-size 8
//
// Achieved GFLOP/s counts the model's GEMM and attention-matmul FLOPs, forward x 3 (forward plus
// backward's two GEMMs per forward GEMM); time spent elsewhere (layernorm, GELU, softmax, copies,
// the optimizer) shows up as the gap to sgemm's rate.
#include <cblas.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/random.h"
#include "kernels/threads.h"
#include "models/vit.h"
#include "nn/layers.h"
#include "optim/optim.h"

using namespace octet;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// OpenBLAS sgemm on C[m,n] = A[m,k]·B[n,k]ᵀ (the layout of a Linear's forward), median of `reps`.
double sgemm_gflops(int64_t m, int64_t n, int64_t k, int reps) {
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_vit: ViT training throughput against OpenBLAS sgemm"};
  std::string model_name = "vit_fashion_mnist", device = "cpu";
  int64_t batch_size = 128;
  int steps = 20, warmup = 3, threads = 0;
  app.add_option("--model", model_name, "model config")->check(CLI::IsMember(models::vit_config_names()))
      ->capture_default_str();
  app.add_option("--device", device, "cpu (cuda comes with the CUDA backend)")->check(CLI::IsMember({"cpu"}))
      ->capture_default_str();
  app.add_option("--batch-size", batch_size, "images per step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (default: every core)")->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    kernels::set_num_threads(threads);
    const models::ViTConfig config = models::vit_config(model_name);
    Generator gen(0);
    models::VisionTransformer model(config, /*initialize=*/true, &gen);
    optim::AdamW optimizer(optim::weight_decay_groups(model.named_parameters(), 1e-3, 0.05), 1e-3);
    nn::CrossEntropyLoss criterion(0.1);
    const Tensor images = randn({batch_size, config.in_chans, config.img_size, config.img_size}, gen);
    std::vector<int64_t> label_values(static_cast<size_t>(batch_size));
    for (int64_t i = 0; i < batch_size; ++i) label_values[static_cast<size_t>(i)] = i % config.num_classes;
    const Tensor labels = from_vector(label_values, {batch_size});

    std::vector<double> forward_s, backward_s, optimizer_s, step_s;
    for (int s = 0; s < warmup + steps; ++s) {
      const auto t0 = Clock::now();
      const Tensor loss = criterion(model(images), labels);
      const auto t1 = Clock::now();
      loss.backward();
      const auto t2 = Clock::now();
      optimizer.step();
      optimizer.zero_grad();
      const auto t3 = Clock::now();
      if (s < warmup) continue;
      forward_s.push_back(seconds(t0, t1)), backward_s.push_back(seconds(t1, t2));
      optimizer_s.push_back(seconds(t2, t3)), step_s.push_back(seconds(t0, t3));
    }

    const int64_t tokens = (config.img_size / config.patch_size) * (config.img_size / config.patch_size) + 1;
    const auto hidden = static_cast<int64_t>(config.embed_dim * config.mlp_ratio);
    const double gemm_model = sgemm_gflops(batch_size * tokens, hidden, config.embed_dim, 10);
    const double gemm_square = sgemm_gflops(1024, 1024, 1024, 10);
    const double step = median(step_s);
    const double flops = 3.0 * model.flops_per_image_forward() * static_cast<double>(batch_size);
    const double achieved = flops / step / 1e9;

    std::printf("model %s, batch %lld, %d thread(s), %lld parameters, %.1f MFLOP per training image\n",
                config.name.c_str(), static_cast<long long>(batch_size), threads,
                static_cast<long long>(model.num_parameters()), 3.0 * model.flops_per_image_forward() / 1e6);
    std::printf("step %.2f ms (forward %.2f, backward %.2f, optimizer %.2f; medians of %d)\n", 1e3 * step,
                1e3 * median(forward_s), 1e3 * median(backward_s), 1e3 * median(optimizer_s), steps);
    std::printf("training: %.0f images/s, %.1f GFLOP/s\n", static_cast<double>(batch_size) / step, achieved);
    std::printf("OpenBLAS sgemm at the model's fc1 shape %lldx%lldx%lld: %.1f GFLOP/s -> ratio %.3f\n",
                static_cast<long long>(batch_size * tokens), static_cast<long long>(hidden),
                static_cast<long long>(config.embed_dim), gemm_model, achieved / gemm_model);
    std::printf("OpenBLAS sgemm at 1024x1024x1024: %.1f GFLOP/s -> ratio %.3f\n", gemm_square, achieved / gemm_square);
  } catch (const std::exception& e) {
    logging::error("{}", e.what());
    return 1;
  }
  return 0;
}
