// autograd's gelu_linear on the GPU (an MLP's GELU and fc2 as one node that keeps the GELU's input,
// not its output): at ViT-Base's MLP shape in bf16 the output and every gradient are bit for bit
// those of the modules one after the other on the GPU -- the same kernels, with the GELU run again in
// backward, and cuBLASLt given the same problems -- and the node keeps one hidden-sized tensor less.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/cuda_memory.h"
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
  EXPECT_EQ(y.grad_fn()->name(), as_modules ? "linear" : "gelu_linear");
  autograd::backward({y}, {random_tensor({8, 197, 768}, DType::bf16, 12).to(kGpu)});
  r.y = y.detach();  // (compared on the host: a copy, which autograd's tensors refuse)
  r.dx = x.grad();
  for (const auto& [name, p] : mlp.named_parameters()) r.grads[name] = p.grad();
  return r;
}

TEST(CudaGeluLinear, MlpEqualsTheModulesBitForBit) {
  SKIP_WITHOUT_GPU();
  nn::Mlp mlp(768, 3072, 768);
  uint64_t seed = 20;
  for (const Tensor& p : mlp.parameters()) p.detach().copy_(random_tensor(p.shape(), DType::f32, seed++, 0.05));
  mlp.to(DType::bf16);
  mlp.to(kGpu);
  const MlpRun fused = run_mlp(mlp, false), modules = run_mlp(mlp, true);
  EXPECT_TRUE(same_bits(fused.y, modules.y));
  EXPECT_TRUE(same_bits(fused.dx, modules.dx));
  ASSERT_EQ(fused.grads.size(), 4u);
  for (const auto& [name, g] : modules.grads) EXPECT_TRUE(same_bits(fused.grads.at(name), g)) << name;
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
