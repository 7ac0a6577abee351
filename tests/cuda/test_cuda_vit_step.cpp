// One full training step of a small ViT on the GPU against the same step on the CPU, from the same
// initial weights and batch: forward, cross-entropy, backward, optimizer. Errors are norm-wise,
// ||gpu - cpu||_2 / ||cpu||_2 in f64. f32: the loss within 1e-4, gradients within 1e-3 (GELU may go
// through cuBLASLt's tanh approximation, and every reduction runs in another order), parameters
// after the SGD step within 1e-3 too (zero-initialised biases are nothing but their update). bf16 (Module::to(bf16), f32 master weights; the CPU is the exact
// emulation): the loss within 1e-2, gradients and updated parameters within 5e-2, and its attention
// must have run on cuDNN's fused kernels (kernels::attention_path_counts).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "models/vit.h"
#include "nn/layers.h"
#include "optim/optim.h"
#include "tests/testing.h"
#include "tests/cuda/attention_paths.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/cuda/small_vit.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::random_tensor;
using testing::relative_error;

struct StepResult {
  double loss;
  std::vector<nn::NamedTensor> params;  // after the step
  std::map<std::string, Tensor> grads;  // before the step
};

// Builds the model from seed 5, converts it, and runs one step on `device`.
StepResult train_step(Device device, DType dtype, bool adamw) {
  Generator gen(5);
  models::VisionTransformer model(testing::small_vit_config("test_gpu_step"), true, &gen);
  model.to(dtype);
  model.to(device);
  std::unique_ptr<optim::Optimizer> optimizer;
  if (adamw) {
    optimizer = std::make_unique<optim::AdamW>(optim::weight_decay_groups(model.named_parameters(), 1e-3, 0.05), 1e-3);
  } else {
    optimizer = std::make_unique<optim::SGD>(model.parameters(), 0.1, 0.9);
  }
  const Tensor images = random_tensor({6, 3, 16, 16}, DType::f32, 21).to(device);
  const Tensor labels = from_vector(std::vector<int64_t>{3, 1, 4, 1, 5, 9}, {6}, DType::i64, device);
  const Tensor loss = nn::CrossEntropyLoss(0.1)(model(images), labels);
  EXPECT_EQ(loss.dtype(), DType::f32);
  loss.backward();
  StepResult r{loss.item(), {}, {}};
  for (const auto& [name, p] : model.named_parameters()) r.grads[name] = p.grad().to(Device::cpu());
  optimizer->step();
  for (const auto& [name, p] : model.named_parameters()) r.params.emplace_back(name, p.detach().to(Device::cpu()));
  return r;
}

void expect_close(const StepResult& gpu, const StepResult& cpu, double loss_tol, double grad_tol, double param_tol) {
  EXPECT_LT(std::abs(gpu.loss - cpu.loss) / std::abs(cpu.loss), loss_tol) << gpu.loss << " vs " << cpu.loss;
  ASSERT_EQ(gpu.params.size(), cpu.params.size());
  for (size_t i = 0; i < cpu.params.size(); ++i) {
    const std::string& name = cpu.params[i].first;
    ASSERT_EQ(gpu.params[i].first, name);
    EXPECT_EQ(gpu.params[i].second.dtype(), cpu.params[i].second.dtype()) << name;
    // cls_token's gradient is tiny (it starts at ~1e-6) and all rounding noise: its parameter still counts.
    if (name != "cls_token") {
      EXPECT_LT(relative_error(gpu.grads.at(name), cpu.grads.at(name)), grad_tol) << name;
    }
    EXPECT_LT(relative_error(gpu.params[i].second, cpu.params[i].second), param_tol) << name;
  }
}

TEST(CudaViTStep, F32StepMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const StepResult cpu = train_step(Device::cpu(), DType::f32, /*adamw=*/false);
  const StepResult gpu = train_step(kGpu, DType::f32, /*adamw=*/false);
  expect_close(gpu, cpu, 1e-4, 1e-3, 1e-3);
}

TEST(CudaViTStep, Bf16StepWithMasterWeightsMatchesTheCpuEmulation) {
  SKIP_WITHOUT_GPU();
  for (const bool adamw : {false, true}) {
    SCOPED_TRACE(adamw ? "AdamW" : "SGD");
    const StepResult cpu = train_step(Device::cpu(), DType::bf16, adamw);
    const kernels::AttentionPathCounts before = kernels::attention_path_counts();
    const StepResult gpu = train_step(kGpu, DType::bf16, adamw);
    // bf16, head dim 64: both blocks' attention runs on cuDNN's fused kernels, forward and backward.
    testing::expect_attention_fused(before, 2, 2, "the bf16 step's attention (bf16 [6, 2, 17, 64])");
    expect_close(gpu, cpu, 1e-2, 5e-2, 5e-2);
  }
}

}  // namespace
}  // namespace octet
