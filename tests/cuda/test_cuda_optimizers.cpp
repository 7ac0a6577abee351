// CUDA multi-tensor AdamW, SGD and sum of squares against the CPU kernels on the same random inputs.
// The GPU updates use exactly rounded f32 operations in the CPU's order, so f32 results are expected
// to equal the CPU's bit for bit (tested separately); the other comparisons use the norm-wise
// relative error ||gpu - cpu||_2 / ||cpu||_2 in f64, at most 1e-5 for f32 and 1e-2 for bf16.
#include <gtest/gtest.h>

#include <utility>
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

// Sizes around the sum of squares' 65536-element chunk, odd sizes, one element, an empty tensor, and
// 42 small tensors: 50 in all, one launch. MultiTensorStepsOnViewsAndManyTensors below goes past one
// launch (512 tensors), with views at odd offsets and sizes around the updates' chunk and pack.
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

// ---- lists past one launch, views at odd offsets ----------------------------------------------------------

// Sizes around the 32768-element chunk and the 8-element pack of the update kernels, then enough
// small tensors (530 in all) that a call takes two launches of at most 512 tensors.
std::vector<int64_t> many_sizes() {
  std::vector<int64_t> sizes = {1, 7, 8, 9, 4095, 32767, 32768, 32769, 2 * 32768 + 13, 300001};
  for (int i = 0; i < 520; ++i) sizes.push_back(1 + (37 * i) % 97);
  return sizes;
}

// The same random values as a CPU tensor and a GPU tensor, each a view `offset` elements into a
// buffer of its own: an odd offset leaves the GPU view's pointer off 16-byte alignment, so that
// tensor takes the kernels' scalar loop.
struct Twin {
  Tensor cpu, gpu;
};
Twin twin(int64_t n, DType dtype, uint64_t seed, int64_t offset, double scale = 1.0) {
  const Tensor base = random_tensor({n + offset}, dtype, seed, scale);
  return {base.narrow(offset, n), base.to(kGpu).narrow(offset, n)};
}
// Positive values for AdamW's second moment, aligned.
Twin positive_twin(int64_t n, DType dtype, uint64_t seed) {
  const Tensor t = uniform_tensor({n}, 1e-4, 2e-2, dtype, seed);
  return {t, t.to(kGpu)};
}

// Every third entry's param and grad are views at odd offsets (so the entry runs unvectorised);
// the rest are aligned. Each dtype combination of the kernels, bitwise against the CPU.
TEST(CudaMultiTensor, StepsOnViewsAndManyTensorsAreBitwiseTheCpu) {
  SKIP_WITHOUT_GPU();
  const std::vector<int64_t> sizes = many_sizes();
  struct Combo {
    DType param, grad;
    bool master;
  };
  for (const Combo combo : {Combo{DType::bf16, DType::bf16, true}, Combo{DType::f16, DType::f16, true},
                            Combo{DType::f32, DType::f32, false}, Combo{DType::f32, DType::bf16, false},
                            Combo{DType::f64, DType::f64, false}}) {
    SCOPED_TRACE(::testing::Message() << "param " << dtype_name(combo.param) << ", grad " << dtype_name(combo.grad));
    const DType state = combo.param == DType::f64 ? DType::f64 : DType::f32;
    std::vector<kernels::SgdTensors> sgd_cpu, sgd_gpu;
    std::vector<kernels::AdamWTensors> adamw_cpu, adamw_gpu;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int64_t n = sizes[i], odd = i % 3 == 0 ? 1 : 0;
      const uint64_t seed = 7000 + 10 * i;
      // The param and its master, made afresh for each optimizer (both update them in place). With a
      // master, the param is the master rounded, as after a step, in a buffer of its own.
      auto param_and_master = [&] {
        const Twin weights = twin(n, state, seed, 0);
        if (!combo.master) return std::pair{twin(n, state, seed, odd), Twin{}};
        const Tensor padded = empty({n + odd}, combo.param);
        padded.narrow(odd, n).copy_(weights.cpu.to(combo.param));
        return std::pair{Twin{padded.narrow(odd, n), padded.to(kGpu).narrow(odd, n)}, weights};
      };
      const Twin g = twin(n, combo.grad, seed + 1, 3 * odd, 0.1);
      const auto [sgd_p, sgd_master] = param_and_master();
      const Twin buffer = twin(n, state, seed + 2, 0, 0.1);
      sgd_cpu.push_back({sgd_p.cpu, g.cpu, buffer.cpu, sgd_master.cpu});
      sgd_gpu.push_back({sgd_p.gpu, g.gpu, buffer.gpu, sgd_master.gpu});
      const auto [adamw_p, adamw_master] = param_and_master();
      const Twin m = twin(n, state, seed + 3, 0, 0.05), v = positive_twin(n, state, seed + 4);
      adamw_cpu.push_back({adamw_p.cpu, g.cpu, m.cpu, v.cpu, adamw_master.cpu});
      adamw_gpu.push_back({adamw_p.gpu, g.gpu, m.gpu, v.gpu, adamw_master.gpu});
    }
    for (int step = 0; step < 3; ++step) {
      kernels::sgd_step_multi_(sgd_cpu, 0.05, 0.9, 0.0, /*nesterov=*/step == 2, 1e-2, step == 0);
      kernels::sgd_step_multi_(sgd_gpu, 0.05, 0.9, 0.0, /*nesterov=*/step == 2, 1e-2, step == 0);
      kernels::adamw_step_multi_(adamw_cpu, 2e-3, 0.9, 0.95, 1e-8, 0.05, step + 1);
      kernels::adamw_step_multi_(adamw_gpu, 2e-3, 0.9, 0.95, 1e-8, 0.05, step + 1);
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "entry " << i << " of " << sizes[i] << " elements");
      EXPECT_TRUE(same_bits(sgd_gpu[i].param, sgd_cpu[i].param));
      EXPECT_TRUE(same_bits(sgd_gpu[i].momentum_buffer, sgd_cpu[i].momentum_buffer));
      EXPECT_TRUE(same_bits(adamw_gpu[i].param, adamw_cpu[i].param));
      EXPECT_TRUE(same_bits(adamw_gpu[i].exp_avg, adamw_cpu[i].exp_avg));
      EXPECT_TRUE(same_bits(adamw_gpu[i].exp_avg_sq, adamw_cpu[i].exp_avg_sq));
      if (combo.master) {
        EXPECT_TRUE(same_bits(sgd_gpu[i].master, sgd_cpu[i].master));
        EXPECT_TRUE(same_bits(adamw_gpu[i].master, adamw_cpu[i].master));
      }
    }
  }
}

// The f32 masters of a first bf16 step, one multi-tensor launch per dtype and 512 tensors: bitwise
// the single-tensor conversion (Tensor::to(f32) on the GPU) and the CPU's, for bf16 (521 tensors: two
// launches) and f16 in one call, odd sizes, views at odd offsets, and the values a widening must keep
// (inf, NaN, subnormals, -0).
TEST(CudaMultiTensor, WidenToF32IsTheSingleTensorConversionBitForBit) {
  SKIP_WITHOUT_GPU();
  const Tensor specials = from_vector<float>(
      {INFINITY, -INFINITY, NAN, 1e-40f, -3e-39f, -0.0f, 3.3e38f, 65504.f, 6e-8f, 1.0f / 3}, {10});
  std::vector<Tensor> sources;
  for (DType dtype : {DType::bf16, DType::f16}) sources.push_back(specials.to(dtype).to(kGpu));
  const std::vector<int64_t> sizes = many_sizes();
  for (size_t i = 0; i < sizes.size(); ++i) {
    const DType dtype = i % 50 == 49 ? DType::f16 : DType::bf16;
    sources.push_back(twin(sizes[i], dtype, 8000 + i, i % 3 == 0 ? 1 : 0).gpu);
  }
  std::vector<Tensor> destinations;
  for (const Tensor& s : sources) {
    // Views at odd offsets for the destinations too, of every fourth.
    const int64_t odd = destinations.size() % 4 == 1 ? 1 : 0;
    destinations.push_back(full({s.numel() + odd}, 7.0, DType::f32, kGpu).narrow(odd, s.numel()));
  }
  kernels::widen_to_f32_multi_(sources, destinations);
  for (size_t i = 0; i < sources.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "entry " << i);
    EXPECT_TRUE(same_bits(destinations[i], sources[i].to(DType::f32)));
    EXPECT_TRUE(same_bits(destinations[i], sources[i].to(Device::cpu()).to(DType::f32)));
  }
}

// The clip's scale over a list past one launch (one launch per dtype and 512 tensors: 540 of the 636
// are f32), views at odd offsets, every dtype: bitwise the CPU.
TEST(CudaMultiTensor, ClipScaleIsBitwiseTheCpu) {
  SKIP_WITHOUT_GPU();
  std::vector<Tensor> cpu, gpu;
  std::vector<int64_t> sizes = many_sizes();
  for (int i = 0; i < 105; ++i) sizes.push_back(1 + (53 * i) % 211);
  sizes.push_back(3 * 65536 + 5);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const DType dtype = i % 20 == 1 ? DType::bf16 : i % 20 == 2 ? DType::f16 : i % 20 == 3 ? DType::f64 : DType::f32;
    const Twin t = twin(sizes[i], dtype, 9000 + i, i % 3 == 0 ? 1 : 0);
    cpu.push_back(t.cpu);
    gpu.push_back(t.gpu);
  }
  const Tensor scale = from_vector<float>({0.37f}, Shape{1});
  kernels::scale_multi_(cpu, scale);
  kernels::scale_multi_(gpu, scale.to(kGpu));
  for (size_t i = 0; i < sizes.size(); ++i) EXPECT_TRUE(same_bits(gpu[i], cpu[i])) << "entry " << i;
  // The sum of squares over the same list (two launches per dtype group) against the CPU's.
  const double want = kernels::sum_of_squares_multi(cpu), got = kernels::sum_of_squares_multi(gpu);
  EXPECT_NEAR(got, want, 1e-12 * want);
  EXPECT_EQ(kernels::sum_of_squares_multi(gpu), got);
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
