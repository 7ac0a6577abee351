// The kernels that write an FP8 Linear's input as they compute it (kernels/fp8.h): LayerNorm
// (layernorm_fp8_forward, add_layernorm_fp8_forward) and GELU (gelu_fp8_forward), against the
// unfused sequences they replace, the op then fp8_cast: bit for bit for the FP8 bytes, the transposed
// copy, the amax, scale_inv, the statistics and h.
#include <gtest/gtest.h>

#include <optional>
#include <ostream>
#include <tuple>

#include "kernels/fp8.h"
#include "kernels/nn_ops.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::random_tensor;

// Both undefined, or the same shape, dtype and bits.
::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  if (!a.defined() && !b.defined()) return ::testing::AssertionSuccess();
  return testing::same_bits(a, b);
}

struct Case {
  int64_t rows, cols;
  DType x_dtype, fp8_dtype;
  bool affine, rowwise, transposed;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.rows << "x" << c.cols << " " << dtype_name(c.x_dtype) << "->" << dtype_name(c.fp8_dtype)
      << (c.affine ? " affine" : "") << (c.rowwise ? " rowwise" : "") << (c.transposed ? " transposed" : "");
}

class LayerNormFp8Test : public ::testing::TestWithParam<Case> {};

TEST_P(LayerNormFp8Test, EqualsLayerNormThenCastBitForBit) {
  const Case c = GetParam();
  // Rows of different offsets and spreads, so the amax is not one row's and some values saturate.
  const Tensor x = random_tensor({c.rows, c.cols}, c.x_dtype, 11, 3.0);
  const Tensor w = c.affine ? random_tensor({c.cols}, DType::f32, 12, 2.0) : Tensor();
  const Tensor b = c.affine ? random_tensor({c.cols}, DType::f32, 13) : Tensor();
  const Tensor scale = full({1}, 37.5);
  for (bool with_add : {false, true}) {
    const Tensor y = random_tensor({c.rows, c.cols}, c.x_dtype, 14);
    Tensor amax_fused = full({1}, 0.25), amax_ref = full({1}, 0.25);
    const kernels::LayerNormFp8 fused =
        with_add ? kernels::add_layernorm_fp8_forward(x, y, w, b, 1e-5, scale, amax_fused, c.fp8_dtype, c.rowwise,
                                                      c.transposed)
                 : kernels::layernorm_fp8_forward(x, w, b, 1e-5, scale, amax_fused, c.fp8_dtype, c.rowwise,
                                                  c.transposed);
    Tensor normed, mean, rstd, h;
    if (with_add) {
      const kernels::AddLayerNormOutput r = kernels::add_layernorm_forward(x, y, w, b, 1e-5);
      normed = r.y, mean = r.mean, rstd = r.rstd, h = r.h;
    } else {
      const kernels::LayerNormOutput r = kernels::layernorm_forward(x, w, b, 1e-5);
      normed = r.y, mean = r.mean, rstd = r.rstd;
    }
    const kernels::Fp8Cast ref = kernels::fp8_cast(normed, scale, amax_ref, c.fp8_dtype, c.rowwise, c.transposed);
    const char* which = with_add ? "add_layernorm_fp8_forward" : "layernorm_fp8_forward";
    EXPECT_TRUE(same_bits(fused.cast.data, ref.data)) << which;
    EXPECT_TRUE(same_bits(fused.cast.transposed, ref.transposed)) << which;
    EXPECT_TRUE(same_bits(fused.cast.scale_inv, ref.scale_inv)) << which;
    EXPECT_TRUE(same_bits(amax_fused, amax_ref)) << which;
    EXPECT_GT(amax_ref.item<double>(), 0.25) << "the amax slot must have been raised";
    EXPECT_TRUE(same_bits(fused.mean, mean)) << which;
    EXPECT_TRUE(same_bits(fused.rstd, rstd)) << which;
    EXPECT_TRUE(same_bits(fused.h, h)) << which;
  }
}

// Rows not a multiple of the transposed copy's 16-row padding, widths not a multiple of the cast's
// 64-column tiles, both formats, f32 and bf16 inputs, with and without affine.
INSTANTIATE_TEST_SUITE_P(Shapes, LayerNormFp8Test,
                         ::testing::Values(Case{1, 16, DType::f32, DType::e4m3, true, true, true},
                                           Case{37, 96, DType::bf16, DType::e4m3, true, true, true},
                                           Case{50, 80, DType::bf16, DType::e5m2, false, true, false},
                                           Case{65, 144, DType::f32, DType::e4m3, true, false, true},
                                           Case{130, 48, DType::bf16, DType::e4m3, false, true, true}));

TEST(GeluFp8, EqualsGeluThenCastBitForBit) {
  for (kernels::GeluApproximation approximation : {kernels::GeluApproximation::None, kernels::GeluApproximation::Tanh}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (DType fp8 : {DType::e4m3, DType::e5m2}) {
        const Tensor x = random_tensor({37, 80}, dtype, 21, 3.0);
        const Tensor scale = full({1}, 70.0);
        Tensor amax_fused = full({1}, 0.0), amax_ref = full({1}, 0.0);
        const kernels::Fp8Cast fused = kernels::gelu_fp8_forward(x, approximation, scale, amax_fused, fp8, true, true);
        const kernels::Fp8Cast ref =
            kernels::fp8_cast(kernels::gelu_forward(x, approximation), scale, amax_ref, fp8, true, true);
        EXPECT_TRUE(same_bits(fused.data, ref.data));
        EXPECT_TRUE(same_bits(fused.transposed, ref.transposed));
        EXPECT_TRUE(same_bits(fused.scale_inv, ref.scale_inv));
        EXPECT_TRUE(same_bits(amax_fused, amax_ref));
        EXPECT_GT(amax_ref.item<double>(), 1.0);
      }
    }
  }
  EXPECT_TRUE(testing::throws_with(
      [] {
        kernels::gelu_fp8_forward(random_tensor({4, 16}), kernels::GeluApproximation::None, full({1}, 1.0), Tensor(),
                                  DType::e4m3, false, false);
      },
      {"gelu_fp8_forward", "neither rowwise nor transposed"}));
}

TEST(DgeluFp8, EqualsGeluBackwardThenTheCastWithColumnSumsBitForBit) {
  for (kernels::GeluApproximation approximation : {kernels::GeluApproximation::None, kernels::GeluApproximation::Tanh}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (bool with_dbias : {true, false}) {
        // 70 rows: more than one of the column sums' 16-row leaves, not a multiple of 16.
        const Tensor x = random_tensor({70, 48}, dtype, 31, 3.0);
        const Tensor dact = random_tensor({70, 48}, dtype, 32, 0.01);
        const Tensor scale = full({1}, 4096.0);
        Tensor amax_fused = full({1}, 0.0), amax_ref = full({1}, 0.0);
        const std::optional<DType> dbias = with_dbias ? std::optional<DType>(DType::f32) : std::nullopt;
        const kernels::Fp8CastWithBiasGrad fused = kernels::dgelu_fp8_cast_dbias(
            dact, x, approximation, scale, amax_fused, DType::e5m2, true, true, dbias);
        const Tensor dy = kernels::gelu_backward(dact, x, approximation);
        kernels::Fp8CastWithBiasGrad ref;
        if (with_dbias) {
          ref = kernels::fp8_cast_dbias(dy, scale, amax_ref, DType::e5m2, true, true, DType::f32);
        } else {
          static_cast<kernels::Fp8Cast&>(ref) = kernels::fp8_cast(dy, scale, amax_ref, DType::e5m2, true, true);
        }
        EXPECT_TRUE(same_bits(fused.data, ref.data));
        EXPECT_TRUE(same_bits(fused.transposed, ref.transposed));
        EXPECT_TRUE(same_bits(fused.scale_inv, ref.scale_inv));
        EXPECT_TRUE(same_bits(fused.dbias, ref.dbias));
        EXPECT_TRUE(same_bits(amax_fused, amax_ref));
        EXPECT_EQ(fused.dbias.defined(), with_dbias);
      }
    }
  }
  EXPECT_TRUE(testing::throws_with(
      [] {
        kernels::dgelu_fp8_cast_dbias(random_tensor({4, 16}), random_tensor({4, 8}), kernels::GeluApproximation::None,
                                      full({1}, 1.0), Tensor(), DType::e5m2, true, false, std::nullopt);
      },
      {"dgelu_fp8_cast_dbias", "dact"}));
}

TEST(LayerNormFp8, ErrorsNameTheProblem) {
  const Tensor x = random_tensor({4, 16}, DType::bf16, 1);
  const Tensor scale = full({1}, 1.0);
  EXPECT_TRUE(testing::throws_with(
      [&] { kernels::layernorm_fp8_forward(x, random_tensor({8}), Tensor(), 1e-5, scale, Tensor(), DType::e4m3, true, false); },
      {"layernorm_fp8_forward", "[16]"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { kernels::layernorm_fp8_forward(x, Tensor(), Tensor(), 1e-5, scale, Tensor(), DType::bf16, true, false); },
      {"e4m3 or e5m2"}));
  EXPECT_TRUE(testing::throws_with(
      [&] {
        kernels::add_layernorm_fp8_forward(x, random_tensor({4, 8}, DType::bf16), Tensor(), Tensor(), 1e-5, scale,
                                           Tensor(), DType::e4m3, true, false);
      },
      {"add_layernorm_fp8_forward", "not broadcast"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { kernels::layernorm_fp8_forward(x, Tensor(), Tensor(), -1.0, scale, Tensor(), DType::e4m3, true, false); },
      {"eps"}));
  // Weight and bias: f32 or x's dtype, one dtype, bias only with weight (as layernorm_forward asks).
  const Tensor w16 = random_tensor({16}, DType::f16, 2), w32 = random_tensor({16}, DType::f32, 3);
  EXPECT_TRUE(testing::throws_with(
      [&] { kernels::layernorm_fp8_forward(x, w16, Tensor(), 1e-5, scale, Tensor(), DType::e4m3, true, false); },
      {"layernorm_fp8_forward", "weight is f16 but x is bf16", ".to(DType::f32)"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { kernels::layernorm_fp8_forward(x, w32, w16, 1e-5, scale, Tensor(), DType::e4m3, true, false); },
      {"layernorm_fp8_forward", "bias must be f32 like weight"}));
  EXPECT_TRUE(testing::throws_with(
      [&] { kernels::layernorm_fp8_forward(x, Tensor(), w32, 1e-5, scale, Tensor(), DType::e4m3, true, false); },
      {"layernorm_fp8_forward", "without weight"}));
}

}  // namespace
}  // namespace octet
