// Data movement against plain index loops written here. Moving elements must not change them, so
// results are compared bit for bit in every dtype; only index_select_backward does arithmetic.
#include <gtest/gtest.h>

#include <cstring>
#include <ostream>
#include <string>
#include <tuple>

#include "kernels/shape_ops.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::all_close;
using testing::random_tensor;

// The multi-index of linear index i in shape s.
std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (int64_t d = s.ndim() - 1; d >= 0; --d) {
    idx[d] = i % s[d];
    i /= s[d];
  }
  return idx;
}

// The linear offset of multi-index idx in shape s.
int64_t ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t off = 0;
  for (int64_t d = 0; d < s.ndim(); ++d) off = off * s[d] + idx[d];
  return off;
}

// shape with dim's extent replaced by e.
Shape with_extent(Shape shape, int64_t dim, int64_t e) {
  shape[dim] = e;
  return shape;
}

// Same shape, dtype and bytes.
::testing::AssertionResult same_bits(const Tensor& actual, const Tensor& expected) {
  if (actual.shape() != expected.shape() || actual.dtype() != expected.dtype()) {
    return ::testing::AssertionFailure() << actual.describe() << " should be " << expected.describe();
  }
  if (std::memcmp(actual.data_ptr(), expected.data_ptr(), actual.nbytes()) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "bits differ: " << all_close(actual, expected, 0, 0).message();
}


// The references below loop over output indices in plain C++ and return a tensor of x's dtype
// (moved values are exact in it).
Tensor ref_permute(const Tensor& x, const std::vector<int64_t>& dims) {
  const int64_t n = x.dim();
  Shape out_shape(n);
  for (int64_t i = 0; i < n; ++i) out_shape[i] = x.size(dims[i]);
  const auto xv = x.to_vector<double>();
  std::vector<double> y(xv.size());
  std::vector<int64_t> src(n);
  for (size_t o = 0; o < y.size(); ++o) {
    const auto idx = unravel(static_cast<int64_t>(o), out_shape);
    for (int64_t i = 0; i < n; ++i) src[(dims[i] + n) % n] = idx[i];
    y[o] = xv[ravel(src, x.shape())];
  }
  return from_vector(y, out_shape, x.dtype());
}

// out[..., j, ...] = x[..., idx[j], ...] along dim.
Tensor ref_index_select(const Tensor& x, int64_t dim, const std::vector<int64_t>& idx) {
  const Shape out = with_extent(x.shape(), dim, static_cast<int64_t>(idx.size()));
  const auto xv = x.to_vector<double>();
  std::vector<double> y(out.numel());
  for (int64_t o = 0; o < out.numel(); ++o) {
    auto i = unravel(o, out);
    i[dim] = idx[i[dim]];
    y[o] = xv[ravel(i, x.shape())];
  }
  return from_vector(y, out, x.dtype());
}

// Its transpose: zeros of `full` with acc[..., idx[j], ...] += g[..., j, ...], summed in double.
std::vector<double> ref_index_select_backward(const Tensor& g, const Shape& full, int64_t dim,
                                              const std::vector<int64_t>& idx) {
  const auto gv = g.to_vector<double>();
  std::vector<double> acc(full.numel(), 0.0);
  for (int64_t o = 0; o < g.numel(); ++o) {
    auto i = unravel(o, g.shape());
    i[dim] = idx[i[dim]];
    acc[ravel(i, full)] += gv[o];
  }
  return acc;
}

// A slice is a gather of consecutive indices.
std::vector<int64_t> range(int64_t start, int64_t len) {
  std::vector<int64_t> idx(len);
  for (int64_t i = 0; i < len; ++i) idx[i] = start + i;
  return idx;
}
Tensor ref_slice(const Tensor& x, int64_t dim, int64_t start, int64_t len) {
  return ref_index_select(x, dim, range(start, len));
}

const std::vector<DType> kMoveDtypes = {DType::f32, DType::f64, DType::bf16, DType::e4m3};

// ---- permute ---------------------------------------------------------------------------------------

struct PermuteCase {
  Shape shape;
  std::vector<int64_t> dims;
};
void PrintTo(const PermuteCase& c, std::ostream* os) {
  *os << c.shape << " dims (";
  for (size_t i = 0; i < c.dims.size(); ++i) *os << (i ? ", " : "") << c.dims[i];
  *os << ")";
}

class PermuteTest : public ::testing::TestWithParam<std::tuple<PermuteCase, DType>> {};

TEST_P(PermuteTest, MatchesIndexLoopBitwise) {
  const auto& [cs, dtype] = GetParam();
  const Tensor x = random_tensor(cs.shape, dtype, 7);
  EXPECT_TRUE(same_bits(kernels::permute(x, cs.dims), ref_permute(x, cs.dims)));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PermuteTest,
    ::testing::Combine(::testing::Values(PermuteCase{{4, 7}, {1, 0}}, PermuteCase{{67, 131}, {1, 0}},
                                         PermuteCase{{3, 5, 7}, {2, 0, 1}}, PermuteCase{{3, 5, 7}, {0, 2, 1}},
                                         PermuteCase{{3, 5, 7}, {1, 0, 2}}, PermuteCase{{3, 5, 7}, {0, 1, 2}},
                                         PermuteCase{{2, 6, 4, 8}, {0, 2, 1, 3}},        // [B, S, H, D] -> [B, H, S, D]
                                         PermuteCase{{2, 3, 1, 5}, {3, 2, 0, 1}},        // size-1 dims
                                         PermuteCase{{2, 5, 3, 4, 8}, {2, 0, 3, 1, 4}},  // ViT qkv [B, N, 3, H, D]
                                         PermuteCase{{3, 4, 5, 6, 7}, {4, 3, 2, 1, 0}},
                                         PermuteCase{{2, 3, 4}, {-1, 0, -2}},
                                         PermuteCase{{8, 50, 3, 6, 32}, {2, 0, 3, 1, 4}},  // big enough to use threads
                                         PermuteCase{{40, 70, 33}, {2, 1, 0}}, PermuteCase{{0, 3}, {1, 0}}),
                       ::testing::ValuesIn(kMoveDtypes)));

TEST(Permute, TransposeLast2SwapsTheLastTwoDims) {
  for (const Shape& shape : {Shape{5, 9}, Shape{3, 4, 6}, Shape{2, 3, 33, 40}}) {
    for (DType dtype : kMoveDtypes) {
      const Tensor x = random_tensor(shape, dtype, 8);
      std::vector<int64_t> dims(shape.size());
      for (size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<int64_t>(i);
      std::swap(dims[dims.size() - 1], dims[dims.size() - 2]);
      EXPECT_TRUE(same_bits(kernels::transpose_last2(x), ref_permute(x, dims))) << shape << " " << dtype;
    }
  }
}

TEST(Permute, ScalarAndIntegerTensors) {
  const Tensor s = full({}, 3.5, DType::f64);
  EXPECT_EQ(kernels::permute(s, {}).item(), 3.5);
  const Tensor ints = arange(24).reshape({2, 3, 4});
  EXPECT_TRUE(same_bits(kernels::permute(ints, {1, 2, 0}), ref_permute(ints, {1, 2, 0})));
}

TEST(Permute, ErrorsNameDimsAndShape) {
  const Tensor x = random_tensor({2, 3, 4});
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::permute(x, {0, 0, 2}); }, {"permute", "(0, 0, 2)", "[2, 3, 4]"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::permute(x, {1, 0}); }, {"permute", "(1, 0)", "[2, 3, 4]"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::permute(x, {0, 1, 3}); }, {"permute", "[2, 3, 4]"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::transpose_last2(random_tensor({5})); }, {"transpose_last2", "[5]"}));
}

// ---- concat / split / slice --------------------------------------------------------------------------

class ConcatTest : public ::testing::TestWithParam<std::tuple<int64_t, DType>> {};

TEST_P(ConcatTest, MatchesIndexLoopAndSplitInverts) {
  const auto [dim, dtype] = GetParam();
  const Shape base{3, 4, 5};
  const int64_t d = (dim + 3) % 3;
  const std::vector<int64_t> sizes{2, 1, 3};
  std::vector<Tensor> xs;
  std::vector<std::vector<double>> vals;
  for (size_t i = 0; i < sizes.size(); ++i) {
    xs.push_back(random_tensor(with_extent(base, d, sizes[i]), dtype, 20 + i));
    vals.push_back(xs.back().to_vector<double>());
  }
  const Shape out_shape = with_extent(base, d, 6);
  std::vector<double> expected(out_shape.numel());
  for (int64_t o = 0; o < out_shape.numel(); ++o) {
    auto idx = unravel(o, out_shape);
    size_t piece = 0;
    while (idx[d] >= sizes[piece]) idx[d] -= sizes[piece++];
    expected[o] = vals[piece][ravel(idx, with_extent(base, d, sizes[piece]))];
  }
  const Tensor cat = kernels::concat(xs, dim);
  EXPECT_TRUE(same_bits(cat, from_vector(expected, out_shape, dtype)));
  const auto pieces = kernels::split(cat, sizes, dim);
  ASSERT_EQ(pieces.size(), xs.size());
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_TRUE(same_bits(pieces[i], xs[i])) << "piece " << i;
}

INSTANTIATE_TEST_SUITE_P(Dims, ConcatTest,
                         ::testing::Combine(::testing::Values(0, 1, 2, -1), ::testing::ValuesIn(kMoveDtypes)));

TEST(Split, PiecesMatchSlicesAndConcatRestores) {
  const Shape shape{5, 9, 7};
  for (DType dtype : kMoveDtypes) {
    const Tensor x = random_tensor(shape, dtype, 31);
    for (int64_t dim = 0; dim < 3; ++dim) {
      const std::vector<int64_t> sizes =
          dim == 1 ? std::vector<int64_t>{4, 0, 5} : std::vector<int64_t>{1, 3, shape[dim] - 4};
      const auto pieces = kernels::split(x, sizes, dim);
      int64_t start = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        EXPECT_TRUE(same_bits(pieces[i], ref_slice(x, dim, start, sizes[i]))) << dim << " " << i;
        start += sizes[i];
      }
      EXPECT_TRUE(same_bits(kernels::concat(pieces, dim), x)) << "dim " << dim << " " << dtype;
    }
  }
  // Rows large enough to be copied on several threads.
  const Tensor big = random_tensor({600, 300}, DType::f32, 32);
  const auto big_pieces = kernels::split(big, {100, 199, 1}, 1);
  EXPECT_TRUE(same_bits(big_pieces[1], ref_slice(big, 1, 100, 199)));
  EXPECT_TRUE(same_bits(kernels::concat(big_pieces, 1), big));
}

TEST(Slice, MatchesIndexLoopAlongEveryDim) {
  const Shape shape{4, 6, 5, 3};
  for (DType dtype : kMoveDtypes) {
    const Tensor x = random_tensor(shape, dtype, 41);
    for (int64_t dim = 0; dim < 4; ++dim) {
      for (auto [start, len] : {std::pair<int64_t, int64_t>{0, 1}, {1, shape[dim] - 2}, {shape[dim] - 1, 1}, {2, 0}}) {
        EXPECT_TRUE(same_bits(kernels::slice(x, dim, start, len), ref_slice(x, dim, start, len)))
            << dtype << " dim " << dim << " start " << start;
      }
    }
  }
  const Tensor x = random_tensor(shape);
  EXPECT_TRUE(same_bits(kernels::slice(x, -1, 1, 2), ref_slice(x, 3, 1, 2)));
}

TEST(Slice, BackwardPlacesGradAndZerosTheRest) {
  const Shape full{4, 7, 5};
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    for (int64_t dim = 0; dim < 3; ++dim) {
      const int64_t start = 1, len = full[dim] - 2;
      const Shape gs = with_extent(full, dim, len);
      const Tensor g = random_tensor(gs, dtype, 42);
      const auto expected = ref_index_select_backward(g, full, dim, range(start, len));
      const Tensor out = kernels::slice_backward(g, full, dim, start);
      EXPECT_TRUE(same_bits(out, from_vector(expected, full, dtype))) << dtype << " dim " << dim;
      EXPECT_TRUE(same_bits(kernels::slice(out, dim, start, len), g));
    }
  }
}

TEST(ConcatSplitSlice, ErrorsNameTheShapes) {
  const Tensor a = random_tensor({2, 3, 4}), b = random_tensor({2, 5, 5});
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::concat({a, b}, 1); }, {"concat", "[2, 3, 4]", "[2, 5, 5]"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::concat({a, a.to(DType::bf16)}, 0); }, {"concat", "bf16"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::concat({a, random_tensor({2, 3})}, 0); }, {"[2, 3, 4]", "[2, 3]"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::concat({}, 0); }, {"concat"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::split(a, {1, 1}, 1); }, {"split", "(1, 1)", "[2, 3, 4]"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::slice(a, 2, 3, 2); }, {"slice", "[3, 5)", "[2, 3, 4]"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::slice(a, 3, 0, 1); }, {"slice", "[2, 3, 4]"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::slice_backward(a, {2, 3, 5}, 1, 1); }, {"slice_backward", "[2, 3, 5]"}));
}

// ---- patchify ------------------------------------------------------------------------------------------

struct PatchCase {
  int64_t b, c, h, w, p;
};
void PrintTo(const PatchCase& k, std::ostream* os) {
  *os << "[" << k.b << ", " << k.c << ", " << k.h << ", " << k.w << "] p=" << k.p;
}

// patches[b, gy·gw + gx, (c·p + ky)·p + kx] = images[b, c, gy·p + ky, gx·p + kx]
std::vector<double> ref_patchify(const std::vector<double>& img, const PatchCase& k) {
  const int64_t gh = k.h / k.p, gw = k.w / k.p, f = k.c * k.p * k.p;
  std::vector<double> out(img.size());
  for (int64_t b = 0; b < k.b; ++b)
    for (int64_t c = 0; c < k.c; ++c)
      for (int64_t y = 0; y < k.h; ++y)
        for (int64_t x = 0; x < k.w; ++x) {
          const int64_t patch = (y / k.p) * gw + x / k.p, feat = (c * k.p + y % k.p) * k.p + x % k.p;
          out[(b * gh * gw + patch) * f + feat] = img[((b * k.c + c) * k.h + y) * k.w + x];
        }
  return out;
}

class PatchifyTest : public ::testing::TestWithParam<std::tuple<PatchCase, DType>> {};

TEST_P(PatchifyTest, MatchesDirectLoopAndUnpatchifyInverts) {
  const auto [k, dtype] = GetParam();
  const Tensor img = random_tensor({k.b, k.c, k.h, k.w}, dtype, 51);
  const Tensor patches = kernels::patchify(img, k.p);
  const Shape pshape{k.b, (k.h / k.p) * (k.w / k.p), k.c * k.p * k.p};
  EXPECT_TRUE(same_bits(patches, from_vector(ref_patchify(img.to_vector<double>(), k), pshape, dtype)));
  EXPECT_TRUE(same_bits(kernels::unpatchify(patches, k.p, k.c, k.h, k.w), img));
  // And the inverse on its own, from random patches.
  const Tensor rp = random_tensor(pshape, dtype, 52);
  const Tensor back = kernels::unpatchify(rp, k.p, k.c, k.h, k.w);
  EXPECT_TRUE(same_bits(rp, from_vector(ref_patchify(back.to_vector<double>(), k), pshape, dtype)));
}

INSTANTIATE_TEST_SUITE_P(Images, PatchifyTest,
                         ::testing::Combine(::testing::Values(PatchCase{2, 1, 8, 12, 4}, PatchCase{1, 3, 14, 21, 7},
                                                              PatchCase{2, 3, 28, 14, 7}, PatchCase{3, 3, 16, 16, 4},
                                                              PatchCase{1, 1, 4, 4, 4}, PatchCase{4, 3, 32, 32, 4}),
                                            ::testing::ValuesIn(kMoveDtypes)));

TEST(Patchify, ErrorsNameTheShape) {
  const Tensor odd = random_tensor({1, 3, 30, 28}), three_d = random_tensor({3, 28, 28});
  const Tensor wrong = random_tensor({2, 49, 48});  // 48 features, but C=1 and p=4 make 16
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::patchify(odd, 4); }, {"patchify", "30", "[1, 3, 30, 28]", "multiples"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::patchify(three_d, 4); }, {"patchify", "[3, 28, 28]"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::unpatchify(wrong, 4, 1, 28, 28); }, {"[2, 49, 48]", "[2, 49, 16]"}));
}

// ---- index_select ----------------------------------------------------------------------------------------

TEST(IndexSelect, GathersAlongDim0And1WithRepeats) {
  const Shape shape{5, 6, 7};
  for (DType dtype : kMoveDtypes) {
    const Tensor x = random_tensor(shape, dtype, 61);
    for (auto [dim, idx, idx_dtype] : {std::tuple<int64_t, std::vector<int64_t>, DType>{0, {4, 0, 4, 2, 4}, DType::i64},
                                       {1, {5, 5, 0, 3}, DType::i32},
                                       {-1, {6, 1, 1}, DType::i64},
                                       {1, {}, DType::i64}}) {
      const Tensor indices = from_vector(idx, {static_cast<int64_t>(idx.size())}, idx_dtype);
      const Tensor expected = ref_index_select(x, (dim + 3) % 3, idx);
      EXPECT_TRUE(same_bits(kernels::index_select(x, dim, indices), expected)) << dtype << " dim " << dim;
    }
  }
}

TEST(IndexSelect, BackwardAccumulatesRepeats) {
  const Shape full{5, 6, 7};
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    for (auto [dim, idx] : {std::pair<int64_t, std::vector<int64_t>>{0, {4, 0, 4, 2, 4}}, {1, {5, 5, 0, 3, 5, 5}}}) {
      const Tensor g = random_tensor(with_extent(full, dim, static_cast<int64_t>(idx.size())), dtype, 62);
      const Tensor indices = from_vector(idx, {static_cast<int64_t>(idx.size())}, DType::i64);
      const Tensor out = kernels::index_select_backward(g, full, dim, indices);
      EXPECT_EQ(out.dtype(), dtype);
      const auto expected = ref_index_select_backward(g, full, dim, idx);
      const double tol = dtype == DType::f64 ? 1e-14 : dtype == DType::f32 ? 1e-6 : 1.0 / 128;
      EXPECT_TRUE(all_close(out, expected, tol, tol)) << dtype << " dim " << dim;
    }
  }
}

TEST(IndexSelect, BackwardIsDeterministicOnLargeInputs) {
  // An embedding-style gradient: many repeats of few rows, large enough to run on several threads.
  const Shape full{2, 50, 700};
  std::vector<int64_t> idx(400);
  for (size_t j = 0; j < idx.size(); ++j) idx[j] = static_cast<int64_t>((j * 7919) % 50);
  const Tensor indices = from_vector(idx, {400}, DType::i32);
  const Tensor g = random_tensor({2, 400, 700}, DType::f32, 63);
  const Tensor a = kernels::index_select_backward(g, full, 1, indices);
  const Tensor b = kernels::index_select_backward(g, full, 1, indices);
  EXPECT_TRUE(same_bits(a, b));
  EXPECT_TRUE(all_close(a, ref_index_select_backward(g, full, 1, idx), 1e-5, 1e-5));
}

TEST(IndexSelect, ErrorsNameIndexAndExtent) {
  const Tensor x = random_tensor({5, 6});
  const Tensor bad = from_vector(std::vector<int64_t>{1, 9}, {2});
  EXPECT_TRUE(
      octet::testing::throws_with([&] { kernels::index_select(x, 0, bad); }, {"index_select", "index 9", "extent 5", "[5, 6]"}));
  const Tensor neg = from_vector(std::vector<int64_t>{-1}, {1});
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::index_select(x, 1, neg); }, {"index -1", "extent 6"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::index_select(x, 0, random_tensor({2})); }, {"i64 or i32", "f32[2]"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::index_select(x, 0, zeros({1, 2}, DType::i64)); }, {"1-D", "[1, 2]"}));
  const Tensor ok = from_vector(std::vector<int64_t>{1, 2}, {2});
  const Tensor g3 = random_tensor({3, 6}), g2 = random_tensor({2, 6});
  const auto wrong_grad = [&] { kernels::index_select_backward(g3, {5, 6}, 0, ok); };
  EXPECT_TRUE(octet::testing::throws_with(wrong_grad, {"index_select_backward", "[3, 6]", "[5, 6]"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { kernels::index_select_backward(g2, {5, 6}, 0, bad); }, {"index 9", "extent 5"}));
}

}  // namespace
}  // namespace octet
