// The CUDA FP8 kernels against the CPU kernels on the same inputs. Both compute every byte and every
// scale with the same host/device code (core/float_formats.h, kernels/fp8_scale_rule.h) and amax is an
// exact maximum, so every comparison here is bit for bit (same_bits), NaN payloads included.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>
#include <vector>

#include "kernels/fp8.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/kernels/fp8_cast_case.h"
#include "tests/testing.h"

namespace octet {
namespace {

using kernels::AmaxCompute;
using kernels::Fp8ScalingTensors;
using testing::kGpu;
using testing::random_tensor;
using testing::same_bits;
using testing::uniform_tensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Standard-normal values times `spread`, with a few spikes far beyond the FP8 range (they saturate).
Tensor spiky_input(const Shape& shape, DType dtype, uint64_t seed, double spread) {
  Tensor x = random_tensor(shape, DType::f32, seed, spread);
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); i += 997) p[i] = (i % 2 ? -1.f : 1.f) * 1e6f;
  return x.to(dtype);
}

using octet::testing::CastCase;

// Casts x on both devices (amax starting from the same non-zero value) and compares everything.
void expect_same_cast(const Tensor& x_cpu, DType format, bool rowwise, bool transposed, int64_t pad_rows_to) {
  const Tensor scale = full({1}, 37.0);
  const Tensor amax_cpu = full({1}, 0.75), amax_gpu = amax_cpu.to(kGpu);
  const auto cpu = kernels::fp8_cast(x_cpu, scale, amax_cpu, format, rowwise, transposed, pad_rows_to);
  const auto gpu = kernels::fp8_cast(x_cpu.to(kGpu), scale.to(kGpu), amax_gpu, format, rowwise, transposed, pad_rows_to);
  EXPECT_EQ(gpu.data.defined(), rowwise);
  EXPECT_EQ(gpu.transposed.defined(), transposed);
  if (rowwise) {
    EXPECT_TRUE(gpu.data.is_cuda());
    EXPECT_TRUE(same_bits(gpu.data, cpu.data)) << "row-major copy";
  }
  if (transposed) {
    EXPECT_TRUE(same_bits(gpu.transposed, cpu.transposed)) << "transposed copy";
  }
  EXPECT_TRUE(same_bits(gpu.scale_inv, cpu.scale_inv)) << "scale_inv";
  EXPECT_TRUE(same_bits(amax_gpu, amax_cpu)) << "amax";
}

class CudaFp8CastKernel : public ::testing::TestWithParam<CastCase> {};

TEST_P(CudaFp8CastKernel, MatchesTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const CastCase c = GetParam();
  const Tensor x = spiky_input(c.shape, c.input, 40 + c.shape.numel(), 3.0);
  expect_same_cast(x, c.format, true, true, c.pad_rows_to);
  expect_same_cast(x, c.format, true, false, c.pad_rows_to);
  expect_same_cast(x, c.format, false, true, c.pad_rows_to);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaFp8CastKernel,
                         ::testing::Values(CastCase{{1000, 768}, DType::bf16, DType::e4m3, 16},
                                           CastCase{{1000, 768}, DType::f32, DType::e5m2, 16},
                                           CastCase{{197, 3072}, DType::bf16, DType::e5m2, 16},
                                           CastCase{{197, 3072}, DType::f32, DType::e4m3, 16},
                                           CastCase{{4, 197, 96}, DType::bf16, DType::e4m3, 16},
                                           CastCase{{37, 53}, DType::f32, DType::e4m3, 16},
                                           CastCase{{37, 53}, DType::bf16, DType::e5m2, 1},
                                           CastCase{{1, 17}, DType::bf16, DType::e4m3, 16},
                                           CastCase{{129, 16}, DType::f32, DType::e4m3, 7},
                                           CastCase{{65, 1}, DType::bf16, DType::e5m2, 16},
                                           CastCase{{3, 5, 7}, DType::f16, DType::e4m3, 16},
                                           CastCase{{130, 130}, DType::f16, DType::e5m2, 3},
                                           CastCase{{0, 64}, DType::bf16, DType::e4m3, 16}));

// An input that starts one element into its storage: the GPU takes its unaligned (scalar) path.
TEST(CudaFp8Cast, UnalignedInputMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (DType d : {DType::f32, DType::bf16}) {
    const Tensor storage = spiky_input({1 + 96 * 64}, d, 77, 4.0);
    const Tensor x = storage.narrow(1, 96 * 64).reshape({96, 64});
    expect_same_cast(x, DType::e4m3, true, true, 16);
  }
}

TEST(CudaFp8Cast, NaNAndInfMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (DType d : {DType::f32, DType::bf16}) {
    Tensor x = random_tensor({70, 90}, DType::f32, 5);
    x.data<float>()[123] = -kInf;
    expect_same_cast(x.to(d), DType::e5m2, true, true, 16);
    x.data<float>()[4000] = kNaN;
    expect_same_cast(x.to(d), DType::e4m3, true, true, 16);
  }
}

TEST(CudaFp8Amax, MatchesTheCpuForEveryInputDtype) {
  SKIP_WITHOUT_GPU();
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{100003}, (int64_t{1} << 22) + 3}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(d) << ", n " << n);
      const Tensor storage = random_tensor({n + 1}, d, 90 + n, 2.0);
      for (const Tensor& x : {storage.narrow(0, n), storage.narrow(1, n)}) {  // aligned, then not
        const Tensor amax_cpu = zeros({1}), amax_gpu = zeros({1}, DType::f32, kGpu);
        kernels::fp8_amax_(x, amax_cpu);
        kernels::fp8_amax_(x.to(kGpu), amax_gpu);
        EXPECT_TRUE(same_bits(amax_gpu, amax_cpu));
        EXPECT_GT(amax_cpu.item(), 0.0);
      }
    }
  }
}

// ---- scale updates --------------------------------------------------------------------------------------

struct GroupPair {
  std::vector<Fp8ScalingTensors> cpu, gpu;
};

Fp8ScalingTensors to_gpu(const Fp8ScalingTensors& g) {
  return {g.amax_history.to(kGpu), g.scale.to(kGpu), g.scale_inv.to(kGpu), g.fp8_dtype};
}

// 150 groups (three launches of at most 64), of history lengths 1 to 1024 and widths 1 to 1500 (more
// columns than one launch has blocks across), alternating formats; some columns hold amax 0, NaN,
// inf or a denormal.
GroupPair many_groups() {
  GroupPair pair;
  const std::vector<int64_t> lengths = {1, 4, 17, 1024, 2};
  const std::vector<int64_t> widths = {1, 2, 3, 300, 1500, 2};
  for (int i = 0; i < 150; ++i) {
    const int64_t L = lengths[i % lengths.size()], n = widths[i % widths.size()];
    Tensor history = uniform_tensor({L, n}, 1e-3, 300.0, DType::f32, 500 + i);
    float* h = history.data<float>();
    if (n >= 3 && (i / 6) % 2 == 0) {
      for (int64_t r = 0; r < L; ++r) h[r * n] = 0.f;  // column 0: amax 0
      h[(L - 1) * n + 1] = kNaN;                       // column 1: NaN in the oldest row
      h[2] = (i / 12) % 2 ? kInf : 1e-40f;             // column 2: inf or a denormal in row 0
    }
    const Tensor scale = uniform_tensor({n}, 0.5, 4.0, DType::f32, 900 + i);
    Fp8ScalingTensors g{history, scale, zeros({n}), i % 2 ? DType::e5m2 : DType::e4m3};
    pair.cpu.push_back(g);
    pair.gpu.push_back(to_gpu(g));
  }
  return pair;
}

void expect_same_groups(const GroupPair& pair) {
  for (size_t i = 0; i < pair.cpu.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "group " << i);
    EXPECT_TRUE(same_bits(pair.gpu[i].amax_history, pair.cpu[i].amax_history)) << "history";
    EXPECT_TRUE(same_bits(pair.gpu[i].scale, pair.cpu[i].scale)) << "scale";
    EXPECT_TRUE(same_bits(pair.gpu[i].scale_inv, pair.cpu[i].scale_inv)) << "scale_inv";
  }
}

TEST(CudaFp8UpdateScales, ManyGroupsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (AmaxCompute algo : {AmaxCompute::Max, AmaxCompute::MostRecent}) {
    SCOPED_TRACE(algo == AmaxCompute::Max ? "max" : "most recent");
    GroupPair pair = many_groups();
    for (int step = 0; step < 3; ++step) {
      const double margin = step == 1 ? 0.5 : 0.0;
      kernels::fp8_update_scales_(pair.cpu, margin, algo);
      kernels::fp8_update_scales_(pair.gpu, margin, algo);
      expect_same_groups(pair);
      // The next step's amaxes arrive in row 0.
      for (size_t i = 0; i < pair.cpu.size(); ++i) {
        const int64_t n = pair.cpu[i].amax_history.size(1);
        const Tensor head = uniform_tensor({n}, 0.01, 50.0, DType::f32, 2000 + 10 * i + step);
        pair.cpu[i].amax_history.select(0).copy_(head);
        pair.gpu[i].amax_history.select(0).copy_(head);
      }
    }
  }
}

TEST(CudaFp8ScaleFromAmax, MatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  Tensor amax = uniform_tensor({5000}, 1e-3, 1e4, DType::f32, 31);
  float* a = amax.data<float>();
  a[0] = 0.f;
  a[1] = kNaN;
  a[2] = kInf;
  a[3] = 1e-40f;
  for (DType format : {DType::e4m3, DType::e5m2}) {
    const Tensor scale_cpu = uniform_tensor({5000}, 0.5, 4.0, DType::f32, 32), scale_inv_cpu = zeros({5000});
    const Tensor scale_gpu = scale_cpu.to(kGpu), scale_inv_gpu = scale_inv_cpu.to(kGpu);
    kernels::fp8_scale_from_amax_(amax, scale_cpu, scale_inv_cpu, format, 1.0);
    kernels::fp8_scale_from_amax_(amax.to(kGpu), scale_gpu, scale_inv_gpu, format, 1.0);
    EXPECT_TRUE(same_bits(scale_gpu, scale_cpu)) << dtype_name(format);
    EXPECT_TRUE(same_bits(scale_inv_gpu, scale_inv_cpu)) << dtype_name(format);
  }
}

}  // namespace
}  // namespace octet
