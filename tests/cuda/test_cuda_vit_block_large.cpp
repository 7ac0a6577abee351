// One transformer block of ViT-H/16 at its real size (embed 1280, 16 heads of 80, MLP 5120, 197 tokens:
// 196 patches of a 224 image and the class token), forward and backward on the GPU in bf16 against
// the same block on the CPU, from the same parameters, input and output gradient. Large shapes make
// cuBLASLt and cuDNN pick other engines than the toy shapes of the other tests (split-K, other tile
// shapes, cuDNN's fused attention at head dim 80 over 197 keys), which is the point. A second test
// runs the block's four Linears in FP8 (current scaling) on both devices.
//
// Every output is compared norm-wise, ||a - b||_2 / ||b||_2 in f64: y, dx and every parameter's
// gradient. Three runs of the block: the GPU in bf16, the CPU's exact emulation of bf16 (bf16
// operands, f32 arithmetic, every op's result rounded once to bf16), and the CPU in f32 on the same
// (bf16-valued) parameters and inputs, which differs from exact arithmetic by f32 rounding only.
//
// The bounds:
//   1. The CPU emulation against f32: d ≤ N·2^-8. A rounding to bf16 moves every element by at most
//      2^-8 of itself (8 significant bits), so a tensor's norm by at most 2^-8 of its norm, and to
//      first order the deviations of successive roundings add, through maps (Linears with random
//      weights, LayerNorm, GELU, softmax at these scales) that preserve relative size. N counts the
//      roundings a tensor depends on: forward LN1, qkv GEMM and its bias, attention, proj GEMM and
//      bias, residual add, LN2, fc1 GEMM and bias, GELU, fc2 GEMM and bias, residual add: 14 for y,
//      counted as the unfused ops would round (proj's and fc2's residual adds now ride in their GEMMs
//      and round once with them, so the block rounds fewer times than N counts: an upper bound);
//      backward adds at most fc2 dgrad, GELU backward, fc1 dgrad, LN2 backward, the gradient sum at
//      h, proj dgrad, attention backward, qkv dgrad, LN1 backward and the sum at x (10), and a
//      parameter's gradient its own GEMM or row sum (1): 25.
//   2. The GPU against the CPU emulation: e ≤ 3·d, with d of bound 1 measured in the same test. The
//      GPU rounds the same intermediates to bf16 (in another order, which moves a value across a
//      rounding boundary now and then), plus a few of its own inside cuDNN's fused attention (the
//      probabilities before P·V; P and dS in the backward), and fewer where cuBLASLt fuses a bias.
//      We allow the GPU's deviation from the f32 result up to twice the CPU's, so
//      ||gpu - cpu|| <= ||gpu - f32|| + ||cpu - f32|| <= (2 + 1)·d. The measured d is ~2^-8 here
//      (each tensor's own last rounding dominates), so e is held to ~1%: a wrong attention scale,
//      a dropped term or a transposed operand in any engine moves the gradients of the attention or
//      MLP weights by more.
//   In FP8 the same argument holds with FP8's coarser roundings in d (bound 1 then says nothing and
//   is not asserted); the FP8 GEMMs' Hopper accumulation (tests/cuda/fp8_bound.h) is far below d.
//
// The attention must run fused in both GPU runs (kernels::attention_path_counts).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "nn/fp8.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "tests/cuda/attention_paths.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::random_tensor;
using testing::relative_error;
using testing::relative_error_to_reference;

constexpr int64_t kBatch = 2, kTokens = 197, kDim = 1280, kHeads = 16;  // head dim 80, MLP 4·1280

enum class Precision { F32, Bf16, Fp8 };

struct BlockRun {
  std::map<std::string, Tensor> outputs;  // "y", "dx" and every parameter's gradient, on the CPU
};

// Parameters from fixed seeds, the same whatever device and dtype follow: Linear weights and biases
// N(0, 0.02²) (timm's weight init; biases not zero so that their gradients are exercised), LayerNorm
// weights 1 + N(0, 0.1²) and biases N(0, 0.1²). Rounded to bf16, so the f32 run computes on exactly
// the bf16 runs' values.
void set_parameters(nn::Module& block) {
  uint64_t seed = 100;
  for (const auto& [name, p] : block.named_parameters()) {
    const bool layernorm = name.find("norm") != std::string::npos;
    const double spread = layernorm ? 0.1 : 0.02;
    Tensor value = random_tensor(p.shape(), DType::f64, seed++, spread);
    if (layernorm && name.find("weight") != std::string::npos) {
      double* v = value.data<double>();
      for (int64_t i = 0; i < value.numel(); ++i) v[i] += 1.0;
    }
    p.copy_(value.to(DType::bf16));
  }
}

BlockRun run_block(Device device, Precision precision) {
  const nn::SkipInitGuard no_default_init;  // set_parameters decides every value
  nn::TransformerBlock block(kDim, kHeads, 4.0);
  set_parameters(block);
  const DType dtype = precision == Precision::F32 ? DType::f32 : DType::bf16;
  block.to(dtype);
  block.to(device);
  Tensor x = random_tensor({kBatch, kTokens, kDim}, DType::bf16, 11).to(dtype).to(device).requires_grad_();
  const Tensor dy = random_tensor({kBatch, kTokens, kDim}, DType::bf16, 12).to(dtype).to(device);
  Tensor y;
  {
    nn::Fp8Autocast fp8(precision == Precision::Fp8, nn::CurrentScaling{});
    y = block(x);
  }
  y.backward(dy);
  if (precision == Precision::Fp8) {  // every Linear of the block ran its GEMMs in FP8
    for (const auto& linear : {block.attn->qkv, block.attn->proj, block.mlp->fc1, block.mlp->fc2}) {
      EXPECT_NE(linear->fp8_state, nullptr) << "a block Linear did not run in FP8";
    }
  }
  BlockRun run;
  run.outputs["y"] = y.detach().to(Device::cpu());
  run.outputs["dx"] = x.grad().to(Device::cpu());
  for (const auto& [name, p] : block.named_parameters()) {
    EXPECT_TRUE(p.grad().defined()) << name;
    if (p.grad().defined()) run.outputs[name + ".grad"] = p.grad().to(Device::cpu());
  }
  return run;
}

// The GPU run, checking that its attention ran on cuDNN's fused kernels, forward and backward.
BlockRun run_block_on_gpu(Precision precision) {
  const kernels::AttentionPathCounts before = kernels::attention_path_counts();
  BlockRun run = run_block(kGpu, precision);
  testing::expect_attention_fused(before, 1, 1, "the ViT-H block's attention (bf16 [2, 16, 197, 80])");
  return run;
}

// Bounds 1 and 2 of the top of the file for every output. `roundings_y` and `roundings_grad` are N
// (0: bound 1 is not asserted).
void expect_within_rounding(const BlockRun& gpu, const BlockRun& cpu, const BlockRun& f32, int roundings_y,
                            int roundings_grad, const std::string& what) {
  ASSERT_EQ(gpu.outputs.size(), cpu.outputs.size());
  ASSERT_EQ(f32.outputs.size(), cpu.outputs.size());
  double worst_ratio = 0;
  std::string worst;
  for (const auto& [name, want] : cpu.outputs) {
    const double d = relative_error_to_reference(want, f32.outputs.at(name));
    const int roundings = name == "y" ? roundings_y : roundings_grad;
    if (roundings > 0) {
      EXPECT_LE(d, roundings * std::ldexp(1.0, -8))
          << what << " " << name << ": the CPU emulation is further from the f32 result than " << roundings
          << " bf16 roundings allow";
    }
    const double e = relative_error(gpu.outputs.at(name), want);
    EXPECT_LE(e, 3 * d) << what << " " << name << ": GPU vs CPU emulation " << e << ", 3 × the emulation's own "
                        << "rounding deviation from f32 (" << d << ")";
    if (d > 0 && e / d > worst_ratio) {
      worst_ratio = e / d;
      worst = name;
    }
  }
  std::cout << what << ": the largest GPU-vs-CPU error is " << worst_ratio << " × the CPU emulation's rounding "
            << "deviation (" << worst << "); the bound is 3\n";
}

TEST(CudaViTBlockLarge, VitHugeBlockInBf16MatchesTheCpuEmulation) {
  SKIP_WITHOUT_GPU();
  const BlockRun f32 = run_block(Device::cpu(), Precision::F32);
  const BlockRun cpu = run_block(Device::cpu(), Precision::Bf16);
  const BlockRun gpu = run_block_on_gpu(Precision::Bf16);
  expect_within_rounding(gpu, cpu, f32, 14, 25, "ViT-H block, bf16");
}

TEST(CudaViTBlockLarge, VitHugeBlockWithFp8LinearsMatchesTheCpuEmulation) {
  SKIP_WITHOUT_GPU();
  const BlockRun f32 = run_block(Device::cpu(), Precision::F32);
  const BlockRun cpu = run_block(Device::cpu(), Precision::Fp8);
  const BlockRun gpu = run_block_on_gpu(Precision::Fp8);
  expect_within_rounding(gpu, cpu, f32, 0, 0, "ViT-H block, FP8 Linears");
}

}  // namespace
}  // namespace octet
