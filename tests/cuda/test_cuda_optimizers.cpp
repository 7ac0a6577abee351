// CUDA multi-tensor AdamW, SGD and sum of squares against the CPU kernels on the same random inputs.
// The GPU updates use exactly rounded f32 operations in the CPU's order, so f32 results are expected
// to equal the CPU's bit for bit (tested separately); the other comparisons use the norm-wise
// relative error ||gpu - cpu||_2 / ||cpu||_2 in f64, at most 1e-5 for f32 and 1e-2 for bf16.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/optimizers.h"
#include "tests/testing.h"
#include "tests/cuda/cuda_testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::random_tensor;
using testing::relative_error;
using testing::same_bits;
using testing::uniform_tensor;

// Sizes around the 65536-element chunk, odd sizes, one element, an empty tensor, and enough small
// tensors (50 in all) that one call needs several launches (36 tensors per launch).
std::vector<int64_t> entry_sizes() {
  std::vector<int64_t> sizes = {1, 37, 65535, 65536, 65537, 3 * 65536 + 5, 1000003, 0};
  for (int i = 0; i < 42; ++i) sizes.push_back(13 + 97 * i);
  return sizes;
}

// ---- AdamW ----------------------------------------------------------------------------------------------

struct AdamWPair {
  std::vector<kernels::AdamWTensors> cpu, gpu;
};

kernels::AdamWTensors to_gpu(const kernels::AdamWTensors& t) {
  auto move = [](const Tensor& x) { return x.defined() ? x.to(kGpu) : Tensor(); };
  return {move(t.param), move(t.grad), move(t.exp_avg), move(t.exp_avg_sq), move(t.master)};
}

// f32 params (every fourth with a bf16 gradient), or bf16 params with f32 masters.
AdamWPair adamw_entries(bool bf16_with_master) {
  AdamWPair pair;
  const std::vector<int64_t> sizes = entry_sizes();
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    const uint64_t seed = 1000 + 10 * i;
    const Tensor weights = random_tensor({n}, DType::f32, seed);
    const Tensor m = random_tensor({n}, DType::f32, seed + 2, 0.05);
    const Tensor v = uniform_tensor({n}, 1e-4, 2e-2, DType::f32, seed + 3);
    kernels::AdamWTensors t;
    if (bf16_with_master) {
      t = {weights.to(DType::bf16), random_tensor({n}, DType::bf16, seed + 1, 0.1), m, v, weights};
    } else {
      const DType grad_dtype = i % 4 == 3 ? DType::bf16 : DType::f32;
      t = {weights, random_tensor({n}, grad_dtype, seed + 1, 0.1), m, v, Tensor()};
    }
    pair.cpu.push_back(t);
    pair.gpu.push_back(to_gpu(t));
  }
  return pair;
}

void run_adamw(const std::vector<kernels::AdamWTensors>& tensors, int64_t step) {
  kernels::adamw_step_multi_(tensors, 2e-3, 0.9, 0.95, 1e-8, 0.05, step);
}

TEST(CudaAdamW, MultiTensorStepMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (bool master : {false, true}) {
    AdamWPair pair = adamw_entries(master);
    for (int64_t step = 1; step <= 3; ++step) {
      run_adamw(pair.cpu, step);
      run_adamw(pair.gpu, step);
    }
    for (size_t i = 0; i < pair.cpu.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << (master ? "bf16 + master" : "f32") << " entry " << i);
      const auto &c = pair.cpu[i], &g = pair.gpu[i];
      const Tensor& updated_cpu = master ? c.master : c.param;
      const Tensor& updated_gpu = master ? g.master : g.param;
      EXPECT_LE(relative_error(updated_gpu, updated_cpu), 1e-5);
      EXPECT_LE(relative_error(g.exp_avg, c.exp_avg), 1e-5);
      EXPECT_LE(relative_error(g.exp_avg_sq, c.exp_avg_sq), 1e-5);
      if (master) {
        EXPECT_LE(relative_error(g.param, c.param), 1e-2);
        EXPECT_TRUE(same_bits(g.param, g.master.to(DType::bf16)));  // the bf16 copy is the master rounded
      }
    }
  }
}

TEST(CudaAdamW, F32UpdateIsBitwiseTheCpuUpdate) {
  SKIP_WITHOUT_GPU();
  for (bool master : {false, true}) {
    AdamWPair pair = adamw_entries(master);
    run_adamw(pair.cpu, 4);
    run_adamw(pair.gpu, 4);
    for (size_t i = 0; i < pair.cpu.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << (master ? "bf16 + master" : "f32") << " entry " << i);
      EXPECT_TRUE(same_bits(master ? pair.gpu[i].master : pair.gpu[i].param,
                            master ? pair.cpu[i].master : pair.cpu[i].param));
      EXPECT_TRUE(same_bits(pair.gpu[i].exp_avg_sq, pair.cpu[i].exp_avg_sq));
    }
  }
}

TEST(CudaAdamW, OneTensorStepRunsOnTheGpu) {
  SKIP_WITHOUT_GPU();
  const Tensor p = random_tensor({4099}), g = random_tensor({4099}, DType::f32, 2), m = zeros({4099}),
               v = zeros({4099});
  const Tensor pg = p.to(kGpu), gg = g.to(kGpu), mg = m.to(kGpu), vg = v.to(kGpu);
  kernels::adamw_step_multi_({{p, g, m, v, Tensor()}}, 1e-3, 0.9, 0.999, 1e-8, 0.01, 1);
  kernels::adamw_step_multi_({{pg, gg, mg, vg, Tensor()}}, 1e-3, 0.9, 0.999, 1e-8, 0.01, 1);
  EXPECT_LE(relative_error(pg, p), 1e-5);
  EXPECT_LE(relative_error(mg, m), 1e-5);
}

// ---- SGD ----------------------------------------------------------------------------------------------------

TEST(CudaSgd, MultiTensorStepMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const std::vector<int64_t> sizes = entry_sizes();
  for (bool master : {false, true}) {
    for (double momentum : {0.0, 0.9}) {
      for (bool nesterov : {false, true}) {
        if (nesterov && momentum == 0.0) continue;
        SCOPED_TRACE(::testing::Message() << (master ? "bf16 + master" : "f32") << " momentum " << momentum
                                          << (nesterov ? " nesterov" : ""));
        std::vector<kernels::SgdTensors> cpu, gpu;
        for (size_t i = 0; i < sizes.size(); ++i) {
          const int64_t n = sizes[i];
          const Tensor weights = random_tensor({n}, DType::f32, 2000 + i);
          const Tensor buffer = momentum != 0 ? random_tensor({n}, DType::f32, 3000 + i, 0.1) : Tensor();
          const Tensor param = master ? weights.to(DType::bf16) : weights;
          const Tensor grad = random_tensor({n}, master ? DType::bf16 : DType::f32, 4000 + i);
          const Tensor m = master ? weights : Tensor();
          cpu.push_back({param, grad, buffer, m});
          auto move = [](const Tensor& x) { return x.defined() ? x.to(kGpu) : Tensor(); };
          gpu.push_back({move(param), move(grad), move(buffer), move(m)});
        }
        for (int step = 0; step < 3; ++step) {
          kernels::sgd_step_multi_(cpu, 0.05, momentum, 0.0, nesterov, 1e-2, step == 0);
          kernels::sgd_step_multi_(gpu, 0.05, momentum, 0.0, nesterov, 1e-2, step == 0);
        }
        for (size_t i = 0; i < sizes.size(); ++i) {
          SCOPED_TRACE(::testing::Message() << "entry " << i);
          EXPECT_TRUE(same_bits(master ? gpu[i].master : gpu[i].param, master ? cpu[i].master : cpu[i].param));
          if (momentum != 0) {
            EXPECT_LE(relative_error(gpu[i].momentum_buffer, cpu[i].momentum_buffer), 1e-5);
          }
          if (master) {
            EXPECT_TRUE(same_bits(gpu[i].param, gpu[i].master.to(DType::bf16)));
          }
        }
      }
    }
  }
}

// ---- sum of squares -------------------------------------------------------------------------------------------

TEST(CudaSumOfSquares, MatchesTheCpuAndRepeatsExactly) {
  SKIP_WITHOUT_GPU();
  std::vector<Tensor> cpu, gpu;
  const std::vector<int64_t> sizes = entry_sizes();
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16, DType::f64};
  for (size_t i = 0; i < sizes.size(); ++i) {
    cpu.push_back(random_tensor({sizes[i]}, dtypes[i % 4], 5000 + i));
    gpu.push_back(cpu.back().to(kGpu));
  }
  const double want = kernels::sum_of_squares_multi(cpu);
  const double got = kernels::sum_of_squares_multi(gpu);
  // Both sum in double, in different orders.
  EXPECT_NEAR(got, want, 1e-12 * want);
  EXPECT_EQ(kernels::sum_of_squares_multi(gpu), got);
  EXPECT_NEAR(kernels::sum_of_squares(gpu[6]), kernels::sum_of_squares(cpu[6]), 1e-12 * kernels::sum_of_squares(cpu[6]));
  EXPECT_EQ(kernels::sum_of_squares(gpu.back().narrow(0, 0)), 0.0);
}

}  // namespace
}  // namespace octet
