// The CPU tile kernels (kernels/cpu/tile_gemm.h) against a float64 reference, with every tile shape
// and remainder; the claims their callers rely on (nothing written past n, C unread when beta is 0,
// an element's bits independent of where it sits); and the GEMM, Linear and attention paths that use
// them, each also run with the tiles switched off so that the OpenBLAS path stays covered.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "core/float_formats.h"
#include "kernels/attention.h"
#include "kernels/cpu/tile_gemm.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/linear.h"
#include "tests/testing.h"

namespace octet {
namespace {

namespace tg = kernels::cpu::tile_gemm;
using testing::all_close;
using testing::random_tensor;

#define SKIP_WITHOUT_TILES()                                                                              \
  if (!tg::available()) GTEST_SKIP() << "this CPU or build has no AVX-512 tile kernels (x86-64-v4 and GCC " \
                                        "needed); the OpenBLAS path runs instead and is tested below"

// Switches the tile kernels on or off for one scope.
class TilesEnabled {
 public:
  explicit TilesEnabled(bool on) : before_(tg::set_enabled(on)) {}
  ~TilesEnabled() { tg::set_enabled(before_); }
  TilesEnabled(const TilesEnabled&) = delete;
  TilesEnabled& operator=(const TilesEnabled&) = delete;

 private:
  bool before_;
};

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

struct TileCase {
  int64_t m, n, k;
  bool trans_a;
};
void PrintTo(const TileCase& c, std::ostream* os) {
  *os << "m=" << c.m << " n=" << c.n << " k=" << c.k << (c.trans_a ? " Aᵀ" : "");
}

class TileGemmTest : public ::testing::TestWithParam<TileCase> {};

// C = alpha·A·B + beta·C + bias with A read through its strides and B packed from its transpose,
// into a C with a wider leading dimension whose extra columns must stay as they were.
TEST_P(TileGemmTest, MatchesFloat64AndWritesOnlyItsColumns) {
  SKIP_WITHOUT_TILES();
  const TileCase t = GetParam();
  const int64_t m = t.m, n = t.n, k = t.k, ldc = n + 5;
  const auto a = random_floats(static_cast<size_t>(m * k), 1);      // A [m, k], or Aᵀ stored [k, m]
  const auto bt = random_floats(static_cast<size_t>(n * k), 2);     // B stored transposed, [n, k]
  const auto bias = random_floats(static_cast<size_t>(n), 3);
  auto c = random_floats(static_cast<size_t>(m * ldc), 4);
  const auto c0 = c;
  const int64_t ldb = tg::padded(n);
  std::vector<float> packed(static_cast<size_t>(k * ldb), std::numeric_limits<float>::quiet_NaN());
  tg::pack_transposed(bt.data(), k, n, k, packed.data(), ldb);
  const int64_t a_row = t.trans_a ? 1 : k, a_col = t.trans_a ? m : 1;
  const float alpha = 0.75f, beta = -0.5f;
  tg::multiply(m, n, k, alpha, a.data(), a_row, a_col, packed.data(), ldb, beta, c.data(), ldc, bias.data());
  int64_t wrong = 0, touched = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const size_t idx = static_cast<size_t>(i * ldc + j);
      if (j >= n) {
        touched += c[idx] != c0[idx];
        continue;
      }
      double dot = 0;
      for (int64_t p = 0; p < k; ++p) dot += double(a[i * a_row + p * a_col]) * double(bt[j * k + p]);
      const double expected = alpha * dot + beta * double(c0[idx]) + bias[j];
      wrong += std::abs(c[idx] - expected) > 1e-5 * (1 + std::sqrt(double(k)) * 4);
    }
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(touched, 0) << "wrote past column n";
}

// Every register tile (6×4, 8×3, 8×2 and their narrower remainders), row remainders of each, and
// k from 1 up.
INSTANTIATE_TEST_SUITE_P(Shapes, TileGemmTest,
                         ::testing::Values(TileCase{1, 1, 1, false}, TileCase{5, 16, 3, false}, TileCase{7, 17, 50, true},
                                           TileCase{13, 32, 7, false}, TileCase{8, 33, 5, true},
                                           TileCase{9, 48, 32, false}, TileCase{50, 49, 32, false},
                                           TileCase{6, 64, 1, true}, TileCase{50, 65, 50, true},
                                           TileCase{19, 100, 17, false}, TileCase{25, 130, 9, true},
                                           TileCase{12, 200, 64, false}));

TEST(TileGemm, BetaZeroNeverReadsC) {
  SKIP_WITHOUT_TILES();
  const int64_t m = 9, n = 40, k = 11;
  const auto a = random_floats(m * k, 5), b = random_floats(k * n, 6);
  std::vector<float> packed(static_cast<size_t>(k * tg::padded(n)));
  tg::pack_rows(b.data(), n, k, n, packed.data(), tg::padded(n));
  std::vector<float> c(static_cast<size_t>(m * n), std::numeric_limits<float>::quiet_NaN());
  tg::multiply(m, n, k, 1.0f, a.data(), k, 1, packed.data(), tg::padded(n), 0.0f, c.data(), n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0;
      for (int64_t p = 0; p < k; ++p) dot += double(a[i * k + p]) * double(b[p * n + j]);
      ASSERT_NEAR(c[i * n + j], dot, 1e-4) << "row " << i << " column " << j;
    }
  }
}

// multiply_to_bf16 stores each element as float_to_bf16_bits of the f32 value multiply() computes:
// on random products over every tile shape and the columns past a ldc wider than n untouched; and,
// through A = 1 and k = 1 (C = B), on the values rounding must get right: ties to even both ways,
// the largest floats (rounding up to inf), infinities, NaNs of either sign and payload, zeros and
// subnormals (ties among them too).
TEST(TileGemm, MultiplyToBf16RoundsEachElementOnceAsTheConversionDoes) {
  SKIP_WITHOUT_TILES();
  for (int64_t n : {5, 40, 48, 100, 200}) {
    const int64_t m = 29, k = 37, ldc = n + 3, ldb = tg::padded(n);
    const auto a = random_floats(static_cast<size_t>(m * k), 11), b = random_floats(static_cast<size_t>(k * n), 12);
    const auto bias = random_floats(static_cast<size_t>(n), 13);
    std::vector<float> packed(static_cast<size_t>(k * ldb));
    tg::pack_rows(b.data(), n, k, n, packed.data(), ldb);
    std::vector<float> c32(static_cast<size_t>(m * n));
    tg::multiply(m, n, k, 1.5f, a.data(), k, 1, packed.data(), ldb, 0.0f, c32.data(), n, bias.data());
    std::vector<uint16_t> c16(static_cast<size_t>(m * ldc), 0xABCD);
    tg::multiply_to_bf16(m, n, k, 1.5f, a.data(), k, 1, packed.data(), ldb, c16.data(), ldc, bias.data());
    int64_t wrong = 0, touched = 0;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        const uint16_t got = c16[static_cast<size_t>(i * ldc + j)];
        if (j >= n) {
          touched += got != 0xABCD;
        } else {
          wrong += got != float_to_bf16_bits(c32[static_cast<size_t>(i * n + j)]);
        }
      }
    }
    EXPECT_EQ(wrong, 0) << "n=" << n;
    EXPECT_EQ(touched, 0) << "n=" << n << ": wrote past column n";
  }
  const auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> specials = {
      bits(0x3F808000u), bits(0x3F818000u),  // exactly half an ulp of bf16: to the even neighbour, down and up
      bits(0x3F808001u), bits(0x3F807FFFu),  // just above and below half
      bits(0xBF818000u), std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
      bits(0x7F7F7FFFu),  // the largest float that stays finite in bf16
      inf, -inf, std::numeric_limits<float>::quiet_NaN(), bits(0xFFC00001u), bits(0x7F800001u),
      0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), bits(0x80018000u), bits(0x00018000u), 1.0f, -3.0f};
  const int64_t n = static_cast<int64_t>(specials.size()), ldb = tg::padded(n);
  std::vector<float> packed(static_cast<size_t>(ldb));
  tg::pack_rows(specials.data(), n, 1, n, packed.data(), ldb);
  const std::vector<float> ones(3, 1.0f);
  std::vector<float> c32(static_cast<size_t>(3 * n));
  tg::multiply(3, n, 1, 1.0f, ones.data(), 1, 1, packed.data(), ldb, 0.0f, c32.data(), n);
  std::vector<uint16_t> c16(static_cast<size_t>(3 * n));
  tg::multiply_to_bf16(3, n, 1, 1.0f, ones.data(), 1, 1, packed.data(), ldb, c16.data(), n);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float x = specials[static_cast<size_t>(j)], got32 = c32[static_cast<size_t>(i * n + j)];
      // The sum starts at +0, so 1·x is x itself except for -0 (+0) and NaNs (quietened).
      if (std::isnan(x)) {
        EXPECT_TRUE(std::isnan(got32)) << "value " << j;
      } else {
        EXPECT_EQ(got32, x) << "value " << j;
      }
      EXPECT_EQ(c16[static_cast<size_t>(i * n + j)], float_to_bf16_bits(got32)) << "row " << i << ", value " << j;
    }
  }
}

// An element is one dot product in a fixed order: computing a block of rows, or of columns, on its
// own gives the same bits as computing the whole matrix (which tile an element lands in, and how
// many rows there are, does not matter). The GEMM's thread bands and batch sizes rely on this.
TEST(TileGemm, AnElementsBitsDoNotDependOnItsTileOrTheMatrixSize) {
  SKIP_WITHOUT_TILES();
  const int64_t m = 50, n = 100, k = 37, ldb = tg::padded(n);
  const auto a = random_floats(m * k, 7), b = random_floats(k * n, 8);
  std::vector<float> packed(static_cast<size_t>(k * ldb));
  tg::pack_rows(b.data(), n, k, n, packed.data(), ldb);
  std::vector<float> whole(static_cast<size_t>(m * n)), part(static_cast<size_t>(m * n));
  tg::multiply(m, n, k, 1.0f, a.data(), k, 1, packed.data(), ldb, 0.0f, whole.data(), n);
  tg::multiply(13, n, k, 1.0f, a.data() + 7 * k, k, 1, packed.data(), ldb, 0.0f, part.data() + 7 * n, n);  // rows 7..19
  tg::multiply(m, 35, k, 1.0f, a.data(), k, 1, packed.data() + 32, ldb, 0.0f, part.data() + 32, n);       // cols 32..66
  int64_t compared = 0, differ = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      if (!((i >= 7 && i < 20) || (j >= 32 && j < 67))) continue;
      ++compared;
      differ += part[i * n + j] != whole[i * n + j];
    }
  }
  EXPECT_GT(compared, 0);
  EXPECT_EQ(differ, 0);
}

TEST(TileGemm, PackingCopiesAndZeroPads) {
  const int64_t rows = 5, cols = 19, ld_src = 23, ld = tg::padded(cols);
  const auto src = random_floats(rows * ld_src, 9);
  std::vector<float> dst(static_cast<size_t>(rows * ld), 7.0f);
  tg::pack_rows(src.data(), ld_src, rows, cols, dst.data(), ld);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < ld; ++c) EXPECT_EQ(dst[r * ld + c], c < cols ? src[r * ld_src + c] : 0.0f);
  }
  const int64_t ldt = tg::padded(rows);
  std::vector<float> t(static_cast<size_t>(cols * ldt), 7.0f);
  tg::pack_transposed(src.data(), ld_src, rows, cols, t.data(), ldt);
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < ldt; ++r) EXPECT_EQ(t[c * ldt + r], r < rows ? src[r * ld_src + c] : 0.0f);
  }
}

// The transpose in 16 × 16 blocks: whole blocks, blocks cut at the last rows and columns, a source
// wider than its columns and a destination wider than its rows rounded up (zeros past the rows). The
// bits must be the source's, whatever they are: random values, -0, NaNs and infinities alike.
TEST(TileGemm, PackTransposedMovesEveryBitInBlocksAndAtTheEdges) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{32, 48}, {37, 50}, {16, 3}, {3, 16}, {1, 1}, {50, 33}}) {
    const int64_t ld_src = cols + 5;
    for (const int64_t ldt : {tg::padded(rows), tg::padded(rows) + 16}) {
      auto src = random_floats(static_cast<size_t>(rows * ld_src), static_cast<uint64_t>(rows * 131 + cols));
      src[0] = -0.0f;
      if (src.size() > 2) src[2] = std::numeric_limits<float>::quiet_NaN();
      if (src.size() > 3) src[3] = -std::numeric_limits<float>::infinity();
      std::vector<float> t(static_cast<size_t>(cols * ldt), 7.0f);
      tg::pack_transposed(src.data(), ld_src, rows, cols, t.data(), ldt);
      int64_t differ = 0;
      for (int64_t c = 0; c < cols; ++c) {
        for (int64_t r = 0; r < ldt; ++r) {
          const float want = r < rows ? src[r * ld_src + c] : 0.0f;
          differ += std::memcmp(&t[c * ldt + r], &want, sizeof(float)) != 0;
        }
      }
      EXPECT_EQ(differ, 0) << rows << " x " << cols << ", ld " << ldt;
    }
  }
  std::vector<float> small(16), out(16);
  EXPECT_THROW(tg::pack_transposed(small.data(), 1, 16, 1, out.data(), 15), Error);
}

// ---- the paths that use the tiles, each with the tiles on and off -----------------------------------

std::vector<double> reference_product(const Tensor& a, bool ta, const Tensor& b, bool tb, int64_t m, int64_t n,
                                      int64_t k) {
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  std::vector<double> c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) acc += (ta ? av[p * m + i] : av[i * k + p]) * (tb ? bv[j * k + p] : bv[p * n + j]);
      c[i * n + j] = acc;
    }
  }
  return c;
}

// A Linear's three products at widths the tiles take, with K long enough to run in several chunks
// of B (the weight gradient's K is the batch's rows), on both paths.
TEST(GemmPaths, TilesAndOpenBlasBothMatchFloat64) {
  struct Case {
    int64_t m, n, k;
    bool ta, tb;
  };
  for (bool tiles : {true, false}) {
    const TilesEnabled scope(tiles);
    for (const Case& c : {Case{300, 96, 40, false, true}, Case{300, 40, 96, false, false}, Case{96, 40, 3000, true, false},
                          Case{70, 250, 33, false, true}, Case{20, 200, 1500, true, false}}) {
      const Tensor a = random_tensor(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, DType::f32, 41);
      const Tensor b = random_tensor(c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, DType::f32, 42);
      const Tensor out = kernels::matmul(a, b, c.ta, c.tb);
      const double tol = 1e-5 * std::sqrt(static_cast<double>(c.k)) * 4;
      EXPECT_TRUE(all_close(out, reference_product(a, c.ta, b, c.tb, c.m, c.n, c.k), tol, tol))
          << (tiles ? "tiles" : "OpenBLAS") << " m=" << c.m << " n=" << c.n << " k=" << c.k;
    }
  }
}

// The tiled Linear adds the bias as it stores y: the same bits as starting y at the bias (rounded to
// y's dtype) and accumulating the GEMM onto it, which is what the composition does. Low-precision
// operands take the tiles too, widened first, with y rounded once at the end; K = 1000 runs in two
// chunks of B, so the bias is added in the first and the second accumulates onto it.
TEST(GemmPaths, TiledLinearBiasEqualsTheComposition) {
  SKIP_WITHOUT_TILES();
  struct Case {
    DType x, w, bias;
  };
  for (const Case& c : {Case{DType::f32, DType::f32, DType::f32}, Case{DType::bf16, DType::bf16, DType::bf16},
                        Case{DType::bf16, DType::f32, DType::f32}, Case{DType::f16, DType::f16, DType::f32},
                        Case{DType::bf16, DType::bf16, DType::f32}}) {
    for (int64_t k : {96, 1000}) {
      const Tensor x = random_tensor({130, k}, c.x, 51);
      const Tensor w = random_tensor({72, k}, c.w, 52);
      // Large enough against the products (|x·w| ~ sqrt(k)/3) that rounding it to y's dtype matters.
      const Tensor bias = kernels::mul_scalar(random_tensor({72}, c.bias, 53), 7.0);
      const Tensor y = kernels::linear_forward(x, w, bias);
      Tensor composed = kernels::broadcast_to(bias.to(c.x), {130, 72});
      kernels::gemm(x, false, w, true, composed, 1.0, 1.0);
      ASSERT_EQ(y.dtype(), c.x);
      EXPECT_TRUE(all_close(y, composed, 0, 0))
          << dtype_name(c.x) << " x, " << dtype_name(c.w) << " w, " << dtype_name(c.bias) << " bias, k=" << k;
    }
  }
}

// The attention's tiled path is checked against float64 in test_attention.cpp; its OpenBLAS path,
// which runs where the tiles do not, must agree with it.
TEST(AttentionPaths, OpenBlasPathAgreesWithTheTiles) {
  SKIP_WITHOUT_TILES();
  const Tensor qkv = random_tensor({2, 50, 3, 3, 32}, DType::f32, 61);
  const Tensor dout = random_tensor({2, 50, 3, 32}, DType::f32, 62);
  const double scale = 1.0 / std::sqrt(32.0);
  kernels::AttentionOutput tiled, blas;
  Tensor dtiled, dblas;
  {
    const TilesEnabled on(true);
    tiled = kernels::packed_attention_forward(qkv, scale);
    dtiled = kernels::packed_attention_backward(dout, qkv, tiled.out, tiled.lse, scale);
  }
  {
    const TilesEnabled off(false);
    blas = kernels::packed_attention_forward(qkv, scale);
    dblas = kernels::packed_attention_backward(dout, qkv, blas.out, blas.lse, scale);
  }
  EXPECT_TRUE(all_close(blas.out, tiled.out, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(blas.lse, tiled.lse, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(dblas, dtiled, 2e-5, 2e-5));
}

}  // namespace
}  // namespace octet
