#pragma once
// The exact result of an FP8 GEMM, and how far Hopper's FP8 tensor cores may stray from it, element
// by element. Every test of an FP8 GEMM on the GPU compares against this one bound.
//
//   out[i, j] = sa·sb·Σ_k a[i, k]·b[j, k] + bias[j] + old[i, j]      (kernels/fp8_gemm.h)
//
// The reference is float64 from the exact FP8-decoded operands. A product of two FP8 values is
// exact (4×4 significand bits); their sum is exact in f64 too for e4m3·e4m3 and all but exact for
// the pairs with e5m2 (the products span at most ~50 binades plus log2 k carry bits).
//
// What Hopper does (why f32 "exact products, f32 sums" is the wrong model):
//   - The FP8 tensor cores do not accumulate in f32. NVIDIA does not document it; the DeepSeek-V3
//     report measured that the accumulation of FP8 GEMMs on H800 keeps about 14 bits (a maximum
//     relative error near 2% for K = 4096 without promotion), and bit-accurate models of the H100's
//     tensor cores (Khattak and Mikaitis, building on the Fasi–Higham–Mikaitis–Pranesh study of
//     V100/T4/A100) describe each FP8 MMA step as a block fused multiply-add: a group of 32
//     products (two interleaved groups of 16) and the running accumulator c are aligned to the
//     largest exponent among them, every operand is truncated toward zero 13 fraction bits below
//     that exponent (c included), and the aligned terms are summed exactly.
//   - cuBLASLt without CUBLASLT_MATMUL_DESC_FAST_ACCUM periodically promotes the tensor-core
//     accumulator into an f32 register (CUTLASS's FP8 mainloop does it every 4 MMAs, K = 128;
//     DeepSeek-V3 uses the same interval); with fast accumulation it never does. We take split-K
//     and stream-K partial sums to be added in f32 (a reduction in bf16 would add about one bf16
//     rounding of R per split, which the slack below absorbs for a few splits at the k where
//     cuBLASLt splits at all).
//   - The epilogue scales the f32 sum by sa·sb, adds beta·old and the bias in f32, and rounds once
//     to the output type (twice where the bias is added by a separate kernel).
//
// The bound. Let u = 2^-13 and let R be the largest |sum of a contiguous range of products| (the
// range of the exact prefix sums P_t = Σ_{k<t} a_k·b_k). Every accumulator the tensor cores hold,
// promoted or not, split or not, is the sum of a contiguous range of k, so its magnitude is at
// most R plus the error made so far. One block FMA truncates each of its ≤ 33 operands by less
// than u times the largest of them. Two parts:
//   - the accumulator's own truncation, toward zero and so biased: at most u·R per block, over at
//     most ceil(k/16) blocks (we allow groups of 16 to be safe);
//   - the products' truncations, each pointing against its product's sign: with operands of random
//     sign (every test here draws them from a normal law) they are zero-mean and independent, each
//     below u·R, so by Azuma–Hoeffding their sum exceeds 8·sqrt(k)·u·R with probability below
//     2·exp(-32) ≈ 3e-14 per element.
//   Promotions and split-K reductions add at most (ceil(k/16) + 16) f32 roundings of size ≤ R.
//   So γ = 2^-13·(ceil(k/16) + 8·sqrt(k)) + 2^-24·(ceil(k/16) + 16), and since the accumulator
//   itself may exceed R by the error, |acc - Σp| ≤ γ/(1 - γ)·R.
//   Then the epilogue: four f32 roundings and two roundings to the output type (u_out = 2^-24 for
//   f32, 2^-8 for bf16) of at most |sa·sb|·(|Σp| + error) + |old| + |bias|.
//
// How tight: a software model of the block FMA above (tests/cuda/test_cuda_fp8_gemm.cpp), run on
// the tests' random data, uses at most ~5% of the bound without promotion and ~1% with it (~11% if
// the accumulator kept only 12 fraction bits instead of 13). The bound is still small against the
// result: γ is 0.004 at k = 16, 0.03 at k = 768 and 0.08 at k = 3072, R is typically twice |Σp|,
// and the median bound is 8% of |out| at k = 768 and 19% at k = 3072. So a scale off by 2x fails
// on >90% of the elements, a transposed operand or an operand decoded as the other FP8 format on
// >90% too, and a dropped bias fails (the Fp8GemmBound tests check these). A bf16 output adds its
// own 2^-8.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace octet::testing {

struct Fp8GemmReference {
  int64_t m = 0, n = 0, k = 0;
  DType out = DType::f32;
  double gamma = 0;            // the accumulation's bound relative to R (see the top of the file)
  std::vector<double> want;    // [m·n], row-major: the exact result
  std::vector<double> bound;   // [m·n]: the most |got - want| may be
  std::vector<double> range;   // [m·n]: R, the largest |sum of a contiguous range of products|
};

// γ of the bound above for a reduction over k products.
inline double fp8_accumulation_gamma(int64_t k) {
  const double blocks = std::ceil(static_cast<double>(k) / 16.0);
  return std::ldexp(1.0, -13) * (blocks + 8.0 * std::sqrt(static_cast<double>(k))) +
         std::ldexp(1.0, -24) * (blocks + 16.0);
}

// The unit roundoff of the output dtype: half its relative spacing.
inline double output_roundoff(DType out) { return out == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -24); }

// a: [m, k] FP8, b: [n, k] FP8, scale_invs [1] f32 (any device); bias [n] and old [m, n] in the
// output dtype or undefined (old is the output's previous value under accumulate).
inline Fp8GemmReference fp8_gemm_reference(const Tensor& a, const Tensor& scale_inv_a, const Tensor& b,
                                           const Tensor& scale_inv_b, DType out, const Tensor& bias = Tensor(),
                                           const Tensor& old = Tensor()) {
  Fp8GemmReference r;
  r.m = a.size(0), r.k = a.size(1), r.n = b.size(0), r.out = out;
  r.gamma = fp8_accumulation_gamma(r.k);
  EXPECT_EQ(b.size(1), r.k) << "fp8_gemm_reference: a " << a.describe() << ", b " << b.describe();
  EXPECT_LT(r.gamma, 0.5) << "k = " << r.k << " is too long for the bound";
  const double scale = scale_inv_a.to_vector<double>().at(0) * scale_inv_b.to_vector<double>().at(0);
  const std::vector<double> a64 = a.to_vector<double>(), b64 = b.to_vector<double>();
  const std::vector<double> bias64 = bias.defined() ? bias.to_vector<double>() : std::vector<double>(r.n, 0.0);
  const std::vector<double> old64 = old.defined() ? old.to_vector<double>() : std::vector<double>(r.m * r.n, 0.0);
  const int64_t m = r.m, n = r.n, k = r.k;
  std::vector<double> bt(static_cast<size_t>(k * n));  // b transposed, so the inner loop runs over j
  for (int64_t j = 0; j < n; ++j)
    for (int64_t t = 0; t < k; ++t) bt[t * n + j] = b64[j * k + t];
  r.want.assign(m * n, 0.0);
  r.bound.assign(m * n, 0.0);
  r.range.assign(m * n, 0.0);
  const double growth = r.gamma / (1.0 - r.gamma);
  const double epilogue = 4.0 * std::ldexp(1.0, -24) + 2.0 * output_roundoff(out);
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t i = 0; i < m; ++i) {
    std::vector<double> sum(n, 0.0), hi(n, 0.0), lo(n, 0.0);  // the prefix sum and its extremes
    for (int64_t t = 0; t < k; ++t) {
      const double ai = a64[i * k + t];
      const double* bk = &bt[t * n];
      for (int64_t j = 0; j < n; ++j) {
        sum[j] += ai * bk[j];
        hi[j] = std::max(hi[j], sum[j]);
        lo[j] = std::min(lo[j], sum[j]);
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t e = i * n + j;
      const double range = hi[j] - lo[j];
      const double accumulation_error = std::abs(scale) * growth * range;
      const double terms =
          std::abs(scale) * std::abs(sum[j]) + accumulation_error + std::abs(old64[e]) + std::abs(bias64[j]);
      r.want[e] = scale * sum[j] + bias64[j] + old64[e];
      r.range[e] = range;
      r.bound[e] = accumulation_error + epilogue * terms;
    }
  }
  return r;
}

// Every element of `got` (any device, [m, n]) within the bound. On failure names the element whose
// error is the largest multiple of its bound, and how many elements are over. `worst_fraction`,
// when given, receives the largest |got - want| / bound.
inline ::testing::AssertionResult within_fp8_gemm_bound(const Tensor& got, const Fp8GemmReference& ref,
                                                        double* worst_fraction = nullptr) {
  if (got.shape() != Shape({ref.m, ref.n})) {
    return ::testing::AssertionFailure() << got.describe() << " should be [" << ref.m << ", " << ref.n << "]";
  }
  if (got.dtype() != ref.out) {
    return ::testing::AssertionFailure() << got.describe() << " should be " << dtype_name(ref.out);
  }
  const std::vector<double> g = got.to_vector<double>();
  int64_t worst = 0, over = 0;
  double worst_ratio = -1;
  for (size_t e = 0; e < g.size(); ++e) {
    const double err = std::abs(g[e] - ref.want[e]);
    if (!(err <= ref.bound[e])) ++over;  // NaN fails too; a zero bound demands an exact result
    const double ratio = std::isnan(err) ? INFINITY : ref.bound[e] > 0 ? err / ref.bound[e] : err > 0 ? INFINITY : 0.0;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = static_cast<int64_t>(e);
    }
  }
  if (worst_fraction != nullptr) *worst_fraction = worst_ratio;
  if (over == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << over << " of " << g.size() << " elements exceed the FP8 accumulation bound (k = " << ref.k
         << ", gamma = " << ref.gamma << ", out " << dtype_name(ref.out) << "); worst at [" << worst / ref.n << ", "
         << worst % ref.n << "]: got " << g[worst] << ", want " << ref.want[worst] << ", |error| "
         << std::abs(g[worst] - ref.want[worst]) << " against a bound of " << ref.bound[worst] << " (R = "
         << ref.range[worst] << ")";
}

}  // namespace octet::testing
