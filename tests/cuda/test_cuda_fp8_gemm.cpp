// The cuBLASLt FP8 GEMM against the CPU emulation (kernels/fp8_gemm.h) on the same FP8 inputs and
// scales: every allowed dtype pair, f32 and bf16 outputs, odd m, ViT-sized problems (the fprop of a
// ViT-B qkv projection over 8 images, and a wgrad with its token count padded to a multiple of 16),
// bias and accumulate, fast accumulation, and scale_inv views into a layer's FP8 state. The two
// differ only by accumulation order, so the norm-wise relative error ||gpu - cpu||_2 / ||cpu||_2 (in
// f64) must be at most 1e-5 for f32 outputs, 2e-3 with fast accumulation (Hopper then keeps partial
// sums in its tensor cores' reduced precision for longer), and 1e-2 for bf16 outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kernels/fp8_gemm.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::random_tensor;
using testing::relative_error_to_reference;
using testing::throws_with;

double max_of(DType fp8) { return fp8 == DType::e4m3 ? 448.0 : 57344.0; }

// Normal values with standard deviation max/64: well inside the format's range, almost none zero.
Tensor random_fp8(const Shape& shape, DType fp8, uint64_t seed) {
  return random_tensor(shape, DType::f32, seed, max_of(fp8) / 64).to(fp8);
}

Tensor scalar_f32(float value) { return from_vector<float>({value}, {1}); }

struct Case {
  int64_t m, k, n;
  DType a, b, out;
  bool bias, accumulate, fast_accumulate;
};

std::string describe(const Case& c) {
  return std::string(dtype_name(c.a)) + "·" + dtype_name(c.b) + " -> " + dtype_name(c.out) + " m=" +
         std::to_string(c.m) + " k=" + std::to_string(c.k) + " n=" + std::to_string(c.n) +
         " bias=" + std::to_string(c.bias) + " accumulate=" + std::to_string(c.accumulate) +
         " fast_accumulate=" + std::to_string(c.fast_accumulate);
}

double tolerance(const Case& c) {
  if (c.out == DType::bf16) return 1e-2;
  return c.fast_accumulate ? 2e-3 : 1e-5;
}

// Runs the case on both devices from the same inputs and compares.
void check_case(const Case& c, uint64_t seed) {
  const Tensor a = random_fp8({c.m, c.k}, c.a, seed), b = random_fp8({c.n, c.k}, c.b, seed + 1);
  const Tensor scale_inv_a = scalar_f32(0.37f), scale_inv_b = scalar_f32(3.1f);
  // The bias and old out on the product's scale, so that a dropped term would fail the comparison.
  const double product_rms = max_of(c.a) / 64 * max_of(c.b) / 64 * std::sqrt(double(c.k)) * 0.37 * 3.1;
  const Tensor bias = c.bias ? random_tensor({c.n}, c.out, seed + 2, product_rms) : Tensor();
  const Tensor old = random_tensor({c.m, c.n}, c.out, seed + 3, product_rms);

  const Tensor want = old.clone();
  kernels::fp8_gemm(a, scale_inv_a, b, scale_inv_b, want, bias, c.accumulate, c.fast_accumulate);
  const Tensor got = old.to(kGpu);
  kernels::fp8_gemm(a.to(kGpu), scale_inv_a.to(kGpu), b.to(kGpu), scale_inv_b.to(kGpu), got,
                    c.bias ? bias.to(kGpu) : Tensor(), c.accumulate, c.fast_accumulate);
  EXPECT_TRUE(got.is_cuda());
  EXPECT_LE(relative_error_to_reference(got, want), tolerance(c)) << describe(c);
}

struct DTypePair {
  DType a, b;
};
const DTypePair kAllowedPairs[] = {{DType::e4m3, DType::e4m3}, {DType::e4m3, DType::e5m2}, {DType::e5m2, DType::e4m3}};

TEST(CudaFp8Gemm, MatchesTheCpuEmulationOnSmallAndOddShapes) {
  SKIP_WITHOUT_GPU();
  const int64_t shapes[][3] = {{1, 16, 16}, {37, 48, 32}, {197, 768, 112}, {197, 96, 768}};
  uint64_t seed = 10;
  for (DTypePair pair : kAllowedPairs) {
    for (DType out : {DType::f32, DType::bf16}) {
      for (const auto& s : shapes) {
        for (bool fast : {false, true}) {
          check_case({s[0], s[1], s[2], pair.a, pair.b, out, false, false, fast}, seed);
          seed += 4;
        }
      }
    }
  }
}

TEST(CudaFp8Gemm, MatchesTheCpuEmulationWithBiasAndAccumulate) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 500;
  for (DTypePair pair : kAllowedPairs) {
    for (DType out : {DType::f32, DType::bf16}) {
      for (bool bias : {false, true}) {
        for (bool accumulate : {false, true}) {
          check_case({37, 48, 32, pair.a, pair.b, out, bias, accumulate, false}, seed);
          check_case({197, 768, 2304, pair.a, pair.b, out, bias, accumulate, true}, seed + 4);
          seed += 8;
        }
      }
    }
  }
}

// The ViT-B problems of an FP8 Linear: the qkv fprop over 8 images of 197 tokens (x E4M3 · W E4M3,
// bf16 out, bias, fast accumulation), and the fc1 wgrad dW[3072, 768] = dyᵀ·x with the 1576 tokens
// padded to 1584 (dyᵀ E5M2 · xᵀ E4M3, accumulated into an f32 gradient) and its dgrad (dy E5M2 · W
// E4M3).
TEST(CudaFp8Gemm, MatchesTheCpuEmulationOnVitSizedProblems) {
  SKIP_WITHOUT_GPU();
  check_case({1576, 768, 2304, DType::e4m3, DType::e4m3, DType::bf16, true, false, true}, 900);
  check_case({1576, 768, 2304, DType::e4m3, DType::e4m3, DType::f32, false, false, false}, 910);
  check_case({768, 1584, 3072, DType::e5m2, DType::e4m3, DType::f32, false, true, false}, 920);
  check_case({768, 1584, 3072, DType::e5m2, DType::e4m3, DType::bf16, false, false, false}, 930);
  check_case({1576, 3072, 768, DType::e5m2, DType::e4m3, DType::bf16, false, false, false}, 940);
}

// A layer's FP8 state keeps its scale_invs side by side in one [n] tensor; the GEMM reads [1] views
// of it at an offset, on the device, without copying them to the host.
TEST(CudaFp8Gemm, ReadsScaleInvViewsOfAnFp8State) {
  SKIP_WITHOUT_GPU();
  const Tensor a = random_fp8({37, 64}, DType::e4m3, 1), b = random_fp8({48, 64}, DType::e5m2, 2);
  const Tensor state = from_vector<float>({0.5f, 0.37f, 3.1f}, {3});
  const Tensor want = empty({37, 48}, DType::f32);
  kernels::fp8_gemm(a, state.narrow(1, 1), b, state.narrow(2, 1), want);
  const Tensor state_gpu = state.to(kGpu);
  const Tensor got = empty({37, 48}, DType::f32, kGpu);
  kernels::fp8_gemm(a.to(kGpu), state_gpu.narrow(1, 1), b.to(kGpu), state_gpu.narrow(2, 1), got);
  EXPECT_LE(relative_error_to_reference(got, want), 1e-5);
}

TEST(CudaFp8Gemm, RefusesOperandsOnTwoDevices) {
  SKIP_WITHOUT_GPU();
  const Tensor a = random_fp8({5, 32}, DType::e4m3, 1), b = random_fp8({16, 32}, DType::e4m3, 2);
  const Tensor out = empty({5, 16}, DType::bf16, kGpu);
  EXPECT_TRUE(throws_with([&] { kernels::fp8_gemm(a.to(kGpu), scalar_f32(1), b, scalar_f32(1).to(kGpu), out); },
                          {"fp8_gemm", "different devices"}));
}

}  // namespace
}  // namespace octet
