// An MLP as one node on the GPU (autograd's linear_gelu_linear: fc1, the GELU and fc2, keeping the
// GELU's input, not its output): at ViT-Base's MLP shape in bf16 the output and every gradient but
// fc1's bias are bit for bit those of the modules one after the other on the GPU -- the same kernels,
// with the GELU run again in backward, and cuBLASLt given the same problems. fc1's bias gradient is
// summed in the GELU backward's pass, in its own order, so the node runs fc1's wgrad GEMM without a
// bias-gradient epilogue; the modules' fc1 would ask cuBLASLt for BGRADB on it, another problem whose
// algorithm (and so the order of the weight gradient's sums) may differ. So both paths run with the
// bias gradients summed apart (LinearBiasGradDesign::kColumnSum): every GEMM is then the same problem
// in both, and fc1's bias gradient is held to the float64 sums of the very dpre both paths compute.
// The node keeps one hidden-sized tensor less.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/cuda_memory.h"
#include "kernels/linear.h"
#include "kernels/nn_ops.h"
#include "nn/layers.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::random_tensor;
using testing::same_bits;

struct MlpRun {
  Tensor y, dx;
  std::map<std::string, Tensor> grads;
};

MlpRun run_mlp(nn::Mlp& mlp, bool as_modules) {
  mlp.zero_grad();
  Tensor x = random_tensor({8, 197, 768}, DType::bf16, 11, 2.0).to(kGpu);
  x.requires_grad_();
  MlpRun r;
  const Tensor y = as_modules ? (*mlp.fc2)((*mlp.drop1)((*mlp.act)((*mlp.fc1)(x)))) : mlp(x);
  EXPECT_EQ(y.grad_fn()->name(), as_modules ? "linear" : "linear_gelu_linear");
  autograd::backward({y}, {random_tensor({8, 197, 768}, DType::bf16, 12).to(kGpu)});
  r.y = y.detach();  // (compared on the host: a copy, which autograd's tensors refuse)
  r.dx = x.grad();
  for (const auto& [name, p] : mlp.named_parameters()) r.grads[name] = p.grad();
  return r;
}

// Sets LinearBiasGradDesign::kColumnSum for its scope (the switch is process-wide).
struct BiasGradsSummedApart {
  kernels::LinearBiasGradDesign before = kernels::linear_bias_grad_design();
  BiasGradsSummedApart() { kernels::set_linear_bias_grad_design(kernels::LinearBiasGradDesign::kColumnSum); }
  ~BiasGradsSummedApart() { kernels::set_linear_bias_grad_design(before); }
};

TEST(CudaGeluLinear, MlpEqualsTheModulesBitForBit) {
  SKIP_WITHOUT_GPU();
  const BiasGradsSummedApart summed_apart;
  nn::Mlp mlp(768, 3072, 768);
  uint64_t seed = 20;
  for (const Tensor& p : mlp.parameters()) p.detach().copy_(random_tensor(p.shape(), DType::f32, seed++, 0.05));
  mlp.to(DType::bf16);
  mlp.to(kGpu);
  const MlpRun fused = run_mlp(mlp, false), modules = run_mlp(mlp, true);
  EXPECT_TRUE(same_bits(fused.y, modules.y));
  EXPECT_TRUE(same_bits(fused.dx, modules.dx));
  ASSERT_EQ(fused.grads.size(), 4u);
  for (const auto& [name, g] : modules.grads) {
    if (name != "fc1.bias") {
      EXPECT_TRUE(same_bits(fused.grads.at(name), g)) << name;
    }
  }

  // fc1's bias gradient: Σ over the 1576 rows of dpre = gelu_backward(dy·W2, pre), which both paths
  // compute bit for bit (dx and fc1.weight's gradient, read from it, are equal above). Bound: 1575 f32
  // additions, each rounding by at most 2^-24 of a partial sum <= Σ|dpre|, then one rounding to bf16
  // (2^-8 of the result).
  NoGradGuard no_grad;
  const Tensor x = random_tensor({8, 197, 768}, DType::bf16, 11, 2.0).to(kGpu);
  const Tensor dy = random_tensor({8, 197, 768}, DType::bf16, 12).to(kGpu);
  const Tensor pre = kernels::linear_forward(x, mlp.fc1->weight.detach(), mlp.fc1->bias.detach());
  const Tensor dact = kernels::linear_backward(dy, pre, mlp.fc2->weight.detach(), true, false, false).dx;
  const std::vector<double> dpre = kernels::gelu_backward(dact, pre).to(DType::f64).to_vector<double>();
  const std::vector<double> got = fused.grads.at("fc1.bias").to(DType::f64).to_vector<double>();
  ASSERT_EQ(got.size(), 3072u);
  int64_t outside = 0;
  for (int64_t c = 0; c < 3072; ++c) {
    double exact = 0, magnitude = 0;
    for (int64_t r = 0; r < 1576; ++r) {
      exact += dpre[r * 3072 + c];
      magnitude += std::fabs(dpre[r * 3072 + c]);
    }
    const double summing = 1575 * 0x1p-24 * magnitude;
    if (std::fabs(got[c] - exact) > summing + 0x1p-8 * (std::fabs(exact) + summing)) ++outside;
  }
  EXPECT_EQ(outside, 0);
}

// What the forward leaves alive for backward, by the device allocator's count: the modules keep the
// GELU's input (for its backward) and its output (fc2's input, for the weight gradient); gelu_linear
// keeps the input alone, so the difference is one [1576, 3072] bf16 tensor.
TEST(CudaGeluLinear, KeepsOneHiddenTensorLessForBackward) {
  SKIP_WITHOUT_GPU();
  nn::Mlp mlp(768, 3072, 768);
  mlp.to(DType::bf16);
  mlp.to(kGpu);
  const Tensor x = random_tensor({8, 197, 768}, DType::bf16, 13).to(kGpu).requires_grad_();
  auto kept = [&](bool as_modules) {
    const size_t before = cuda_memory::memory_in_use(kGpu.index);
    const Tensor y = as_modules ? (*mlp.fc2)((*mlp.drop1)((*mlp.act)((*mlp.fc1)(x)))) : mlp(x);
    return static_cast<int64_t>(cuda_memory::memory_in_use(kGpu.index) - before) -
           static_cast<int64_t>(y.nbytes());  // what the graph keeps, less the output itself
  };
  const int64_t modules = kept(true), fused = kept(false);
  EXPECT_EQ(modules - fused, int64_t{8} * 197 * 3072 * 2);
}

}  // namespace
}  // namespace octet
