// The FP8 producers on the GPU (nn::fp8_layernorm_linear, fp8_add_layernorm_linear, fp8_gelu_linear):
// a pre-norm MLP and a qkv projection in bf16 under delayed scaling, two training steps with the
// producers on and off. Their kernels give the unfused pairs' bits on each device (kernels/fp8.h), and
// every other kernel here is deterministic (no attention, whose cuDNN backward may not be), so the
// two runs must agree bit for bit: outputs, every gradient, every FP8 history and scale. Then the
// fused GPU run against the CPU emulation, against the steps' own sensitivity
// (tests/cuda/fp8_sensitivity.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "autograd/ops.h"
#include "core/op_ledger.h"
#include "nn/fp8.h"
#include "nn/fp8_linear.h"
#include "nn/layers.h"
#include "optim/sgd.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/cuda/fp8_sensitivity.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::random_tensor;
using testing::relative_error;
using testing::same_bits;

// norm1 -> qkv, and the residual add + norm2 -> fc1 -> GELU -> fc2, as a TransformerBlock wires them
// (without the attention between). With add_in_norm2 off, as the block runs without drop path: the
// add done before norm2 (in the block, proj's GEMM does it), norm2 passing h on, and the MLP with
// fc2's GEMM adding h as one node (nn::fp8_add_layernorm_mlp_residual without a residual operand).
class PreNormLayers : public nn::Module {
 public:
  PreNormLayers(int64_t dim, bool add_in_norm2) : Module("PreNormLayers"), add_in_norm2(add_in_norm2) {
    norm1 = register_module("norm1", std::make_shared<nn::LayerNorm>(dim));
    qkv = register_module("qkv", std::make_shared<nn::Linear>(dim, 3 * dim));
    norm2 = register_module("norm2", std::make_shared<nn::LayerNorm>(dim));
    mlp = register_module("mlp", std::make_shared<nn::Mlp>(dim, 4 * dim, dim));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor q = norm1->linear_forward(*qkv, x);
    const Tensor branch = mul(slice(q, 2, 0, x.size(2)), 0.5);
    if (!add_in_norm2) return mlp->add_norm_residual_forward(*norm2, x + branch, Tensor());
    const auto [h, hidden] = norm2->add_linear_forward(*mlp->fc1, x, branch);
    return h + mlp->after_fc1(hidden);
  }
  const bool add_in_norm2;
  std::shared_ptr<nn::LayerNorm> norm1, norm2;
  std::shared_ptr<nn::Linear> qkv;
  std::shared_ptr<nn::Mlp> mlp;
};

struct StepsRun {
  std::map<std::string, Tensor> tensors;  // on the CPU
  int64_t producers = 0;
};

// perturb_seed > 0 flips the Linears' outputs (tests/cuda/fp8_sensitivity.h), which runs them unfused.
StepsRun run(Device device, bool fused, uint64_t perturb_seed = 0, bool add_in_norm2 = true) {
  nn::set_fp8_fused_producers(fused);
  OpLedger ledger;
  PreNormLayers m(64, add_in_norm2);
  uint64_t seed = 40;
  for (const Tensor& p : m.parameters()) p.detach().copy_(random_tensor(p.shape(), DType::f32, seed++, 0.2));
  m.to(DType::bf16);
  m.to(device);
  if (perturb_seed > 0) testing::perturb_linear_outputs(m, "", testing::kFp8GemmFlipProbability, perturb_seed);
  optim::SGD sgd(m.parameters(), 0.1);
  StepsRun out;
  for (int s = 0; s < 2; ++s) {
    Tensor x = random_tensor({4, 197, 64}, DType::bf16, 50 + s, 2.0).to(device).requires_grad_();
    const Tensor r = random_tensor({4, 197, 64}, DType::bf16, 60 + s, 1e-2).to(device);
    sgd.zero_grad();
    Tensor y;
    {
      nn::Fp8Autocast fp8(true, nn::DelayedScaling{.amax_history_len = 4});
      y = m(x);
    }
    sum(mul(y, r)).backward();
    const std::string at = "step" + std::to_string(s) + ".";
    out.tensors[at + "y"] = y.detach().to(Device::cpu());
    out.tensors[at + "x.grad"] = x.grad().to(Device::cpu());
    for (const auto& [name, p] : m.named_parameters()) out.tensors[at + name + ".grad"] = p.grad().to(Device::cpu());
    for (const auto& [name, t] : nn::fp8_state_dict(m)) out.tensors[at + name] = t.to(Device::cpu());
    sgd.step();
  }
  out.producers = ledger.op("layernorm_fp8_forward").calls + ledger.op("add_layernorm_fp8_forward").calls +
                  ledger.op("gelu_fp8_forward").calls;
  nn::set_fp8_fused_producers(true);
  return out;
}

TEST(CudaFp8Producers, FusedStepsEqualTheUnfusedOnesBitForBit) {
  SKIP_WITHOUT_GPU();
  for (const bool add_in_norm2 : {true, false}) {
    SCOPED_TRACE(add_in_norm2 ? "the residual add in norm2" : "the add before norm2, the MLP as one node");
    const StepsRun fused = run(kGpu, true, 0, add_in_norm2), unfused = run(kGpu, false, 0, add_in_norm2);
    EXPECT_EQ(fused.producers, 2 * 3);
    EXPECT_EQ(unfused.producers, 0);
    ASSERT_EQ(fused.tensors.size(), unfused.tensors.size());
    for (const auto& [name, t] : unfused.tensors) EXPECT_TRUE(same_bits(fused.tensors.at(name), t)) << name;
  }
}

// The fused GPU run against the fused CPU run. The second step runs on weights the first step's
// gradients moved, so every difference of the first step is in it too. The fixed bound of 1% failed
// on an H200 (1.1-2.7% on the second step): the steps are ill-conditioned in FP8 as the full ViT step
// is (tests/cuda/fp8_sensitivity.h), so each tensor is held to kFp8SensitivityMultiple × the change
// that flipping the Linears' bf16 outputs (probability 3%) makes on the CPU, and never less than 1%.
TEST(CudaFp8Producers, FusedStepsMatchTheCpuEmulation) {
  SKIP_WITHOUT_GPU();
  const StepsRun gpu = run(kGpu, true), cpu = run(Device::cpu(), true);
  std::map<std::string, Tensor> compared;
  for (const char* step : {"step0.", "step1."}) {
    for (const char* what : {"y", "x.grad", "qkv.weight.grad", "mlp.fc1.weight.grad", "mlp.fc2.weight.grad",
                             "norm2.weight.grad"}) {
      const std::string name = std::string(step) + what;
      ASSERT_TRUE(gpu.tensors.count(name) && cpu.tensors.count(name)) << name;
      compared[name] = cpu.tensors.at(name);
    }
  }
  const std::map<std::string, double> sensitivity = testing::sensitivity(compared, [](uint64_t seed) {
    return run(Device::cpu(), true, seed).tensors;
  });
  for (const auto& [name, want] : compared) {
    const double error = relative_error(gpu.tensors.at(name), want);
    const double bound = std::max(1e-2, testing::kFp8SensitivityMultiple * sensitivity.at(name));
    std::printf("%-28s GPU-CPU %.4f, sensitivity %.4f, bound %.4f\n", name.c_str(), error, sensitivity.at(name), bound);
    EXPECT_LT(error, bound) << name << " (the CPU's own sensitivity: " << sensitivity.at(name) << ")";
  }
}

}  // namespace
}  // namespace octet
