// FP8 training on the GPU against the CPU emulation (nn/fp8.h): one FP8 Linear, then one full FP8
// training step of a small ViT (bf16 model, delayed scaling, SGD), from the same weights and batch.
//
// What may differ: the GPU accumulates in another order, and its FP8 GEMMs in the tensor cores'
// reduced precision (about 14 bits, promoted to f32 now and then; never with the forward's fast
// accumulation): per element within tests/cuda/fp8_bound.h's bound, which a model of that
// accumulation fills to ~5%, i.e. norm-wise below ~1e-3 at these sizes. So a bf16 value upstream of a
// cast can differ by one bf16 rounding, and then its FP8 code by one step at a rounding boundary.
// Errors are norm-wise, ||gpu - cpu||_2 / ||cpu||_2 in f64.
// What may not: casts, amaxes and scale updates are exact and identical on both devices, so scales
// computed from identical tensors (every weight's, and a first layer's input) must agree bit for bit.
#include <gtest/gtest.h>

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

struct StepResult {
  double loss;
  std::map<std::string, Tensor> grads, params;
  std::map<std::string, Tensor> fp8;  // fp8_state_dict after the step
};

StepResult fp8_train_step(Device device) {
  Generator gen(5);
  models::VisionTransformer model(testing::small_vit_config("test_gpu_fp8_step"), true, &gen);
  model.to(DType::bf16);
  model.to(device);
  optim::SGD sgd(model.parameters(), 0.1, 0.9);
  const Tensor images = random_tensor({6, 3, 16, 16}, DType::f32, 21).to(device);
  const Tensor labels = from_vector(std::vector<int64_t>{3, 1, 4, 1, 5, 9}, {6}, DType::i64, device);
  Tensor loss;
  {
    nn::Fp8Autocast fp8(true, nn::DelayedScaling{.amax_history_len = 8});
    loss = nn::CrossEntropyLoss(0.1)(model(images), labels);
  }
  loss.backward();
  StepResult r{loss.item(), {}, {}, {}};
  for (const auto& [name, p] : model.named_parameters()) r.grads[name] = p.grad().to(Device::cpu());
  sgd.step();
  for (const auto& [name, p] : model.named_parameters()) r.params[name] = p.detach().to(Device::cpu());
  for (const auto& [name, t] : nn::fp8_state_dict(model)) r.fp8[name] = t.to(Device::cpu());
  return r;
}

TEST(CudaFp8, ViTTrainStepMatchesTheCpuEmulation) {
  SKIP_WITHOUT_GPU();
  const StepResult cpu = fp8_train_step(Device::cpu());
  const kernels::AttentionPathCounts before = kernels::attention_path_counts();
  const StepResult gpu = fp8_train_step(kGpu);
  // The attention stays bf16 under FP8 and runs on cuDNN's fused kernels in both blocks.
  testing::expect_attention_fused(before, 2, 2, "the FP8 step's attention (bf16 [6, 2, 17, 64])");
  EXPECT_LT(std::abs(gpu.loss - cpu.loss) / std::abs(cpu.loss), 1e-2) << gpu.loss << " vs " << cpu.loss;
  for (const auto& [name, g] : cpu.grads) {
    if (name == "cls_token") continue;  // its gradient is rounding noise (see test_cuda_vit_step.cpp)
    EXPECT_LT(relative_error(gpu.grads.at(name), g), 5e-2) << name;
    EXPECT_LT(relative_error(gpu.params.at(name), cpu.params.at(name)), 5e-2) << name;
  }
  ASSERT_EQ(gpu.fp8.size(), cpu.fp8.size());
  // 2 blocks × 4 Linears × {forward, backward} × 4 tensors: every block Linear ran in FP8, 102 tokens padded.
  ASSERT_EQ(cpu.fp8.size(), 2u * 4u * 4u * 2u);
  for (const auto& [name, t] : cpu.fp8) {
    if (name.find("scale") == std::string::npos) continue;
    EXPECT_LT(relative_error(gpu.fp8.at(name), t), 2e-2) << name;
  }
  // The weights are identical on both devices, so are their amaxes and scales (entry 1 of forward).
  const std::string qkv = "blocks.0.attn.qkv.fp8.forward.scale";
  EXPECT_EQ(gpu.fp8.at(qkv).to_vector<double>()[1], cpu.fp8.at(qkv).to_vector<double>()[1]);
}

}  // namespace
}  // namespace octet
