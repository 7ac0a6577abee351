// The cuBLASLt FP8 GEMM against the exact float64 result of the same FP8 inputs and scales: every
// allowed dtype pair, f32 and bf16 outputs, odd m, ViT-sized problems (the fprop of a ViT-B qkv
// projection over 8 images, and a wgrad with its token count padded to a multiple of 16), bias and
// accumulate, fast accumulation, and scale_inv views into a layer's FP8 state.
//
// Hopper's FP8 tensor cores do not accumulate in f32, with or without fast accumulation, so every
// element must lie within the bound of tests/cuda/fp8_bound.h (derived there from what is published
// about Hopper's FP8 accumulation), not within f32 rounding of the exact sum. The Fp8GemmBound tests
// below run without a GPU: they check the bound against a software model of that accumulation, and
// that it still fails a wrong scale, a transposed operand, the other FP8 format and a dropped bias.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/fp8_gemm.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/cuda/fp8_bound.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::fp8_gemm_reference;
using testing::Fp8GemmReference;
using testing::kGpu;
using testing::random_tensor;
using testing::throws_with;
using testing::within_fp8_gemm_bound;

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

// Runs the case on the GPU and compares with the exact result, element by element.
void check_case(const Case& c, uint64_t seed) {
  const Tensor a = random_fp8({c.m, c.k}, c.a, seed), b = random_fp8({c.n, c.k}, c.b, seed + 1);
  const Tensor scale_inv_a = scalar_f32(0.37f), scale_inv_b = scalar_f32(3.1f);
  // The bias and old out on the product's scale, so that a dropped term would fail the comparison.
  const double product_rms = max_of(c.a) / 64 * max_of(c.b) / 64 * std::sqrt(double(c.k)) * 0.37 * 3.1;
  const Tensor bias = c.bias ? random_tensor({c.n}, c.out, seed + 2, product_rms) : Tensor();
  const Tensor old = random_tensor({c.m, c.n}, c.out, seed + 3, product_rms);

  const Tensor got = old.to(kGpu);
  kernels::fp8_gemm(a.to(kGpu), scale_inv_a.to(kGpu), b.to(kGpu), scale_inv_b.to(kGpu), got,
                    c.bias ? bias.to(kGpu) : Tensor(), c.accumulate, c.fast_accumulate);
  EXPECT_TRUE(got.is_cuda());
  const Fp8GemmReference want =
      fp8_gemm_reference(a, scale_inv_a, b, scale_inv_b, c.out, bias, c.accumulate ? old : Tensor());
  EXPECT_TRUE(within_fp8_gemm_bound(got, want)) << describe(c);
}

struct DTypePair {
  DType a, b;
};
const DTypePair kAllowedPairs[] = {{DType::e4m3, DType::e4m3}, {DType::e4m3, DType::e5m2}, {DType::e5m2, DType::e4m3}};

TEST(CudaFp8Gemm, MatchesTheExactResultOnSmallAndOddShapes) {
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

TEST(CudaFp8Gemm, MatchesTheExactResultWithBiasAndAccumulate) {
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

// An addend (a block's residual, read as cuBLASLt's C apart from D): the exact result with the addend
// where accumulate has the old out, within the same bound, and the addend unchanged. Small and odd, and
// ViT-B's fc2 and proj fprops (1576 tokens, 3072 -> 768 and 768 -> 768, E4M3·E4M3, bf16 out, bias,
// fast accumulation): a block adds both of its residuals so.
TEST(CudaFp8Gemm, MatchesTheExactResultWithAnAddend) {
  SKIP_WITHOUT_GPU();
  struct Shape3 {
    int64_t m, k, n;
  };
  uint64_t seed = 700;
  for (const Shape3 s : {Shape3{37, 48, 32}, Shape3{1576, 3072, 768}, Shape3{1576, 768, 768}}) {
    for (DType out : {DType::f32, DType::bf16}) {
      for (bool bias : {false, true}) {
        const Tensor a = random_fp8({s.m, s.k}, DType::e4m3, seed), b = random_fp8({s.n, s.k}, DType::e4m3, seed + 1);
        const Tensor scale_inv_a = scalar_f32(0.37f), scale_inv_b = scalar_f32(3.1f);
        const double product_rms = 448.0 / 64 * 448.0 / 64 * std::sqrt(double(s.k)) * 0.37 * 3.1;
        const Tensor b_vec = bias ? random_tensor({s.n}, out, seed + 2, product_rms) : Tensor();
        const Tensor addend = random_tensor({s.m, s.n}, out, seed + 3, product_rms);
        const Tensor addend_gpu = addend.to(kGpu);
        const Tensor got = full({s.m, s.n}, 7.0, out).to(kGpu);
        kernels::fp8_gemm(a.to(kGpu), scale_inv_a.to(kGpu), b.to(kGpu), scale_inv_b.to(kGpu), got,
                          bias ? b_vec.to(kGpu) : Tensor(), false, /*fast_accumulate=*/true, addend_gpu);
        const Fp8GemmReference want = fp8_gemm_reference(a, scale_inv_a, b, scale_inv_b, out, b_vec, addend);
        EXPECT_TRUE(within_fp8_gemm_bound(got, want))
            << "m=" << s.m << " k=" << s.k << " n=" << s.n << " " << dtype_name(out) << " bias=" << bias;
        EXPECT_TRUE(testing::same_bits(addend_gpu, addend));
        seed += 4;
      }
    }
  }
}

// The ViT-B problems of an FP8 Linear: the qkv fprop over 8 images of 197 tokens (x E4M3 · W E4M3,
// bf16 out, bias, fast accumulation), and the fc1 wgrad dW[3072, 768] = dyᵀ·x with the 1576 tokens
// padded to 1584 (dyᵀ E5M2 · xᵀ E4M3, accumulated into an f32 gradient) and its dgrad (dy E5M2 · W
// E4M3).
TEST(CudaFp8Gemm, MatchesTheExactResultOnVitSizedProblems) {
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
  const Tensor state_gpu = state.to(kGpu);
  const Tensor got = empty({37, 48}, DType::f32, kGpu);
  kernels::fp8_gemm(a.to(kGpu), state_gpu.narrow(1, 1), b.to(kGpu), state_gpu.narrow(2, 1), got);
  EXPECT_TRUE(within_fp8_gemm_bound(got, fp8_gemm_reference(a, state.narrow(1, 1), b, state.narrow(2, 1), DType::f32)));
}

// Every offset of a [4] state, so each of a's and b's scale_invs sits at 0, 4, 8 and 12 bytes from a
// 16-byte boundary (cuBLASLt refuses the unaligned ones; fp8_gemm copies those first), with and
// without a bias, f32 and bf16 out. The state's values are distinct, so a scale read from the wrong
// slot fails the bound.
TEST(CudaFp8Gemm, ScaleInvViewsAtEveryOffsetGiveTheExactResult) {
  SKIP_WITHOUT_GPU();
  const Tensor a = random_fp8({37, 64}, DType::e4m3, 11), b = random_fp8({48, 64}, DType::e5m2, 12);
  const Tensor state = from_vector<float>({0.5f, 0.37f, 3.1f, 1.75f}, {4});
  const Tensor state_gpu = state.to(kGpu);
  const Tensor a_gpu = a.to(kGpu), b_gpu = b.to(kGpu);
  for (DType out_dtype : {DType::f32, DType::bf16}) {
    const Tensor bias = random_tensor({48}, out_dtype, 13, 2e4);  // on the products' scale (~5e4)
    for (int64_t i = 0; i < 4; ++i) {
      const int64_t j = 3 - i;
      for (bool with_bias : {false, true}) {
        const Tensor got = empty({37, 48}, out_dtype, kGpu);
        kernels::fp8_gemm(a_gpu, state_gpu.narrow(i, 1), b_gpu, state_gpu.narrow(j, 1), got,
                          with_bias ? bias.to(kGpu) : Tensor());
        EXPECT_TRUE(within_fp8_gemm_bound(got, fp8_gemm_reference(a, state.narrow(i, 1), b, state.narrow(j, 1),
                                                                  out_dtype, with_bias ? bias : Tensor())))
            << dtype_name(out_dtype) << " scale_inv_a at byte " << 4 * i << ", scale_inv_b at byte " << 4 * j
            << (with_bias ? ", bias" : "");
      }
    }
  }
}

TEST(CudaFp8Gemm, RefusesOperandsOnTwoDevices) {
  SKIP_WITHOUT_GPU();
  const Tensor a = random_fp8({5, 32}, DType::e4m3, 1), b = random_fp8({16, 32}, DType::e4m3, 2);
  const Tensor out = empty({5, 16}, DType::bf16, kGpu);
  EXPECT_TRUE(throws_with([&] { kernels::fp8_gemm(a.to(kGpu), scalar_f32(1), b, scalar_f32(1).to(kGpu), out); },
                          {"fp8_gemm", "different devices"}));
}

// ---- the bound itself (no GPU needed) ----------------------------------------------------------------

// floor(log2 |x|) of a nonzero x.
int exponent_of(double x) {
  int e = 0;
  std::frexp(x, &e);
  return e - 1;
}

// x truncated toward zero to a multiple of 2^q.
double truncate_to(double x, int q) { return std::trunc(std::ldexp(x, -q)) * std::ldexp(1.0, q); }

// One output element of an FP8 GEMM as the published models of Hopper's tensor cores compute it
// (tests/cuda/fp8_bound.h): block FMAs over `group` products at a time and the running accumulator,
// every operand truncated toward zero 13 fraction bits below the block's largest exponent, summed
// exactly and kept in f32 (truncated). With `promote_every` > 0, the accumulator is added into an
// f32 register (round to nearest) and restarted after that many products: cuBLASLt without fast
// accumulation. Returns the f32 sum before scaling.
float modelled_hopper_dot(const double* a, const double* b, int64_t k, int64_t group, int64_t promote_every) {
  float promoted = 0.0f;
  double acc = 0.0;
  int64_t since_promotion = 0;
  std::vector<double> products(static_cast<size_t>(group));
  for (int64_t first = 0; first < k; first += group) {
    const int64_t count = std::min(group, k - first);
    int top = acc != 0.0 ? exponent_of(acc) : -100000;
    for (int64_t t = 0; t < count; ++t) {
      products[t] = a[first + t] * b[first + t];  // exact
      if (products[t] != 0.0) top = std::max(top, exponent_of(products[t]));
    }
    if (top == -100000) continue;  // all zero
    const int q = top - 13;
    double sum = truncate_to(acc, q);
    for (int64_t t = 0; t < count; ++t) sum += truncate_to(products[t], q);  // exact: few bits
    float kept = static_cast<float>(sum);
    if (std::abs(static_cast<double>(kept)) > std::abs(sum)) kept = std::nextafter(kept, 0.0f);  // truncation
    acc = kept;
    since_promotion += count;
    if (promote_every > 0 && since_promotion >= promote_every) {
      promoted += static_cast<float>(acc);
      acc = 0.0;
      since_promotion = 0;
    }
  }
  return promote_every > 0 ? promoted + static_cast<float>(acc) : static_cast<float>(acc);
}

// The model over a whole [m, n] output, scaled in f32 as cuBLASLt's epilogue does.
Tensor modelled_hopper_gemm(const Tensor& a, float scale_inv_a, const Tensor& b, float scale_inv_b, int64_t group,
                            int64_t promote_every) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  const std::vector<double> a64 = a.to_vector<double>(), b64 = b.to_vector<double>();
  const float scale = scale_inv_a * scale_inv_b;
  std::vector<float> out(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      out[i * n + j] = scale * modelled_hopper_dot(&a64[i * k], &b64[j * k], k, group, promote_every);
  return from_vector(out, {m, n});
}

TEST(Fp8GemmBound, HoldsForAModelOfHopperAccumulationAndForTheCpuEmulation) {
  struct Problem {
    int64_t k;
    DType a, b;
  };
  // The test file's longest reductions, with each dtype pair.
  for (const Problem& p : {Problem{3072, DType::e5m2, DType::e4m3}, Problem{1584, DType::e4m3, DType::e5m2},
                           Problem{768, DType::e4m3, DType::e4m3}}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(p.a) << "·" << dtype_name(p.b) << " k=" << p.k);
    const Tensor a = random_fp8({24, p.k}, p.a, 7 + p.k), b = random_fp8({32, p.k}, p.b, 8 + p.k);
    const Tensor scale_inv_a = scalar_f32(0.37f), scale_inv_b = scalar_f32(3.1f);
    const Fp8GemmReference want = fp8_gemm_reference(a, scale_inv_a, b, scale_inv_b, DType::f32);
    for (int64_t group : {16, 32}) {
      for (int64_t promote_every : {0, 128}) {
        SCOPED_TRACE(::testing::Message() << "group " << group << ", promoted every " << promote_every);
        double used = 0;
        EXPECT_TRUE(within_fp8_gemm_bound(modelled_hopper_gemm(a, 0.37f, b, 3.1f, group, promote_every), want, &used));
        // The model does truncate (else this check would prove nothing), and uses a small part of the
        // bound: the bound's slack is what a wrong model of the hardware could spend.
        EXPECT_GT(used, 0.0);
        EXPECT_LT(used, 0.25);
      }
    }
    for (DType out : {DType::f32, DType::bf16}) {
      const Tensor cpu = empty({24, 32}, out);
      kernels::fp8_gemm(a, scale_inv_a, b, scale_inv_b, cpu);
      EXPECT_TRUE(within_fp8_gemm_bound(cpu, fp8_gemm_reference(a, scale_inv_a, b, scale_inv_b, out)))
          << "CPU emulation, " << dtype_name(out);
    }
  }
}

// b [n, k] as the other FP8 format (the same bytes read as e5m2 where they were e4m3).
Tensor bytes_as(const Tensor& t, DType other) {
  const Tensor r = empty(t.shape(), other);
  std::memcpy(r.data_ptr(), t.data_ptr(), t.nbytes());
  return r;
}

// b [n, k] with n == k, transposed: what a GEMM reading b in the wrong layout multiplies by.
Tensor transposed(const Tensor& t) {
  const int64_t n = t.size(0), k = t.size(1);
  const Tensor r = empty({k, n}, t.dtype());
  const auto* src = static_cast<const uint8_t*>(t.data_ptr());
  auto* dst = static_cast<uint8_t*>(r.data_ptr());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) dst[j * n + i] = src[i * k + j];
  return r;
}

// The bound is loose enough for Hopper and still tight enough to catch what a broken GEMM would do,
// at the longest reduction the GPU tests use (k = 3072, where the bound is widest).
TEST(Fp8GemmBound, FailsAWrongScaleATransposedOperandTheOtherFormatAndADroppedBias) {
  const int64_t m = 24, k = 3072, n = 3072;  // n == k, so that b can be read transposed
  const Tensor a = random_fp8({m, k}, DType::e4m3, 61), b = random_fp8({n, k}, DType::e4m3, 62);
  const Tensor sa = scalar_f32(0.37f), sb = scalar_f32(3.1f);
  for (DType out : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(out));
    const double product_rms = 7.0 * 7.0 * std::sqrt(double(k)) * 0.37 * 3.1;
    const Tensor bias = random_tensor({n}, out, 63, product_rms);
    const Fp8GemmReference want = fp8_gemm_reference(a, sa, b, sb, out, bias);
    auto run = [&](const Tensor& a_used, const Tensor& sa_used, const Tensor& b_used, const Tensor& bias_used) {
      const Tensor result = empty({m, n}, out);
      kernels::fp8_gemm(a_used, sa_used, b_used, sb, result, bias_used);
      return result;
    };
    EXPECT_TRUE(within_fp8_gemm_bound(run(a, sa, b, bias), want)) << "the right GEMM";
    EXPECT_FALSE(within_fp8_gemm_bound(run(a, scalar_f32(2 * 0.37f), b, bias), want)) << "a scale twice too large";
    EXPECT_FALSE(within_fp8_gemm_bound(run(a, sa, transposed(b), bias), want)) << "b transposed";
    EXPECT_FALSE(within_fp8_gemm_bound(run(a, sa, bytes_as(b, DType::e5m2), bias), want)) << "b read as e5m2";
    EXPECT_FALSE(within_fp8_gemm_bound(run(a, sa, b, Tensor()), want)) << "the bias dropped";
  }
}

}  // namespace
}  // namespace octet
