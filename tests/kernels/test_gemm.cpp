// GEMM against a float64 triple loop, over transposes, batches, shared weights, accumulation and
// low-precision operands.
#include <gtest/gtest.h>

#include <limits>
#include <tuple>

#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::all_close;
using testing::random_tensor;

// C = alpha · op(A) · op(B) + beta · C0 in double, batch by batch; b_shared reuses B.
std::vector<double> reference_gemm(const std::vector<double>& a, bool ta, const std::vector<double>& b, bool tb,
                                   const std::vector<double>& c0, int64_t batch, int64_t m, int64_t n, int64_t k,
                                   bool b_shared, double alpha, double beta) {
  std::vector<double> c(batch * m * n);
  for (int64_t s = 0; s < batch; ++s) {
    const double* A = a.data() + s * m * k;
    const double* B = b.data() + (b_shared ? 0 : s * k * n);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p) acc += (ta ? A[p * m + i] : A[i * k + p]) * (tb ? B[j * k + p] : B[p * n + j]);
        const int64_t idx = s * m * n + i * n + j;
        c[idx] = alpha * acc + (beta != 0 ? beta * c0[idx] : 0.0);
      }
    }
  }
  return c;
}

struct GemmCase {
  int64_t batch, m, n, k;
  bool ta, tb, b_shared;
};

class GemmTest : public ::testing::TestWithParam<std::tuple<GemmCase, DType>> {};

TEST_P(GemmTest, MatchesFloat64Reference) {
  const auto [cs, dtype] = GetParam();
  const Shape a_shape = cs.ta ? Shape{cs.batch, cs.k, cs.m} : Shape{cs.batch, cs.m, cs.k};
  Shape b_shape = cs.tb ? Shape{cs.n, cs.k} : Shape{cs.k, cs.n};
  if (!cs.b_shared) b_shape.insert(b_shape.begin(), cs.batch);
  const Tensor a = random_tensor(a_shape, dtype, 11);
  const Tensor b = random_tensor(b_shape, dtype, 12);
  Tensor c = random_tensor({cs.batch, cs.m, cs.n}, dtype == DType::f64 ? DType::f64 : DType::f32, 13);
  const std::vector<double> c0 = c.to_vector<double>();
  const double alpha = 0.75, beta = 0.5;
  kernels::gemm(a, cs.ta, b, cs.tb, c, alpha, beta);
  // The reference sees the same rounded operands (to_vector widens the stored bf16/FP8 values).
  const auto expected = reference_gemm(a.to_vector<double>(), cs.ta, b.to_vector<double>(), cs.tb, c0, cs.batch, cs.m,
                                       cs.n, cs.k, cs.b_shared, alpha, beta);
  const double tol = dtype == DType::f64 ? 1e-11 : 1e-5 * std::sqrt(static_cast<double>(cs.k)) * 4;
  EXPECT_TRUE(all_close(c, expected, tol, tol));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmTest,
    ::testing::Combine(::testing::Values(GemmCase{1, 1, 1, 1, false, false, true}, GemmCase{1, 7, 5, 3, false, false, true},
                                         GemmCase{1, 7, 5, 3, true, false, true}, GemmCase{1, 7, 5, 3, false, true, true},
                                         GemmCase{1, 7, 5, 3, true, true, true}, GemmCase{3, 33, 17, 65, false, true, true},
                                         GemmCase{4, 16, 9, 31, false, false, false},
                                         GemmCase{4, 16, 9, 31, true, true, false},
                                         GemmCase{2, 64, 48, 130, true, false, false},
                                         // Past 2^18 multiply-adds a single GEMM is split across threads.
                                         GemmCase{1, 300, 130, 70, false, true, true},
                                         GemmCase{1, 257, 129, 65, true, false, true},
                                         GemmCase{1, 1000, 41, 20, true, true, true}),
                       ::testing::Values(DType::f32, DType::f64, DType::bf16, DType::e4m3)));

TEST(Gemm, MixedFp8OperandsAndBf16Output) {
  // dgrad-style: E5M2 gradient times E4M3 weight, bf16 result rounded once from f32.
  const Tensor dy = random_tensor({6, 10}, DType::e5m2, 21);
  const Tensor w = random_tensor({10, 12}, DType::e4m3, 22);
  const Tensor dx = kernels::matmul(dy, w, false, false, DType::bf16);
  ASSERT_EQ(dx.dtype(), DType::bf16);
  auto expected = reference_gemm(dy.to_vector<double>(), false, w.to_vector<double>(), false, {}, 1, 6, 12, 10, true,
                                 1.0, 0.0);
  // One bf16 rounding of an f32-accurate value: relative error <= 2^-8.
  EXPECT_TRUE(all_close(dx, expected, 1e-5, 1.0 / 256));
  // And the result is exactly the bf16 rounding of the f32 GEMM.
  const Tensor dx32 = kernels::matmul(dy, w, false, false, DType::f32);
  EXPECT_TRUE(all_close(dx, dx32.to(DType::bf16), 0, 0));
}

TEST(Gemm, BatchedInputTimesSharedWeightIsOneLinear) {
  // [B, S, K] · Wᵀ with W [N, K], the Linear forward.
  const Tensor x = random_tensor({3, 5, 8}, DType::f32, 31);
  const Tensor w = random_tensor({4, 8}, DType::f32, 32);
  const Tensor y = kernels::matmul(x, w, false, true);
  EXPECT_EQ(y.shape(), (Shape{3, 5, 4}));
  auto expected = reference_gemm(x.to_vector<double>(), false, w.to_vector<double>(), true, {}, 1, 15, 4, 8, true, 1, 0);
  EXPECT_TRUE(all_close(y, expected, 1e-5, 1e-5));
}

// beta = 0: C's old values are never read, NaN included (as in BLAS), on the tile kernels (n = 64)
// and OpenBLAS (n = 400, wider than the tiles take); a bf16 C is not widened first, and its result is
// the one matmul rounds once.
TEST(Gemm, BetaZeroIgnoresWhatCHeld) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t n : {64, 400}) {
      const Tensor a = random_tensor({70, 48}, dtype, 7), b = random_tensor({48, n}, dtype, 8);
      Tensor c = full({70, n}, std::numeric_limits<double>::quiet_NaN(), dtype);
      kernels::gemm(a, false, b, false, c, 1.0, 0.0);
      EXPECT_TRUE(all_close(c, kernels::matmul(a, b), 0, 0)) << dtype_name(dtype) << " n=" << n;
    }
  }
}

// k = 0: the product is an empty sum, so c = beta·c (BLAS itself leaves c untouched then).
TEST(Gemm, EmptyReductionGivesBetaTimesC) {
  const Tensor a = empty({3, 0}), b = empty({0, 4});
  Tensor c = random_tensor({3, 4}, DType::f32, 5);
  const Tensor before = c.clone();
  kernels::gemm(a, false, b, false, c, 1.0, 0.5);
  EXPECT_TRUE(all_close(c, kernels::mul_scalar(before, 0.5), 0, 0));
  Tensor batched = full({2, 3, 4}, 7.0);
  kernels::gemm(empty({2, 3, 0}), false, empty({2, 0, 4}), false, batched, 1.0, 0.0);
  EXPECT_TRUE(all_close(batched, zeros({2, 3, 4}), 0, 0));
}

TEST(Gemm, ErrorsNameTheShapes) {
  const Tensor a = random_tensor({3, 4});
  const Tensor b = random_tensor({5, 6});
  try {
    kernels::matmul(a, b);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("matmul"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3, 4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[5, 6]"), std::string::npos) << msg;
  }
  Tensor c = zeros({3, 7});
  EXPECT_THROW(kernels::gemm(a, false, random_tensor({4, 6}), false, c), Error);
  EXPECT_THROW(kernels::matmul(random_tensor({2, 3, 4}), random_tensor({3, 4, 5})), Error);  // batch mismatch
}

}  // namespace
}  // namespace octet
