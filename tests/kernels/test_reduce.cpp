// Reductions and softmax against float64 references written here (plain loops over doubles), in
// f32, f64 and bf16. bf16 inputs are rounded first; the reference then runs in f64 on those values.
#include "kernels/reduce.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tests/testing.h"

namespace octet {
namespace {

using namespace octet::kernels;
using octet::testing::all_close;
using octet::testing::random_tensor;
using octet::testing::tolerance_for;
using octet::testing::uniform_tensor;

const double kNaN = std::numeric_limits<double>::quiet_NaN();

using octet::testing::throws_with;

std::vector<double> host(const Tensor& t) { return t.to_vector<double>(); }


// One reduced row of the reference: the values x[o, 0..n, i] and where they sit in the input.
struct Row {
  std::vector<double> x;
  std::vector<int64_t> at;
};

// The rows along `dim` of a tensor of shape s, in output order (outer-major, then inner).
std::vector<Row> rows_along(const std::vector<double>& v, const Shape& s, int64_t dim) {
  int64_t outer = 1, inner = 1;
  const int64_t n = s.empty() ? 1 : s[dim];
  for (int64_t d = 0; d < dim; ++d) outer *= s[d];
  for (int64_t d = dim + 1; d < s.ndim(); ++d) inner *= s[d];
  std::vector<Row> rows(static_cast<size_t>(outer * inner));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i)
      for (int64_t k = 0; k < n; ++k) {
        const int64_t at = (o * n + k) * inner + i;
        rows[o * inner + i].x.push_back(v[at]);
        rows[o * inner + i].at.push_back(at);
      }
  return rows;
}

Shape without(const Shape& s, int64_t dim, bool keepdim) {
  Shape r = s;
  if (keepdim) r[dim] = 1;
  else r.erase(r.begin() + dim);
  return r;
}

double ref_sum(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v;
  return s;
}
// First maximum, NaN beating everything.
std::pair<double, int64_t> ref_argmax(const std::vector<double>& x) {
  size_t best = 0;
  for (size_t k = 1; k < x.size(); ++k) {
    if (std::isnan(x[best])) break;
    if (std::isnan(x[k]) || x[k] > x[best]) best = k;
  }
  return {x[best], static_cast<int64_t>(best)};
}
double ref_amax(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = (std::isnan(v) || std::isnan(m)) ? kNaN : std::max(m, std::fabs(v));
  return m;
}
std::vector<double> ref_softmax(const std::vector<double>& x, bool log) {
  double m = -INFINITY, s = 0;
  for (double v : x) m = std::max(m, v);
  for (double v : x) s += std::exp(v - m);
  std::vector<double> y;
  for (double v : x) y.push_back(log ? v - m - std::log(s) : std::exp(v - m) / s);
  return y;
}

// Applies f to every row along dim and scatters the per-element results back to the input layout.
std::vector<double> ref_rowwise(const std::vector<double>& v, const Shape& s, int64_t dim,
                                const std::function<std::vector<double>(const Row&)>& f) {
  std::vector<double> out(v.size());
  for (const Row& r : rows_along(v, s, dim)) {
    const std::vector<double> y = f(r);
    for (size_t k = 0; k < y.size(); ++k) out[r.at[k]] = y[k];
  }
  return out;
}

const std::vector<Shape> kShapes = {{7}, {33, 5}, {4, 7, 9}, {3, 1031}, {300, 257}, {2, 70, 300}};

class Reduce : public ::testing::TestWithParam<DType> {
 protected:
  DType dt() const { return GetParam(); }
  // The absolute error of a sum grows with the size of its terms; scale atol accordingly.
  ::testing::AssertionResult close_sum(const Tensor& got, const std::vector<double>& want, int64_t n) const {
    const auto tol = tolerance_for(dt());
    return all_close(got, want, tol.atol * std::sqrt(double(std::max<int64_t>(n, 1))), tol.rtol);
  }
};
INSTANTIATE_TEST_SUITE_P(Dtypes, Reduce, ::testing::Values(DType::f32, DType::f64, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---- sum and mean --------------------------------------------------------------------------------------

TEST_P(Reduce, SumAlongEachDim) {
  for (const Shape& s : kShapes) {
    const Tensor a = random_tensor(s, dt(), 21);
    const std::vector<double> v = host(a);
    for (int64_t d = 0; d < s.ndim(); ++d) {
      std::vector<double> want;
      for (const Row& r : rows_along(v, s, d)) want.push_back(ref_sum(r.x));
      for (bool keep : {false, true}) {
        const Tensor got = sum(a, keep ? d : d - s.ndim(), keep);  // negative dims too
        ASSERT_EQ(got.shape(), without(s, d, keep)) << s << " dim " << d;
        ASSERT_EQ(got.dtype(), dt());
        EXPECT_TRUE(close_sum(got, want, s[d])) << s << " dim " << d;
      }
    }
  }
}

TEST_P(Reduce, SumOfEverything) {
  for (const Shape& s : {Shape{}, Shape{1}, Shape{7}, Shape{33, 31}, Shape{100003}, Shape{3, 50001}}) {
    const Tensor a = random_tensor(s, dt(), 22);
    const Tensor got = sum(a);
    ASSERT_EQ(got.shape(), Shape{});
    EXPECT_TRUE(close_sum(got, {ref_sum(host(a))}, s.numel())) << s;
  }
}

TEST_P(Reduce, MeanAlongDimsAndEverything) {
  for (const Shape& s : kShapes) {
    const Tensor a = random_tensor(s, dt(), 23);
    const auto tol = tolerance_for(dt());
    for (int64_t d = 0; d < s.ndim(); ++d) {
      std::vector<double> want;
      for (const Row& r : rows_along(host(a), s, d)) want.push_back(ref_sum(r.x) / double(r.x.size()));
      EXPECT_TRUE(all_close(mean(a, d, true), want, tol.atol, tol.rtol)) << s << " dim " << d;
    }
    EXPECT_TRUE(all_close(mean(a), {ref_sum(host(a)) / double(s.numel())}, tol.atol, tol.rtol)) << s;
  }
}

// ---- max and amax --------------------------------------------------------------------------------------

TEST_P(Reduce, MaxValuesAndIndicesAlongEachDim) {
  for (const Shape& s : kShapes) {
    const Tensor a = random_tensor(s, dt(), 24);
    for (int64_t d = 0; d < s.ndim(); ++d) {
      std::vector<double> values, indices;
      for (const Row& r : rows_along(host(a), s, d)) {
        const auto [v, k] = ref_argmax(r.x);
        values.push_back(v), indices.push_back(double(k));
      }
      const MaxResult got = max(a, d, false);
      ASSERT_EQ(got.values.shape(), without(s, d, false));
      ASSERT_EQ(got.indices.dtype(), DType::i64);
      EXPECT_TRUE(all_close(got.values, values, 0, 0)) << s << " dim " << d;  // a maximum is exact
      EXPECT_TRUE(all_close(got.indices, indices, 0, 0)) << s << " dim " << d;
    }
    const Tensor all = max(a);
    EXPECT_EQ(all.shape(), Shape{});
    EXPECT_EQ(all.item(), ref_argmax(host(a)).first) << s;
  }
}

TEST(ReduceMax, TiesPickTheFirstIndex) {
  const std::vector<double> rows = {1, 3, 3, 2, 3, /**/ 5, 5, 5, 5, 5, /**/ -1, -2, -1, -3, -1};
  const Tensor a = from_vector(rows, {3, 5}, DType::bf16);
  EXPECT_EQ(max(a, 1).indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0}));
  const Tensor b = from_vector<double>({2, 7, 4, /**/ 2, 7, 9, /**/ 1, 7, 9}, {3, 3});
  EXPECT_EQ(max(b, 0).indices.to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 1}));
  // Equal maxima in different chunks of a long row (the parallel path) still give the first.
  std::vector<float> long_row(100003, 0.5f);
  long_row[20000] = long_row[90000] = long_row[99999] = 8.0f;
  const MaxResult r = max(from_vector(long_row, {1, 100003}), -1, true);
  EXPECT_EQ(r.values.shape(), Shape({1, 1}));
  EXPECT_EQ(r.indices.item<int64_t>(), 20000);
  EXPECT_EQ(r.values.item(), 8.0);
  // A maximum sitting exactly on a chunk's first element.
  std::vector<float> boundary(100003, -0.5f);
  boundary[32768] = 1.0f;
  EXPECT_EQ(max(from_vector(boundary, {100003}), 0).indices.item<int64_t>(), 32768);
}

TEST(ReduceMax, NaNPropagatesWithItsIndex) {
  const Tensor a = from_vector<double>({1, kNaN, 9, kNaN, /**/ 4, 3, 2, 1}, {2, 4}, DType::f32);
  const MaxResult r = max(a, 1);
  const std::vector<double> v = host(r.values);
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_EQ(v[1], 4);
  EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  EXPECT_TRUE(std::isnan(max(a).item()));
}

TEST_P(Reduce, AmaxAlongDimsAndEverything) {
  const DType compute = dt() == DType::f64 ? DType::f64 : DType::f32;
  for (const Shape& s : kShapes) {
    const Tensor a = random_tensor(s, dt(), 25, 3.0);
    for (int64_t d = 0; d < s.ndim(); ++d) {
      std::vector<double> want;
      for (const Row& r : rows_along(host(a), s, d)) want.push_back(ref_amax(r.x));
      const Tensor got = amax(a, d, true);
      ASSERT_EQ(got.dtype(), compute);
      ASSERT_EQ(got.shape(), without(s, d, true));
      EXPECT_TRUE(all_close(got, want, 0, 0)) << s << " dim " << d;
    }
    EXPECT_EQ(amax(a).item(), ref_amax(host(a))) << s;
    EXPECT_EQ(amax(a).dtype(), compute);
  }
}

TEST(ReduceAmax, NegativeExtremesAndNaN) {
  const Tensor a = from_vector<double>({0.5, -7.5, 3, /**/ -0.25, 0.125, -0.0625}, {2, 3}, DType::bf16);
  EXPECT_TRUE(all_close(amax(a, 1), {7.5, 0.25}, 0, 0));
  EXPECT_TRUE(all_close(amax(a, 0), {0.5, 7.5, 3}, 0, 0));
  EXPECT_EQ(amax(a).item(), 7.5);
  const Tensor b = from_vector<double>({1, -2, kNaN, -300, /**/ 1, -2, 3, -4}, {2, 4}, DType::f32);
  const std::vector<double> rows = host(amax(b, -1));
  EXPECT_TRUE(std::isnan(rows[0]));
  EXPECT_EQ(rows[1], 4);
  EXPECT_TRUE(std::isnan(amax(b).item()));
  std::vector<float> big(70001, -1.0f);
  big[12345] = -1e6f;
  EXPECT_EQ(amax(from_vector(big, {70001})).item(), 1e6);
}

// ---- sum_to ------------------------------------------------------------------------------------------

TEST_P(Reduce, SumToUndoesBroadcasting) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{2, 3, 4}, {4}},       {{2, 3, 4}, {3, 1}},  {{2, 3, 4}, {2, 1, 4}}, {{2, 3, 4}, {1, 3, 1}},
      {{2, 3, 4}, {}},        {{5, 1, 6}, {1, 6}},  {{7}, {1}},             {{64, 33, 70}, {33, 1}},
      {{64, 33, 70}, {70}},   {{3, 4, 5, 6}, {4, 1, 6}}, {{1031, 2}, {2}}};
  for (const auto& [from, to] : cases) {
    const Tensor a = random_tensor(from, dt(), 26);
    // Reference: each input element adds into the output element it was broadcast from.
    std::vector<double> want(static_cast<size_t>(to.numel()), 0.0);
    const std::vector<double> v = host(a);
    for (int64_t i = 0; i < a.numel(); ++i) {
      int64_t rem = i, out = 0, stride = 1;
      for (int64_t d = from.ndim() - 1, t = to.ndim() - 1; d >= 0; --d, --t) {
        const int64_t idx = rem % from[d];
        rem /= from[d];
        if (t >= 0) out += (to[t] == 1 ? 0 : idx) * stride, stride *= to[t];
      }
      want[out] += v[i];
    }
    const Tensor got = sum_to(a, to);
    ASSERT_EQ(got.shape(), to);
    ASSERT_EQ(got.dtype(), dt());
    EXPECT_TRUE(close_sum(got, want, a.numel() / std::max<int64_t>(to.numel(), 1))) << from << " -> " << to;
  }
}

TEST(ReduceSumTo, IdentityCopiesAndBadTargetsNameTheShapes) {
  const Tensor a = random_tensor({2, 3});
  const Tensor same = sum_to(a, {2, 3});
  EXPECT_NE(same.data_ptr(), a.data_ptr());
  EXPECT_TRUE(all_close(same, a, 0, 0));
  EXPECT_TRUE(throws_with([&] { sum_to(a, {5}); }, {"sum_to", "[2, 3]", "[5]"}));
  EXPECT_TRUE(throws_with([&] { sum_to(a, {1, 2, 3}); }, {"sum_to", "[2, 3]", "[1, 2, 3]"}));
}

// ---- softmax -------------------------------------------------------------------------------------------

TEST_P(Reduce, SoftmaxAndLogSoftmaxAlongEachDim) {
  const auto tol = tolerance_for(dt());
  for (const Shape& s : kShapes) {
    const Tensor a = random_tensor(s, dt(), 27, 3.0);
    for (int64_t d = 0; d < s.ndim(); ++d) {
      for (bool log : {false, true}) {
        const auto want = ref_rowwise(host(a), s, d, [&](const Row& r) { return ref_softmax(r.x, log); });
        const Tensor got = log ? log_softmax(a, d) : softmax(a, d);
        ASSERT_EQ(got.shape(), s);
        ASSERT_EQ(got.dtype(), dt());
        EXPECT_TRUE(all_close(got, want, tol.atol, tol.rtol)) << (log ? "log_" : "") << "softmax " << s << " dim " << d;
      }
    }
  }
}

TEST(ReduceSoftmax, StableForLargeMagnitudes) {
  const std::vector<double> x = {1000, 999, -1000, 0, 998.5, /**/ -1000, -999, -1000, -1000, -1000};
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    const Tensor a = from_vector(x, {2, 5}, dt);
    const auto tol = tolerance_for(dt);
    for (bool log : {false, true}) {
      const auto want = ref_rowwise(host(a), {2, 5}, 1, [&](const Row& r) { return ref_softmax(r.x, log); });
      const Tensor got = log ? log_softmax(a) : softmax(a);
      for (double v : host(got)) EXPECT_TRUE(std::isfinite(v)) << dtype_name(dt);
      EXPECT_TRUE(all_close(got, want, tol.atol, tol.rtol)) << dtype_name(dt) << (log ? " log_softmax" : " softmax");
    }
  }
}

// dx_j = sum_i dy_i * dy_i/dx_j with the full Jacobian written out: softmax J_ij = p_i (δ_ij - p_j),
// log_softmax J_ij = δ_ij - p_j.
std::vector<double> ref_softmax_grad(const std::vector<double>& y, const std::vector<double>& dy, bool log) {
  const size_t n = y.size();
  std::vector<double> dx(n, 0.0);
  for (size_t j = 0; j < n; ++j) {
    const double pj = log ? std::exp(y[j]) : y[j];
    for (size_t i = 0; i < n; ++i) {
      const double pi = log ? 1.0 : y[i];
      dx[j] += dy[i] * pi * ((i == j ? 1.0 : 0.0) - pj);
    }
  }
  return dx;
}

TEST_P(Reduce, SoftmaxBackwardMatchesTheJacobian) {
  const auto tol = tolerance_for(dt());
  for (const Shape& s : {Shape{7}, Shape{33, 5}, Shape{4, 7, 9}, Shape{260, 130}}) {
    for (int64_t d = 0; d < s.ndim(); ++d) {
      for (bool log : {false, true}) {
        const Tensor x = random_tensor(s, DType::f64, 28, 2.0);
        const auto y_exact = ref_rowwise(host(x), s, d, [&](const Row& r) { return ref_softmax(r.x, log); });
        const Tensor y = from_vector(y_exact, s, dt()), dy = random_tensor(s, dt(), 29);
        const std::vector<double> yv = host(y), dyv = host(dy);
        const auto want = ref_rowwise(yv, s, d, [&](const Row& r) {
          std::vector<double> g;
          for (int64_t at : r.at) g.push_back(dyv[at]);
          return ref_softmax_grad(r.x, g, log);
        });
        const Tensor got = log ? log_softmax_backward(y, dy, d) : softmax_backward(y, dy, d);
        ASSERT_EQ(got.shape(), s);
        ASSERT_EQ(got.dtype(), dt());
        EXPECT_TRUE(all_close(got, want, tol.atol, tol.rtol))
            << (log ? "log_" : "") << "softmax_backward " << s << " dim " << d;
      }
    }
  }
}

// ---- edge cases and errors -------------------------------------------------------------------------------

TEST(ReduceEdges, ZeroDimAndEmptyTensors) {
  const Tensor scalar = from_vector<double>({2.5}, {}, DType::f32);
  EXPECT_EQ(sum(scalar, 0).item(), 2.5);
  EXPECT_EQ(sum(scalar, -1, true).shape(), Shape{});
  EXPECT_EQ(softmax(scalar).item(), 1.0);
  EXPECT_EQ(max(scalar, 0).indices.item(), 0.0);
  const Tensor none = random_tensor({0, 4});
  EXPECT_EQ(sum(none).item(), 0.0);
  EXPECT_TRUE(std::isnan(mean(none).item()));
  EXPECT_TRUE(all_close(sum(none, 0), {0, 0, 0, 0}, 0, 0));
  EXPECT_EQ(sum(none, 1).shape(), Shape({0}));
  EXPECT_EQ(amax(none).item(), 0.0);
  EXPECT_EQ(softmax(none).shape(), Shape({0, 4}));
  EXPECT_TRUE(throws_with([&] { max(none); }, {"max", "f32[0, 4]"}));
  EXPECT_TRUE(throws_with([&] { max(none, 0); }, {"max", "empty", "f32[0, 4]"}));
}

TEST(ReduceErrors, ArgumentsAreCheckedAndNamed) {
  const Tensor a = random_tensor({2, 3});
  EXPECT_TRUE(throws_with([&] { sum(a, 2); }, {"sum", "dim 2", "[2, 3]"}));
  EXPECT_TRUE(throws_with([&] { softmax(a, -3); }, {"softmax", "-3", "[2, 3]"}));
  const Tensor ints = from_vector<int64_t>({1, 2, 3}, {3});
  EXPECT_TRUE(throws_with([&] { sum(ints); }, {"sum", "floating", "i64[3]"}));
  EXPECT_TRUE(throws_with([&] { amax(ints); }, {"amax", "i64[3]"}));
  const Tensor transposed = random_tensor({3, 2});
  EXPECT_TRUE(throws_with([&] { softmax_backward(a, transposed); }, {"softmax_backward", "[2, 3]", "[3, 2]"}));
  EXPECT_TRUE(throws_with([&] { log_softmax_backward(a, random_tensor({2, 3}, DType::bf16)); },
                          {"log_softmax_backward", "f32[2, 3]", "bf16[2, 3]"}));
}

}  // namespace
}  // namespace octet
