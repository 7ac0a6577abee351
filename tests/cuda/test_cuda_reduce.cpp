// CUDA reductions and softmax against the CPU kernels on the same random inputs. Values are compared
// by norm-wise relative error, ||gpu - cpu||_2 / ||cpu||_2 in f64 (f32 at most 1e-5, bf16 at most
// 1e-2); max indices must match exactly (both backends return the first maximum).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cuda/reduce_cuda.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "tests/testing.h"
#include "tests/cuda/cuda_testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::random_tensor;
using testing::relative_error_matching_nans;
using testing::relative_error_to_reference;
using testing::throws_with;
using testing::tolerance;

// Odd sizes, one element, and the split paths: long rows (chunked), tall columns (k split).
const std::vector<Shape> kShapes = {{7, 13, 33}, {1}, {3, 100003}, {5000, 37}, {2, 3000, 70}, {4, 1500}};

TEST(CudaReduce, SumAndMeanOverEachDimAndEverything) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const Shape& shape : kShapes) {
      const Tensor a = random_tensor(shape, dtype, 21), g = a.to(kGpu);
      for (int64_t d = 0; d < a.dim(); ++d) {
        for (bool keepdim : {false, true}) {
          EXPECT_LE(relative_error_matching_nans(kernels::sum(g, d, keepdim), kernels::sum(a, d, keepdim)), tolerance(dtype))
              << "sum dim " << d << " of " << a.describe();
          EXPECT_LE(relative_error_matching_nans(kernels::mean(g, d, keepdim), kernels::mean(a, d, keepdim)), tolerance(dtype))
              << "mean dim " << d << " of " << a.describe();
        }
      }
      EXPECT_LE(relative_error_matching_nans(kernels::sum(g), kernels::sum(a)), tolerance(dtype)) << a.describe();
      EXPECT_LE(relative_error_matching_nans(kernels::mean(g), kernels::mean(a)), tolerance(dtype)) << a.describe();
    }
  }
}

TEST(CudaReduce, MaxValuesAndFirstIndices) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const Shape& shape : kShapes) {
      const Tensor a = random_tensor(shape, dtype, 22), g = a.to(kGpu);
      for (int64_t d = 0; d < a.dim(); ++d) {
        const kernels::MaxResult want = kernels::max(a, d), got = kernels::max(g, d);
        EXPECT_EQ(relative_error_matching_nans(got.values, want.values), 0) << "dim " << d << " of " << a.describe();
        EXPECT_EQ(got.indices.to_vector<int64_t>(), want.indices.to_vector<int64_t>()) << "dim " << d << " of "
                                                                                       << a.describe();
      }
      EXPECT_EQ(kernels::max(g).item(), kernels::max(a).item()) << a.describe();
    }
  }
  // Ties keep the first position; the first NaN wins over everything.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor t = from_vector<double>({1, 5, 5, 2, nan, 3, nan, 9}, {2, 4}, DType::f32);
  const kernels::MaxResult want = kernels::max(t, 1), got = kernels::max(t.to(kGpu), 1);
  EXPECT_EQ(got.indices.to_vector<int64_t>(), want.indices.to_vector<int64_t>());
  EXPECT_EQ(got.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  const Tensor long_row = random_tensor({2, 5000}, DType::f32, 23);
  std::vector<float> v = long_row.to_vector<float>();
  v[4321] = 100.f, v[4999] = 100.f, v[5000 + 777] = static_cast<float>(nan);
  const Tensor marked = from_vector(v, {2, 5000});
  EXPECT_EQ(kernels::max(marked.to(kGpu), 1).indices.to_vector<int64_t>(), (std::vector<int64_t>{4321, 777}));
}

TEST(CudaReduce, AmaxIsF32AndPropagatesNaN) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::bf16, DType::e4m3}) {
    for (const Shape& shape : kShapes) {
      const Tensor a = random_tensor(shape, dtype, 24), g = a.to(kGpu);
      for (int64_t d = 0; d < a.dim(); ++d) {
        const Tensor got = kernels::amax(g, d);
        EXPECT_EQ(got.dtype(), DType::f32);
        EXPECT_EQ(relative_error_matching_nans(got, kernels::amax(a, d)), 0) << "dim " << d << " of " << a.describe();
      }
      EXPECT_EQ(kernels::amax(g).item(), kernels::amax(a).item()) << a.describe();
    }
  }
  std::vector<float> v = random_tensor({300000}, DType::f32, 25).to_vector<float>();
  v[123457] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(kernels::amax(from_vector(v, {300000}).to(kGpu)).item()));
}

// The packed column path (kernels/cuda/reduce.cu reduce_cols_packed: rows of whole 16-byte packs, at
// least 128 of them), which the shapes above do not reach: the bias gradient's shape (ViT-H's
// 12,608 × 1280 in bf16: 98 bands, then their sum), one band (130 rows), slices of an outer dim, f16,
// f32 (4 columns a pack), and widths that leave part of a block's columns idle (96, 264). Held to the
// float64 sum with the suite's f32 bound, 1e-5 norm-wise, on f32 results (a row left out or counted
// twice moves a column's sum by about 1/√n of its size, 0.9% at 12,608 rows); the same bits on a second
// call; a 16-bit result is the f32 result rounded once; the mean divides once; amax exactly the CPU's,
// a NaN propagated in sum and amax alike; and a view one element off a 16-byte boundary (the generic
// kernel) within the same bound.
TEST(CudaReduce, PackedColumnSumsOfTallSlices) {
  SKIP_WITHOUT_GPU();
  struct Slice {
    Shape shape;
    int64_t dim;
    DType dtype;
  };
  const std::vector<Slice> slices = {{{12608, 1280}, 0, DType::bf16}, {{130, 3840}, 0, DType::bf16},
                                     {{3000, 96}, 0, DType::f32},     {{3000, 96}, 0, DType::f16},
                                     {{2, 700, 264}, 1, DType::bf16}, {{4, 257, 96}, 1, DType::f32}};
  uint64_t seed = 40;
  for (const Slice& s : slices) {
    const Tensor a = random_tensor(s.shape, s.dtype, ++seed), g = a.to(kGpu);
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < s.dim; ++d) outer *= s.shape[d];
    for (int64_t d = s.dim + 1; d < a.dim(); ++d) inner *= s.shape[d];
    const int64_t n = s.shape[s.dim];
    const std::string what = a.describe() + " over dim " + std::to_string(s.dim);
    const Tensor exact = kernels::sum(a.to(DType::f64), s.dim).reshape({-1});

    const Tensor f32 = kernels::cuda::sum(g, outer, n, inner, 1.f, DType::f32, "test");
    EXPECT_LE(relative_error_to_reference(f32, exact), 1e-5) << what;
    EXPECT_TRUE(testing::same_bits(kernels::cuda::sum(g, outer, n, inner, 1.f, DType::f32, "test"), f32)) << what;
    EXPECT_TRUE(testing::same_bits(kernels::sum(g, s.dim).reshape({-1}), f32.to(s.dtype))) << what;
    const Tensor mean = kernels::cuda::sum(g, outer, n, inner, static_cast<float>(n), DType::f32, "test");
    EXPECT_LE(relative_error_to_reference(mean, kernels::mul_scalar(exact, 1.0 / static_cast<double>(n))), 1e-5) << what;
    EXPECT_EQ(relative_error_matching_nans(kernels::amax(g, s.dim), kernels::amax(a, s.dim)), 0) << what;

    const Tensor off = testing::misaligned_on_gpu(a);
    EXPECT_LE(relative_error_to_reference(kernels::cuda::sum(off, outer, n, inner, 1.f, DType::f32, "test"), exact),
              1e-5)
        << what << ", misaligned";
  }
  // A NaN in one column: that column's sum and amax are NaN, the others are not.
  std::vector<float> v = random_tensor({12608, 1280}, DType::f32, 49).to_vector<float>();
  v[5 * 1280 + 17] = std::numeric_limits<float>::quiet_NaN();
  const Tensor a = from_vector(v, {12608, 1280}).to(DType::bf16), g = a.to(kGpu);
  for (const Tensor& got : {kernels::sum(g, 0), kernels::amax(g, 0)}) {
    const std::vector<float> r = got.to_vector<float>();
    for (int64_t c = 0; c < 1280; ++c) EXPECT_EQ(std::isnan(r[c]), c == 17) << "column " << c;
  }
}

TEST(CudaReduce, SumToUndoesBroadcasting) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::pair<Shape, Shape>> cases = {{{7, 13, 33}, {13, 1}},     {{7, 13, 33}, {33}},
                                                      {{7, 13, 33}, {7, 1, 33}},  {{7, 13, 33}, {}},
                                                      {{4, 257, 96}, {96}},       {{7, 13, 33}, {7, 13, 33}},
                                                      {{64, 17, 1280}, {1, 1, 1280}}};
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const auto& [from, to] : cases) {
      const Tensor a = random_tensor(from, dtype, 26);
      const Tensor got = kernels::sum_to(a.to(kGpu), to);
      EXPECT_TRUE(got.is_cuda());
      EXPECT_LE(relative_error_matching_nans(got, kernels::sum_to(a, to)), tolerance(dtype)) << a.describe() << " -> " << to;
    }
  }
}

TEST(CudaReduce, SoftmaxAndLogSoftmaxForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  // Row lengths for the warp path (1, 33, 257), the block path (1500) and middle dims (cols path).
  const std::vector<std::pair<Shape, int64_t>> cases = {{{7, 13, 33}, -1}, {{7, 13, 33}, 1}, {{7, 13, 33}, 0},
                                                        {{5, 1}, -1},      {{37, 257}, -1},  {{3, 1500}, -1},
                                                        {{1}, 0}};
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const auto& [shape, dim] : cases) {
      const Tensor x = random_tensor(shape, dtype, 27, 3.0), dy = random_tensor(shape, dtype, 28);
      const Tensor gx = x.to(kGpu), gdy = dy.to(kGpu);
      const Tensor y = kernels::softmax(x, dim), ly = kernels::log_softmax(x, dim);
      EXPECT_LE(relative_error_matching_nans(kernels::softmax(gx, dim), y), tolerance(dtype)) << x.describe() << " dim " << dim;
      EXPECT_LE(relative_error_matching_nans(kernels::log_softmax(gx, dim), ly), tolerance(dtype)) << x.describe() << " dim " << dim;
      EXPECT_LE(relative_error_matching_nans(kernels::softmax_backward(y.to(kGpu), gdy, dim), kernels::softmax_backward(y, dy, dim)),
                tolerance(dtype))
          << x.describe() << " dim " << dim;
      EXPECT_LE(relative_error_matching_nans(kernels::log_softmax_backward(ly.to(kGpu), gdy, dim),
                               kernels::log_softmax_backward(ly, dy, dim)),
                tolerance(dtype))
          << x.describe() << " dim " << dim;
    }
  }
}

TEST(CudaReduce, UnsupportedDtypesNameTheOpAndTheFix) {
  SKIP_WITHOUT_GPU();
  const Tensor d = random_tensor({4, 5}, DType::f64).to(kGpu);
  EXPECT_TRUE(throws_with([&] { (void)kernels::sum(d, 1); }, {"sum", "f64", ".to(DType::f32)"}));
  EXPECT_TRUE(throws_with([&] { (void)kernels::mean(d); }, {"mean", "f64", ".to(DType::f32)"}));
  EXPECT_TRUE(throws_with([&] { (void)kernels::softmax(d, -1); }, {"softmax", "f64", ".to(DType::f32)"}));
  EXPECT_TRUE(throws_with([&] { (void)kernels::max(d, 0); }, {"max", "f64", ".to(DType::f32)"}));
}

}  // namespace
}  // namespace octet
