// CUDA GELU, cross-entropy and dropout against the CPU kernels on the same random inputs. Floating
// results are compared by norm-wise relative error, ||gpu - cpu||_2 / ||cpu||_2 in f64: at most 1e-5
// for f32 and 1e-2 for bf16. Dropout must match the CPU bit for bit. (LayerNorm: test_cuda_layernorm.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/nn_ops.h"
#include "tests/testing.h"
#include "tests/cuda/cuda_testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::misaligned_on_gpu;
using testing::random_tensor;
using testing::relative_error_matching_nans;
using testing::same_bits;
using testing::tolerance;

using testing::kRows;
using testing::kWidths;

// ---- GELU ---------------------------------------------------------------------------------------------

TEST(CudaGelu, BothFormsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (auto form : {kernels::GeluApproximation::None, kernels::GeluApproximation::Tanh}) {
    for (DType d : {DType::f32, DType::bf16}) {
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{37 * 13}, int64_t{1000003}}) {
        for (bool misaligned : {false, true}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(d) << " n " << n << (misaligned ? " misaligned" : "")
                                            << (form == kernels::GeluApproximation::Tanh ? " tanh" : " erf"));
          // Wide enough to reach both tails.
          const Tensor x = random_tensor({n}, d, 70 + n, 4.0), dy = random_tensor({n}, d, 71 + n);
          const Tensor xg = misaligned ? misaligned_on_gpu(x) : x.to(kGpu);
          const Tensor dyg = misaligned ? misaligned_on_gpu(dy) : dy.to(kGpu);
          EXPECT_LE(relative_error_matching_nans(kernels::gelu_forward(xg, form), kernels::gelu_forward(x, form)), tolerance(d));
          EXPECT_LE(relative_error_matching_nans(kernels::gelu_backward(dyg, xg, form), kernels::gelu_backward(dy, x, form)),
                    tolerance(d));
        }
      }
    }
  }
}

// gelu_backward_and_forward: both outputs are gelu_backward's and gelu_forward's bits, for each dtype and
// form, at sizes with and without a tail after the 16-byte packs, aligned and misaligned; written over
// dy when allowed (the same storage, dy's old values gone), and dy left alone when not.
TEST(CudaGelu, BackwardAndForwardInOnePassAreTheTwoCallsBitForBit) {
  SKIP_WITHOUT_GPU();
  for (auto form : {kernels::GeluApproximation::None, kernels::GeluApproximation::Tanh}) {
    for (DType d : {DType::f32, DType::bf16, DType::f16}) {
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{37 * 13}, int64_t{1000003}}) {
        for (bool misaligned : {false, true}) {
          for (bool overwrite : {false, true}) {
            SCOPED_TRACE(::testing::Message() << dtype_name(d) << " n " << n << (misaligned ? " misaligned" : "")
                                              << (form == kernels::GeluApproximation::Tanh ? " tanh" : " erf")
                                              << (overwrite ? ", over dy" : ""));
            // Wide enough to reach both tails (and f16's overflow of x² in the tanh form's slope).
            const Tensor x = random_tensor({n}, d, 80 + n, 4.0), dy = random_tensor({n}, d, 81 + n);
            const Tensor xg = misaligned ? misaligned_on_gpu(x) : x.to(kGpu);
            const Tensor dyg = misaligned ? misaligned_on_gpu(dy) : dy.to(kGpu);
            const Tensor dx_ref = kernels::gelu_backward(dyg, xg, form), y_ref = kernels::gelu_forward(xg, form);
            const kernels::GeluGradAndOutput r = kernels::gelu_backward_and_forward(dyg, xg, form, overwrite);
            EXPECT_TRUE(same_bits(r.dx, dx_ref));
            EXPECT_TRUE(same_bits(r.y, y_ref));
            EXPECT_EQ(r.dx.data_ptr() == dyg.data_ptr(), overwrite);
            if (!overwrite) {
              EXPECT_TRUE(same_bits(dyg, dy));
            }
          }
        }
      }
    }
  }
}

// gelu_backward_and_forward with the bias gradient (the 2-D walk that sums dx's columns as it stores
// them): dx and y still gelu_backward's and gelu_forward's bits; dbias within its derived bound of the
// float64 column sums of the dx the GPU returned; the same bits aligned (16-byte runs) and misaligned
// (one element a thread), both adding each column's rows in the same order. Shapes: a row; a width
// that 16-byte runs cannot take (13); a partial 64-row band and column tails past 1024 columns (1032);
// ViT-H's MLP width over 2.5 bands.
//
// The bound: each band's f32 sum of up to 64 values, then the bands' sums added in f32, are
// R - 1 additions in all along any column (R rows), each rounding by at most 2^-24 of a partial sum no
// larger than Σ|dx|: |f32 sum - exact| <= (R - 1)·2^-24·Σ|dx|. Then, for a bf16 bias, one rounding to
// x's dtype (2^-8 bf16, 2^-11 f16, none for f32) and one to bf16 (2^-8, none from bf16); an f32 bias
// keeps the f32 sum.
TEST(CudaGelu, BackwardAndForwardSumsTheBiasGradientInTheSamePass) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t rows, cols;
  };
  for (auto form : {kernels::GeluApproximation::None, kernels::GeluApproximation::Tanh}) {
    for (DType d : {DType::f32, DType::bf16, DType::f16}) {
      for (Case c : {Case{1, 8}, Case{37, 13}, Case{130, 1032}, Case{160, 5120}}) {
        for (DType bias_dtype : {DType::f32, DType::bf16}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(d) << " " << c.rows << " x " << c.cols << ", dbias "
                                            << dtype_name(bias_dtype)
                                            << (form == kernels::GeluApproximation::Tanh ? " tanh" : " erf"));
          const Tensor x = random_tensor({c.rows, c.cols}, d, 90 + c.cols, 3.0);
          const Tensor dy = random_tensor({c.rows, c.cols}, d, 91 + c.cols);
          const Tensor xg = x.to(kGpu), dyg = dy.to(kGpu);
          const Tensor dx_ref = kernels::gelu_backward(dyg, xg, form), y_ref = kernels::gelu_forward(xg, form);
          const kernels::GeluGradAndOutput r = kernels::gelu_backward_and_forward(dyg, xg, form, false, bias_dtype);
          EXPECT_TRUE(same_bits(r.dx, dx_ref));
          EXPECT_TRUE(same_bits(r.y, y_ref));
          EXPECT_TRUE(same_bits(dyg, dy));
          ASSERT_TRUE(r.dbias.defined());
          ASSERT_EQ(r.dbias.shape(), Shape({c.cols}));
          ASSERT_EQ(r.dbias.dtype(), bias_dtype);

          const std::vector<double> dx64 = r.dx.to(DType::f64).to_vector<double>();
          const std::vector<double> got = r.dbias.to(DType::f64).to_vector<double>();
          const bool bf16_bias = bias_dtype == DType::bf16;
          const double to_x = !bf16_bias ? 0.0 : d == DType::bf16 ? 0x1p-8 : d == DType::f16 ? 0x1p-11 : 0.0;
          const double to_bias = bf16_bias && d != DType::bf16 ? 0x1p-8 : 0.0;
          int64_t outside = 0;
          for (int64_t col = 0; col < c.cols; ++col) {
            double exact = 0, magnitude = 0;
            for (int64_t row = 0; row < c.rows; ++row) {
              exact += dx64[row * c.cols + col];
              magnitude += std::fabs(dx64[row * c.cols + col]);
            }
            const double summing = static_cast<double>(c.rows - 1) * 0x1p-24 * magnitude;
            const double after_x = summing + to_x * (std::fabs(exact) + summing);
            const double bound = after_x + to_bias * (std::fabs(exact) + after_x);
            if (std::fabs(got[col] - exact) > bound) ++outside;
          }
          EXPECT_EQ(outside, 0);

          // Misaligned (one element a thread, the same order down each column): the same bits.
          const Tensor xm = misaligned_on_gpu(x), dym = misaligned_on_gpu(dy);
          const kernels::GeluGradAndOutput m = kernels::gelu_backward_and_forward(dym, xm, form, true, bias_dtype);
          EXPECT_EQ(m.dx.data_ptr(), dym.data_ptr());  // written over dy
          EXPECT_TRUE(same_bits(m.dx, dx_ref));
          EXPECT_TRUE(same_bits(m.y, y_ref));
          EXPECT_TRUE(same_bits(m.dbias, r.dbias));
        }
      }
    }
  }
}

// The erf form's f32 error against the exact GELU (the CPU's f64 kernel), element by element, over
// [-14, 14] in steps of 2^-12 (the whole left tail, where Φ = ½ + ½·erf cancels, included) and the
// bounds derived in kernels/cuda/gelu_elements.cuh: Φ within 1.1e-7 absolutely (erff's 2 ulp, the
// argument's and the FMA's roundings), φ within 3.3e-7 + 7.5e-8·x² relatively, so
//   forward:   |y - x·Φ(x)|            <= 1.1e-7·|x| + 2^-24·|y|
//   backward:  |g - (Φ(x) + x·φ(x))|   <= 1.1e-7 + 0.242·3.3e-7 + 0.464·7.5e-8 + 2^-24·|g|
// (max |x|·φ(x) = 0.242, max |x|³·φ(x) = 0.464), each with 10% slack for the f64 reference's own rounding
// to a comparison. dy = 1, so the backward returns dy/dx itself.
TEST(CudaGelu, ErfFormWithinItsErrorBoundsOfTheExactGelu) {
  SKIP_WITHOUT_GPU();
  std::vector<float> xs;
  for (int k = -14 * 4096; k <= 14 * 4096; ++k) xs.push_back(static_cast<float>(k) / 4096.0f);
  const int64_t n = static_cast<int64_t>(xs.size());
  const Tensor x = from_vector(xs, {n}, DType::f32);
  const Tensor x64 = x.to(DType::f64), ones = full({n}, 1.0, DType::f32);
  const std::vector<double> y_ref = kernels::gelu_forward(x64).to_vector<double>();
  const std::vector<double> g_ref = kernels::gelu_backward(ones.to(DType::f64), x64).to_vector<double>();
  const std::vector<double> y = kernels::gelu_forward(x.to(kGpu)).to(Device::cpu()).to_vector<double>();
  const std::vector<double> g =
      kernels::gelu_backward(ones.to(kGpu), x.to(kGpu)).to(Device::cpu()).to_vector<double>();
  const double u = std::ldexp(1.0, -24);
  int reported = 0;
  for (int64_t i = 0; i < n && reported < 10; ++i) {
    const double xi = xs[static_cast<size_t>(i)];
    const double y_bound = 1.1 * (1.1e-7 * std::abs(xi) + u * std::abs(y_ref[i]));
    const double g_bound = 1.1 * (1.1e-7 + 0.242 * 3.3e-7 + 0.464 * 7.5e-8 + u * std::abs(g_ref[i]));
    if (!(std::abs(y[i] - y_ref[i]) <= y_bound) || !(std::abs(g[i] - g_ref[i]) <= g_bound)) {
      ++reported;
      ADD_FAILURE() << "x = " << xi << ": y " << y[i] << " (exact " << y_ref[i] << "), dy/dx " << g[i] << " (exact "
                    << g_ref[i] << ")";
    }
  }
}

// bf16 and f16 outputs take the erf form's cheaper Φ (kernels/cuda/gelu_elements.cuh): before the
// rounding to 16 bits, y is within 1e-6·|x| of the exact GELU and dy/dx within 1.2e-6, plus f32's own
// rounding. So for every finite 16-bit x, the output lies between the 16-bit roundings of the exact
// result minus and plus that bound (half again as wide, for the first-order analysis): the exact
// result's own rounding unless it lies that close to a rounding boundary. dy = 1, so the backward
// returns dy/dx itself, rounded.
TEST(CudaGelu, Narrow16BitOutputsRoundTheExactGelu) {
  SKIP_WITHOUT_GPU();
  for (DType d : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(d));
    // Every 16-bit pattern read as d, then the finite ones.
    const int64_t n = int64_t{1} << 16;
    Tensor x16 = empty({n}, d);
    auto* raw = static_cast<uint16_t*>(x16.data_ptr());
    for (int64_t i = 0; i < n; ++i) raw[i] = static_cast<uint16_t>(i);
    const std::vector<double> all = x16.to_vector<double>();
    std::vector<double> xs;
    std::vector<uint16_t> finite_bits;
    for (int64_t i = 0; i < n; ++i) {
      if (std::isfinite(all[static_cast<size_t>(i)])) {
        finite_bits.push_back(static_cast<uint16_t>(i));
        xs.push_back(all[static_cast<size_t>(i)]);
      }
    }
    const int64_t m = static_cast<int64_t>(xs.size());
    Tensor x = empty({m}, d);
    std::copy(finite_bits.begin(), finite_bits.end(), static_cast<uint16_t*>(x.data_ptr()));
    const Tensor x64 = x.to(DType::f64), ones = full({m}, 1.0, d);
    const std::vector<double> y_ref = kernels::gelu_forward(x64).to_vector<double>();
    const std::vector<double> g_ref = kernels::gelu_backward(ones.to(DType::f64), x64).to_vector<double>();
    std::vector<double> y_lo(y_ref.size()), y_hi(y_ref.size()), g_lo(g_ref.size()), g_hi(g_ref.size());
    for (size_t i = 0; i < xs.size(); ++i) {
      const double dy = 1.5 * (1e-6 * std::abs(xs[i]) + std::ldexp(std::abs(y_ref[i]), -24));
      const double dg = 1.5 * (1.2e-6 + std::ldexp(std::abs(g_ref[i]), -24));
      y_lo[i] = y_ref[i] - dy;
      y_hi[i] = y_ref[i] + dy;
      g_lo[i] = g_ref[i] - dg;
      g_hi[i] = g_ref[i] + dg;
    }
    // The 16-bit roundings of the bounds (rounding is monotone: the output lies between them).
    auto rounded = [&](const std::vector<double>& v) {
      return from_vector(v, {m}, DType::f64).to(d).to_vector<double>();
    };
    const std::vector<double> ylo = rounded(y_lo), yhi = rounded(y_hi), glo = rounded(g_lo), ghi = rounded(g_hi);
    const std::vector<double> y = kernels::gelu_forward(x.to(kGpu)).to(Device::cpu()).to_vector<double>();
    const std::vector<double> g =
        kernels::gelu_backward(ones.to(kGpu), x.to(kGpu)).to(Device::cpu()).to_vector<double>();
    int reported = 0;
    for (size_t i = 0; i < xs.size() && reported < 10; ++i) {
      if (!(ylo[i] <= y[i] && y[i] <= yhi[i]) || !(glo[i] <= g[i] && g[i] <= ghi[i])) {
        ++reported;
        ADD_FAILURE() << "x = " << xs[i] << ": y " << y[i] << " (exact " << y_ref[i] << ", allowed " << ylo[i] << " .. "
                      << yhi[i] << "), dy/dx " << g[i] << " (exact " << g_ref[i] << ", allowed " << glo[i] << " .. "
                      << ghi[i] << ")";
      }
    }
  }
}

// ---- cross-entropy ------------------------------------------------------------------------------------------

TEST(CudaCrossEntropy, LossLseAndGradientMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const int64_t ignore = -100;
  for (DType d : {DType::f32, DType::bf16}) {
    for (DType index : {DType::i64, DType::i32}) {
      for (double smoothing : {0.0, 0.1}) {
        for (int64_t N : kRows) {
          for (int64_t C : kWidths) {
            SCOPED_TRACE(::testing::Message() << dtype_name(d) << " " << dtype_name(index) << " smoothing "
                                              << smoothing << " N " << N << " C " << C);
            const Tensor logits = random_tensor({N, C}, d, 80 + N + C, 3.0);
            std::vector<int64_t> t(N);
            for (int64_t r = 0; r < N; ++r) t[r] = (r % 5 == 3) ? ignore : (r * 7919 + 3) % C;
            const Tensor targets = from_vector(t, {N}, index);
            const Tensor dloss = full({}, 1.7);
            const auto cpu = kernels::cross_entropy_forward(logits, targets, smoothing, ignore);
            const auto gpu = kernels::cross_entropy_forward(logits.to(kGpu), targets.to(kGpu), smoothing, ignore);
            EXPECT_LE(relative_error_matching_nans(gpu.loss, cpu.loss), 1e-5);
            EXPECT_LE(relative_error_matching_nans(gpu.lse, cpu.lse), 1e-5);
            const Tensor cpu_grad = kernels::cross_entropy_backward(logits, targets, cpu.lse, dloss, smoothing, ignore);
            const Tensor gpu_grad = kernels::cross_entropy_backward(logits.to(kGpu), targets.to(kGpu), gpu.lse,
                                                                    dloss.to(kGpu), smoothing, ignore);
            EXPECT_LE(relative_error_matching_nans(gpu_grad, cpu_grad), tolerance(d));
          }
        }
      }
    }
  }
}

TEST(CudaCrossEntropy, AllRowsIgnoredGivesZeroLossAndGradient) {
  SKIP_WITHOUT_GPU();
  const Tensor logits = random_tensor({5, 13}, DType::f32, 90).to(kGpu);
  const Tensor targets = full({5}, -1.0, DType::i64).to(kGpu);
  const auto out = kernels::cross_entropy_forward(logits, targets, 0.0, -1);
  EXPECT_EQ(out.loss.item(), 0.0);
  const Tensor grad = kernels::cross_entropy_backward(logits, targets, out.lse, ones({}).to(kGpu), 0.0, -1);
  for (double g : grad.to_vector<double>()) EXPECT_EQ(g, 0.0);
}

TEST(CudaCrossEntropy, ATargetOutOfRangeMakesTheLossNaN) {
  SKIP_WITHOUT_GPU();
  const Tensor logits = random_tensor({4, 13}, DType::f32, 91).to(kGpu);
  const Tensor targets = from_vector<int64_t>({1, 2, 13, 0}, {4}).to(kGpu);
  const auto out = kernels::cross_entropy_forward(logits, targets);
  EXPECT_TRUE(std::isnan(out.loss.item()));
}

// ---- dropout --------------------------------------------------------------------------------------------------

TEST(CudaDropout, MasksAndValuesAreTheCpusBitForBit) {
  SKIP_WITHOUT_GPU();
  for (DType d : {DType::f32, DType::bf16}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{37}, int64_t{1000003}}) {
      for (double p : {0.1, 0.5, 0.9}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(d) << " n " << n << " p " << p);
        const Tensor x = random_tensor({n}, d, 100 + n);
        const uint64_t seed = 0x1234567890abcdefULL, offset = 977;
        EXPECT_TRUE(same_bits(kernels::dropout_forward(x.to(kGpu), p, seed, offset),
                              kernels::dropout_forward(x, p, seed, offset)));
        EXPECT_TRUE(same_bits(kernels::dropout_backward(x.to(kGpu), p, seed, offset + 5),
                              kernels::dropout_backward(x, p, seed, offset + 5)));
      }
    }
  }
}

}  // namespace
}  // namespace octet
