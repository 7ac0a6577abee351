// FP8 training on the GPU against the CPU emulation (nn/fp8.h): one FP8 Linear, then one full FP8
// training step of a small ViT (bf16 model, delayed scaling, SGD), from the same weights and batch.
//
// What may differ: the GPU accumulates in another order, and its FP8 GEMMs in the tensor cores'
// reduced precision (about 14 bits, promoted to f32 now and then): per element within
// tests/cuda/fp8_bound.h's bound, norm-wise below ~1e-3 at these sizes. So a bf16 value downstream of
// a GEMM can differ by one bf16 rounding, and then its FP8 code by one step at a rounding boundary.
// For one Linear that stays small (the first test). Through a whole step each such step feeds the
// next layers, forward and backward, and the gradients part by several percent: the full-step test
// compares them against the step's own sensitivity (tests/cuda/fp8_sensitivity.h).
// Errors are norm-wise, ||gpu - cpu||_2 / ||cpu||_2 in f64.
// What may not: casts, amaxes and scale updates are exact and identical on both devices, so scales
// computed from identical tensors (every weight's, and a first layer's input) must agree bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "kernels/attention.h"
#include "models/vit.h"
#include "nn/fp8.h"
#include "nn/layers.h"
#include "optim/optim.h"
#include "tests/cuda/attention_paths.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/cuda/fp8_sensitivity.h"
#include "tests/cuda/small_vit.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::random_tensor;
using testing::relative_error;

struct LinearRun {
  Tensor y, dx, dw, db;
  std::vector<double> forward_scales, backward_scales;
};

LinearRun run_linear(Device device, const nn::Fp8Recipe& recipe) {
  auto layer = std::make_shared<nn::Linear>(256, 768);
  layer->weight.copy_(random_tensor({768, 256}, DType::f32, 3, 0.05));
  layer->bias.copy_(random_tensor({768}, DType::f32, 4, 0.05));
  layer->to(DType::bf16);
  layer->to(device);
  Tensor x = random_tensor({4, 197, 256}, DType::bf16, 5).to(device).requires_grad_();
  const Tensor r = random_tensor({4, 197, 768}, DType::bf16, 6, 1e-3).to(device);
  LinearRun out;
  for (int step = 0; step < 2; ++step) {  // the second step runs on the scales the first one set
    layer->zero_grad();
    x.set_grad(Tensor());
    {
      nn::Fp8Autocast fp8(true, recipe);
      out.y = (*layer)(x);
    }
    sum(mul(out.y, r)).backward();
  }
  out.y = out.y.detach().to(Device::cpu());
  out.dx = x.grad().to(Device::cpu());
  out.dw = layer->weight.grad().to(Device::cpu());
  out.db = layer->bias.grad().to(Device::cpu());
  out.forward_scales = layer->fp8_state->forward.scale.to_vector<double>();
  out.backward_scales = layer->fp8_state->backward.scale.to_vector<double>();
  return out;
}

TEST(CudaFp8, LinearMatchesTheCpuEmulationUnderBothRecipes) {
  SKIP_WITHOUT_GPU();
  for (const nn::Fp8Recipe& recipe : {nn::Fp8Recipe(nn::DelayedScaling{.amax_history_len = 4}),
                                      nn::Fp8Recipe(nn::CurrentScaling{})}) {
    SCOPED_TRACE(recipe.describe());
    const LinearRun cpu = run_linear(Device::cpu(), recipe), gpu = run_linear(kGpu, recipe);
    EXPECT_LT(relative_error(gpu.y, cpu.y), 1e-2);
    EXPECT_LT(relative_error(gpu.dx, cpu.dx), 1e-2);
    EXPECT_LT(relative_error(gpu.dw, cpu.dw), 1e-2);
    EXPECT_LT(relative_error(gpu.db, cpu.db), 1e-2);
    // x, W and dy are the same tensors on both devices: their amaxes, so their scales, are identical.
    EXPECT_EQ(gpu.forward_scales, cpu.forward_scales);
    EXPECT_EQ(gpu.backward_scales, cpu.backward_scales);
  }
}

// What one step leaves, by name: "grad:", "param:" (after the SGD step) and "fp8:" (the layers'
// scales and scale_invs) entries, on the CPU.
struct StepResult {
  double loss = 0;
  std::map<std::string, Tensor> tensors;
};

// The tensors each FP8 Linear of a step produced and received: its output in forward order, then the
// gradient of that output in backward order, each under "<layer> y" or "<layer> dy".
struct StepTrace {
  std::vector<std::pair<std::string, Tensor>> tensors;
};

// One training step of the small ViT (seed 5, bf16, delayed scaling, SGD) on `device`. perturb_seed
// > 0 flips the FP8 Linears' outputs (tests/cuda/fp8_sensitivity.h); a trace records the Linears'
// outputs and output gradients (its hooks run the layers unfused, which gives the same bits).
StepResult fp8_train_step(Device device, uint64_t perturb_seed = 0, StepTrace* trace = nullptr) {
  Generator gen(5);
  models::VisionTransformer model(testing::small_vit_config("test_gpu_fp8_step"), true, &gen);
  model.to(DType::bf16);
  model.to(device);
  if (perturb_seed > 0) testing::perturb_linear_outputs(model, "blocks.", testing::kFp8GemmFlipProbability, perturb_seed);
  if (trace != nullptr) {
    for (const auto& [name, m] : model.named_modules()) {
      if (name.rfind("blocks.", 0) != 0 || std::dynamic_pointer_cast<nn::Linear>(m) == nullptr) continue;
      m->register_forward_hook([trace, name](nn::Module&, const Tensor&, const Tensor& y) {
        trace->tensors.emplace_back(name + " y", y.detach().to(Device::cpu()));
        Tensor out = y;
        out.register_hook([trace, name](const Tensor& dy) {
          trace->tensors.emplace_back(name + " dy", dy.detach().to(Device::cpu()));
          return Tensor();
        });
        return Tensor();
      });
    }
  }
  optim::SGD sgd(model.parameters(), 0.1, 0.9);
  const Tensor images = random_tensor({6, 3, 16, 16}, DType::f32, 21).to(device);
  const Tensor labels = from_vector(std::vector<int64_t>{3, 1, 4, 1, 5, 9}, {6}, DType::i64, device);
  Tensor loss;
  {
    nn::Fp8Autocast fp8(true, nn::DelayedScaling{.amax_history_len = 8});
    loss = nn::CrossEntropyLoss(0.1)(model(images), labels);
  }
  loss.backward();
  StepResult r;
  r.loss = loss.item();
  for (const auto& [name, p] : model.named_parameters()) r.tensors["grad:" + name] = p.grad().to(Device::cpu());
  sgd.step();
  for (const auto& [name, p] : model.named_parameters()) r.tensors["param:" + name] = p.detach().to(Device::cpu());
  for (const auto& [name, t] : nn::fp8_state_dict(model)) r.tensors["fp8:" + name] = t.to(Device::cpu());
  return r;
}

// The GPU step against the CPU emulation. What must agree exactly: the weights' scales (identical
// tensors, exact amaxes). What agrees to rounding: the loss, and the first FP8 Linear's output (its
// inputs differ only where a bf16 rounding flipped upstream). Everything after the first FP8 GEMM is
// compared against the step's own sensitivity (tests/cuda/fp8_sensitivity.h): each gradient, updated
// parameter and scale within kFp8SensitivityMultiple × the largest change that flipping the FP8
// GEMMs' bf16 outputs by one ulp (probability 3%) makes on the CPU, and never less than the fixed
// bounds this test had (5% for gradients and parameters, 2% for scales). The first run on an H200 put
// the gradients 8-14% from the CPU (the fixed bound failed); the flips on the CPU move them by as much.
TEST(CudaFp8, ViTTrainStepMatchesTheCpuEmulation) {
  SKIP_WITHOUT_GPU();
  const StepResult cpu = fp8_train_step(Device::cpu());
  const kernels::AttentionPathCounts before = kernels::attention_path_counts();
  const StepResult gpu = fp8_train_step(kGpu);
  // The attention stays bf16 under FP8 and runs on cuDNN's fused kernels in both blocks.
  testing::expect_attention_fused(before, 2, 2, "the FP8 step's attention (bf16 [6, 2, 17, 64])");
  EXPECT_LT(std::abs(gpu.loss - cpu.loss) / std::abs(cpu.loss), 1e-2) << gpu.loss << " vs " << cpu.loss;
  ASSERT_EQ(gpu.tensors.size(), cpu.tensors.size());
  // 2 blocks × 4 Linears × {forward, backward} × 4 tensors: every block Linear ran in FP8, 102 tokens padded.
  int64_t fp8_entries = 0;
  for (const auto& [name, t] : cpu.tensors) fp8_entries += name.rfind("fp8:", 0) == 0;
  ASSERT_EQ(fp8_entries, 2 * 4 * 4 * 2);
  // The weights are identical on both devices, so are their amaxes and scales (entry 1 of forward).
  const std::string qkv = "fp8:blocks.0.attn.qkv.fp8.forward.scale";
  EXPECT_EQ(gpu.tensors.at(qkv).to_vector<double>()[1], cpu.tensors.at(qkv).to_vector<double>()[1]);

  const std::map<std::string, double> sensitivity = testing::sensitivity(
      cpu.tensors, [](uint64_t seed) { return fp8_train_step(Device::cpu(), seed).tensors; });
  std::printf("%-52s %10s %12s %10s\n", "tensor", "GPU-CPU", "sensitivity", "bound");
  for (const auto& [name, want] : cpu.tensors) {
    const bool scale = name.rfind("fp8:", 0) == 0;
    if (scale && name.find("scale") == std::string::npos) continue;  // amax histories: their max is in the scale
    if (name == "grad:cls_token") continue;  // its gradient is rounding noise (see test_cuda_vit_step.cpp)
    const double error = relative_error(gpu.tensors.at(name), want);
    const double bound = std::max(scale ? 2e-2 : 5e-2, testing::kFp8SensitivityMultiple * sensitivity.at(name));
    std::printf("%-52s %10.4f %12.4f %10.4f\n", name.c_str(), error, sensitivity.at(name), bound);
    EXPECT_LT(error, bound) << name << " (the CPU's own sensitivity: " << sensitivity.at(name) << ")";
  }
}

// Where the two devices part: every block Linear's output in forward order, then their output
// gradients in backward order, GPU against CPU, printed for the log; the first FP8 GEMM's output
// (blocks.0.attn.qkv) must agree to the GEMM's rounding, since its inputs can differ only where a
// LayerNorm or the bf16 patch embedding rounded an element the other way.
TEST(CudaFp8, ViTStepTraceShowsWhereTheDevicesPart) {
  SKIP_WITHOUT_GPU();
  StepTrace cpu, gpu;
  fp8_train_step(Device::cpu(), 0, &cpu);
  fp8_train_step(kGpu, 0, &gpu);
  ASSERT_EQ(gpu.tensors.size(), cpu.tensors.size());
  ASSERT_EQ(cpu.tensors.size(), 2u * 2u * 4u);  // 8 Linears, y and dy each
  std::string first_apart;
  for (size_t i = 0; i < cpu.tensors.size(); ++i) {
    ASSERT_EQ(gpu.tensors[i].first, cpu.tensors[i].first);
    const double error = relative_error(gpu.tensors[i].second, cpu.tensors[i].second);
    std::printf("%2zu %-28s GPU-CPU %.5f\n", i, cpu.tensors[i].first.c_str(), error);
    if (first_apart.empty() && error > 1e-2) first_apart = cpu.tensors[i].first;
  }
  std::printf("first tensor more than 1%% apart: %s\n", first_apart.empty() ? "none" : first_apart.c_str());
  EXPECT_EQ(cpu.tensors[0].first, "blocks.0.attn.qkv y");
  EXPECT_LT(relative_error(gpu.tensors[0].second, cpu.tensors[0].second), 2e-2) << "the first FP8 GEMM's output";
}

}  // namespace
}  // namespace octet
