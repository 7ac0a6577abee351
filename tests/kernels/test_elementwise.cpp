// Elementwise kernels against float64 references written here (plain loops over doubles), in f32,
// f64 and bf16. bf16 inputs are rounded first; the reference then runs in f64 on the rounded values.
#include "kernels/elementwise.h"

#include <omp.h>

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

using Ref1 = std::function<double(double)>;
using Ref2 = std::function<double(double, double)>;

using octet::testing::throws_with;

std::vector<double> host(const Tensor& t) { return t.to_vector<double>(); }


// Offset into a tensor of shape s of the output multi-index idx (s right-aligned, extent-1 dims read 0).
int64_t source_offset(const std::vector<int64_t>& idx, const Shape& s) {
  const size_t lead = idx.size() - s.size();
  int64_t off = 0;
  for (size_t d = 0; d < s.size(); ++d) off = off * s[d] + (s[d] == 1 ? 0 : idx[lead + d]);
  return off;
}

// out[i] = f(a[...], b[...]) under NumPy broadcasting, by explicit index arithmetic.
std::vector<double> ref_broadcast(const std::vector<double>& a, const Shape& as, const std::vector<double>& b,
                                  const Shape& bs, const Shape& out, const Ref2& f) {
  std::vector<double> r(static_cast<size_t>(out.numel()));
  std::vector<int64_t> idx(out.size());
  for (int64_t i = 0; i < out.numel(); ++i) {
    for (int64_t d = out.ndim() - 1, rem = i; d >= 0; --d) idx[d] = rem % out[d], rem /= out[d];
    r[i] = f(a[source_offset(idx, as)], b[source_offset(idx, bs)]);
  }
  return r;
}

std::vector<double> ref_map(const std::vector<double>& a, const Ref1& f) {
  std::vector<double> r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = f(a[i]);
  return r;
}

// (a shape, b shape, broadcast shape): equal shapes of odd sizes, scalars, bias-style trailing
// broadcasts, general broadcasts, and shapes big enough for the OpenMP path.
const std::vector<std::vector<Shape>> kPairs = {
    {{1}, {1}, {1}},
    {{7}, {7}, {7}},
    {{33}, {33}, {33}},
    {{3, 401}, {3, 401}, {3, 401}},
    {{256, 161}, {256, 161}, {256, 161}},
    {{2, 3, 4}, {4}, {2, 3, 4}},
    {{2, 1, 4}, {3, 1}, {2, 3, 4}},
    {{}, {5, 6}, {5, 6}},
    {{5, 6}, {}, {5, 6}},
    {{}, {}, {}},
    {{1, 1, 7}, {7}, {1, 1, 7}},
    {{64, 33, 17}, {33, 17}, {64, 33, 17}},
    {{17}, {64, 1, 17}, {64, 1, 17}},
    {{3, 1, 5}, {1, 4, 1}, {3, 4, 5}},
    {{40, 1, 300}, {1, 8, 300}, {40, 8, 300}},
};

class Elementwise : public ::testing::TestWithParam<DType> {
 protected:
  // For every shape pair: random inputs from make_a/make_b, kernel vs reference.
  void check_binary(const std::function<Tensor(const Tensor&, const Tensor&)>& kernel, const Ref2& ref,
                    double lo_a = 0, double hi_a = 0, double lo_b = 0, double hi_b = 0) {
    const DType dt = GetParam();
    const auto tol = tolerance_for(dt);
    uint64_t seed = 10;
    for (const auto& p : kPairs) {
      const Tensor a = hi_a > lo_a ? uniform_tensor(p[0], lo_a, hi_a, dt, ++seed) : random_tensor(p[0], dt, ++seed);
      const Tensor b = hi_b > lo_b ? uniform_tensor(p[1], lo_b, hi_b, dt, ++seed) : random_tensor(p[1], dt, ++seed);
      const Tensor out = kernel(a, b);
      ASSERT_EQ(out.shape(), p[2]) << p[0] << " with " << p[1];
      ASSERT_EQ(out.dtype(), dt);
      EXPECT_TRUE(all_close(out, ref_broadcast(host(a), p[0], host(b), p[1], p[2], ref), tol.atol, tol.rtol))
          << p[0] << " with " << p[1];
    }
  }

  void check_unary(const std::function<Tensor(const Tensor&)>& kernel, const Ref1& ref, double lo, double hi) {
    const DType dt = GetParam();
    const auto tol = tolerance_for(dt);
    for (const Shape& s : {Shape{}, Shape{1}, Shape{7}, Shape{33, 3}, Shape{1031}, Shape{70001}}) {
      const Tensor a = hi > lo ? uniform_tensor(s, lo, hi, dt, 5) : random_tensor(s, dt, 5, 2.0);
      const Tensor out = kernel(a);
      ASSERT_EQ(out.shape(), s);
      ASSERT_EQ(out.dtype(), dt);
      EXPECT_TRUE(all_close(out, ref_map(host(a), ref), tol.atol, tol.rtol)) << s;
    }
  }

  void check_scalar(const std::function<Tensor(const Tensor&, double)>& kernel, const Ref2& ref, double lo, double hi) {
    const DType dt = GetParam();
    const auto tol = tolerance_for(dt);
    for (double s : {-1.75, 0.37, 3.0}) {
      for (const Shape& shape : {Shape{}, Shape{7}, Shape{5, 33}, Shape{300, 130}}) {
        const Tensor a = hi > lo ? uniform_tensor(shape, lo, hi, dt, 6) : random_tensor(shape, dt, 6);
        const Tensor out = kernel(a, s);
        ASSERT_EQ(out.shape(), shape);
        EXPECT_TRUE(all_close(out, ref_map(host(a), [&](double x) { return ref(x, s); }), tol.atol, tol.rtol))
            << "scalar " << s << ", shape " << shape;
      }
    }
  }
};

INSTANTIATE_TEST_SUITE_P(Dtypes, Elementwise, ::testing::Values(DType::f32, DType::f64, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---- binary ops ------------------------------------------------------------------------------------

TEST_P(Elementwise, Add) { check_binary(add, [](double x, double y) { return x + y; }); }
TEST_P(Elementwise, Sub) { check_binary(sub, [](double x, double y) { return x - y; }); }
TEST_P(Elementwise, Mul) { check_binary(mul, [](double x, double y) { return x * y; }); }
TEST_P(Elementwise, Div) { check_binary(div, [](double x, double y) { return x / y; }, -3, 3, 0.5, 2.0); }
TEST_P(Elementwise, Pow) { check_binary(pow, [](double x, double y) { return std::pow(x, y); }, 0.2, 3.0); }
TEST_P(Elementwise, Maximum) { check_binary(maximum, [](double x, double y) { return std::max(x, y); }); }

// ---- scalar ops ------------------------------------------------------------------------------------

TEST_P(Elementwise, AddScalar) { check_scalar(add_scalar, [](double x, double s) { return x + s; }, 0, 0); }
TEST_P(Elementwise, MulScalar) { check_scalar(mul_scalar, [](double x, double s) { return x * s; }, 0, 0); }
TEST_P(Elementwise, RsubScalar) { check_scalar(rsub_scalar, [](double x, double s) { return s - x; }, 0, 0); }
TEST_P(Elementwise, RdivScalar) { check_scalar(rdiv_scalar, [](double x, double s) { return s / x; }, 0.3, 4); }
TEST_P(Elementwise, PowScalar) { check_scalar(pow_scalar, [](double x, double e) { return std::pow(x, e); }, 0.3, 4); }

// ---- unary ops -------------------------------------------------------------------------------------

TEST_P(Elementwise, Neg) { check_unary(neg, [](double x) { return -x; }, 0, 0); }
TEST_P(Elementwise, Exp) { check_unary(exp, [](double x) { return std::exp(x); }, 0, 0); }
TEST_P(Elementwise, Log) { check_unary(log, [](double x) { return std::log(x); }, 0.01, 50); }
TEST_P(Elementwise, Tanh) { check_unary(tanh, [](double x) { return std::tanh(x); }, 0, 0); }
TEST_P(Elementwise, Sqrt) { check_unary(sqrt, [](double x) { return std::sqrt(x); }, 0.0, 50); }
TEST_P(Elementwise, Rsqrt) { check_unary(rsqrt, [](double x) { return 1 / std::sqrt(x); }, 0.01, 50); }
TEST_P(Elementwise, Abs) { check_unary(abs, [](double x) { return std::fabs(x); }, 0, 0); }
TEST_P(Elementwise, Sign) { check_unary(sign, [](double x) { return double((x > 0) - (x < 0)); }, 0, 0); }

// bf16 operands multiply and add exactly in f32 (8-bit significands), so a single rounding to bf16
// must give the correctly rounded result: bit for bit what f64 -> bf16 conversion gives.
TEST(ElementwiseBf16, RoundsOnceToTheStorageDtype) {
  const Tensor a = random_tensor({4099}, DType::bf16, 1), b = random_tensor({4099}, DType::bf16, 2);
  const std::vector<double> x = host(a), y = host(b);
  std::vector<double> prod(x.size());
  for (size_t i = 0; i < x.size(); ++i) prod[i] = x[i] * y[i];
  const Tensor expected = from_vector(prod, {4099}, DType::bf16);
  EXPECT_TRUE(all_close(mul(a, b), expected, 0, 0));
}

// bf16 operands of one shape take the chunked path (kernels/cpu/bf16_chunks.h): every binary op
// gives the bits of the same op on the operands widened to f32, rounded, at sizes around a chunk of
// 1024 and past the threads' split, on 1 thread and on 3; NaN, infinities and signed zeros among the
// operands.
TEST(ElementwiseBf16, SameShapeOpsAreTheF32OpsRounded) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const int saved = omp_get_max_threads();
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    for (int64_t n : {5, 1023, 1025, 70001}) {
      std::vector<double> x = host(uniform_tensor({n}, 0.25, 4.0, DType::bf16, 3));
      std::vector<double> y = host(uniform_tensor({n}, -4.0, 4.0, DType::bf16, 4));
      const std::vector<double> odd = {nan, inf, -inf, 0.0, -0.0};
      for (size_t i = 0; i < odd.size() && i < x.size(); ++i) x[x.size() - 1 - i] = odd[i], y[i] = odd[i];
      const Tensor a = from_vector(x, {n}, DType::bf16), b = from_vector(y, {n}, DType::bf16);
      const Tensor a32 = a.to(DType::f32), b32 = b.to(DType::f32);
      for (const auto& [name, f] : std::vector<std::pair<const char*, Tensor (*)(const Tensor&, const Tensor&)>>{
               {"add", add}, {"sub", sub}, {"mul", mul}, {"div", div}, {"pow", pow}, {"maximum", maximum}}) {
        const Tensor got = f(a, b), want = f(a32, b32).to(DType::bf16);
        ASSERT_EQ(got.dtype(), DType::bf16);
        const std::vector<double> g = host(got), w = host(want);
        int64_t differ = 0;
        for (size_t i = 0; i < g.size(); ++i) {
          differ += std::isnan(g[i]) != std::isnan(w[i]) || (!std::isnan(g[i]) && (g[i] != w[i] ||
                                                             std::signbit(g[i]) != std::signbit(w[i])));
        }
        EXPECT_EQ(differ, 0) << name << ", n=" << n << ", " << threads << " threads";
      }
    }
  }
  omp_set_num_threads(saved);
}

TEST(ElementwiseSpecial, SignedZerosAndNaN) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor a = from_vector<double>({-2.5, 0.0, -0.0, 3.0, nan, -1e-30}, {6}, DType::f32);
  const std::vector<double> s = host(sign(a));
  EXPECT_EQ(s[0], -1);
  EXPECT_EQ(s[1], 0);
  EXPECT_EQ(s[2], 0);
  EXPECT_EQ(s[3], 1);
  EXPECT_TRUE(std::isnan(s[4]));
  EXPECT_EQ(s[5], -1);
  EXPECT_TRUE(std::signbit(host(neg(a))[1]));  // -(+0) is -0
  EXPECT_FALSE(std::signbit(host(abs(a))[2]));  // |-0| is +0
}

TEST(ElementwiseSpecial, MaximumPropagatesNaNFromEitherSide) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor a = from_vector<double>({nan, 1.0, 2.0, -5.0}, {4}, DType::f32);
  const Tensor b = from_vector<double>({0.0, nan, 1.0, -4.0}, {4}, DType::f32);
  const std::vector<double> m = host(maximum(a, b));
  EXPECT_TRUE(std::isnan(m[0]));
  EXPECT_TRUE(std::isnan(m[1]));
  EXPECT_EQ(m[2], 2.0);
  EXPECT_EQ(m[3], -4.0);
}

// ---- integers ----------------------------------------------------------------------------------------

TEST(ElementwiseIntegers, ArithmeticIsExactWithBroadcasting) {
  for (DType dt : {DType::i32, DType::i64}) {
    const Shape as{4, 1, 9}, bs{5, 1};
    const Tensor a = uniform_tensor(as, -1000, 1000, DType::f64, 3).to(dt);  // truncated to whole numbers
    const Tensor b = uniform_tensor(bs, -1000, 1000, DType::f64, 4).to(dt);
    const Shape out{4, 5, 9};
    const std::vector<double> x = host(a), y = host(b);
    EXPECT_TRUE(all_close(add(a, b), ref_broadcast(x, as, y, bs, out, std::plus<double>()), 0, 0));
    EXPECT_TRUE(all_close(sub(a, b), ref_broadcast(x, as, y, bs, out, std::minus<double>()), 0, 0));
    EXPECT_TRUE(all_close(mul(a, b), ref_broadcast(x, as, y, bs, out, std::multiplies<double>()), 0, 0));
    const auto larger = [](double p, double q) { return std::max(p, q); };
    EXPECT_TRUE(all_close(maximum(a, b), ref_broadcast(x, as, y, bs, out, larger), 0, 0));
    EXPECT_EQ(add(a, b).dtype(), dt);
    EXPECT_TRUE(all_close(neg(a), ref_map(x, [](double v) { return -v; }), 0, 0));
    EXPECT_TRUE(all_close(abs(a), ref_map(x, [](double v) { return std::fabs(v); }), 0, 0));
    EXPECT_TRUE(all_close(sign(a), ref_map(x, [](double v) { return double((v > 0) - (v < 0)); }), 0, 0));
    EXPECT_TRUE(all_close(add_scalar(a, 7), ref_map(x, [](double v) { return v + 7; }), 0, 0));
    EXPECT_TRUE(all_close(mul_scalar(a, -3), ref_map(x, [](double v) { return v * -3; }), 0, 0));
    EXPECT_TRUE(all_close(rsub_scalar(a, 11), ref_map(x, [](double v) { return 11 - v; }), 0, 0));
  }
}

TEST(ElementwiseIntegers, OverflowWraps) {
  const int32_t big = std::numeric_limits<int32_t>::max();
  const Tensor a = from_vector<int32_t>({big, 5}, {2}), b = from_vector<int32_t>({1, -7}, {2});
  const std::vector<int32_t> s = add(a, b).to_vector<int32_t>();
  EXPECT_EQ(s[0], std::numeric_limits<int32_t>::min());
  EXPECT_EQ(s[1], -2);
}

TEST(ElementwiseIntegers, UnnaturalOpsAreRefused) {
  const Tensor a = from_vector<int64_t>({1, 2, 3}, {3}), b = from_vector<int64_t>({4, 5, 6}, {3});
  EXPECT_TRUE(throws_with([&] { div(a, b); }, {"div", "i64[3]", "floating"}));
  EXPECT_TRUE(throws_with([&] { pow(a, b); }, {"pow", "i64[3]"}));
  for (const auto& f : {exp, log, tanh, sqrt, rsqrt}) EXPECT_TRUE(throws_with([&] { f(a); }, {"floating", "i64[3]"}));
  EXPECT_TRUE(throws_with([&] { exp(a); }, {"exp"}));
  EXPECT_TRUE(throws_with([&] { add_scalar(a, 2.5); }, {"add_scalar", "2.5", "i64[3]"}));
  EXPECT_TRUE(throws_with([&] { rdiv_scalar(a, 2); }, {"rdiv_scalar"}));
  const Tensor u = from_vector<uint8_t>({1, 2}, {2});
  EXPECT_TRUE(throws_with([&] { add(u, u); }, {"add", "u8[2]"}));
}

// ---- errors ------------------------------------------------------------------------------------------

TEST(ElementwiseErrors, IncompatibleShapesNameBothShapes) {
  const Tensor a = random_tensor({2, 3}), b = random_tensor({4});
  EXPECT_TRUE(throws_with([&] { add(a, b); }, {"add", "[2, 3]", "[4]"}));
  const Tensor c = random_tensor({5, 2, 3}), d = random_tensor({3, 3});
  EXPECT_TRUE(throws_with([&] { mul(c, d); }, {"mul", "[5, 2, 3]", "[3, 3]"}));
  EXPECT_TRUE(throws_with([&] { broadcast_shapes({2, 3}, {3, 2}, "myop"); }, {"myop", "[2, 3]", "[3, 2]"}));
}

TEST(ElementwiseErrors, DtypeMismatchIsRefused) {
  const Tensor a = random_tensor({3}, DType::f32), b = random_tensor({3}, DType::bf16);
  EXPECT_TRUE(throws_with([&] { sub(a, b); }, {"sub", "f32[3]", "bf16[3]", "dtype"}));
  EXPECT_TRUE(throws_with([&] { add(Tensor(), b); }, {"add", "undefined"}));
}

TEST(BroadcastShapes, FollowsNumPyRules) {
  EXPECT_EQ(broadcast_shapes({2, 3, 4}, {4}, "t"), Shape({2, 3, 4}));
  EXPECT_EQ(broadcast_shapes({2, 1, 4}, {3, 1}, "t"), Shape({2, 3, 4}));
  EXPECT_EQ(broadcast_shapes({}, {5, 6}, "t"), Shape({5, 6}));
  EXPECT_EQ(broadcast_shapes({}, {}, "t"), Shape({}));
  EXPECT_EQ(broadcast_shapes({1}, {0}, "t"), Shape({0}));
  EXPECT_EQ(broadcast_shapes({7, 1}, {1, 1, 1}, "t"), Shape({1, 7, 1}));
  const Tensor empty_rows = add(random_tensor({0, 3}), random_tensor({3}));
  EXPECT_EQ(empty_rows.shape(), Shape({0, 3}));
}

// ---- broadcast_to ------------------------------------------------------------------------------------

TEST(BroadcastTo, CopiesAlongBroadcastDimsForAnyDtype) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{4}, {2, 3, 4}}, {{3, 1}, {2, 3, 5}}, {{}, {3, 2}}, {{1, 4, 1}, {2, 4, 3}}, {{7}, {7}}, {{301}, {200, 301}}};
  for (DType dt : {DType::f32, DType::bf16, DType::f64, DType::i64, DType::u8}) {
    for (const auto& [from, to] : cases) {
      const Tensor a = uniform_tensor(from, 0, 100, DType::f64, 8).to(dt);
      const Tensor out = broadcast_to(a, to);
      ASSERT_EQ(out.shape(), to);
      ASSERT_EQ(out.dtype(), dt);
      const std::vector<double> zeros(static_cast<size_t>(Shape(to).numel()), 0.0);
      const auto expected = ref_broadcast(host(a), from, zeros, to, to, [](double x, double) { return x; });
      EXPECT_TRUE(all_close(out, expected, 0, 0)) << dtype_name(dt) << " " << from << " -> " << to;
    }
  }
  EXPECT_TRUE(throws_with([] { broadcast_to(random_tensor({3}), {2, 4}); }, {"broadcast_to", "[3]", "[2, 4]"}));
  EXPECT_TRUE(throws_with([] { broadcast_to(random_tensor({2, 3}), {3}); }, {"broadcast_to", "[2, 3]", "[3]"}));
}

// ---- in place ----------------------------------------------------------------------------------------

TEST(AddInPlace, AccumulatesWithAlphaInEveryDtypePair) {
  const std::vector<std::pair<DType, DType>> pairs = {{DType::f32, DType::f32}, {DType::f64, DType::f64},
                                                      {DType::bf16, DType::f32}, {DType::f32, DType::bf16},
                                                      {DType::bf16, DType::bf16}, {DType::f64, DType::f32}};
  for (const auto& [dd, sd] : pairs) {
    for (const Shape& s : {Shape{}, Shape{7}, Shape{70001}}) {
      Tensor dst = random_tensor(s, dd, 1);
      const Tensor src = random_tensor(s, sd, 2);
      const std::vector<double> d0 = host(dst), s0 = host(src);
      void* before = dst.data_ptr();
      add_(dst, src, -0.5);
      EXPECT_EQ(dst.data_ptr(), before);
      EXPECT_EQ(dst.dtype(), dd);
      std::vector<double> ref(d0.size());
      for (size_t i = 0; i < ref.size(); ++i) ref[i] = d0[i] - 0.5 * s0[i];
      const auto tol = tolerance_for(dd);
      EXPECT_TRUE(all_close(dst, ref, tol.atol, tol.rtol)) << dtype_name(dd) << " += " << dtype_name(sd) << " " << s;
    }
  }
}

TEST(AddInPlace, WritesThroughViewsAndIntegers) {
  // A view over part of a flat buffer (how FSDP lays out parameters): only its range changes.
  Tensor flat = from_vector<float>({1, 2, 3, 4, 5, 6}, {6});
  Tensor view = flat.narrow(2, 3);
  add_(view, from_vector<float>({10, 20, 30}, {3}));
  EXPECT_EQ(flat.to_vector<float>(), (std::vector<float>{1, 2, 13, 24, 35, 6}));

  Tensor counts = from_vector<int64_t>({1, 2, 3}, {3});
  add_(counts, from_vector<int32_t>({5, 6, 7}, {3}), 2);
  EXPECT_EQ(counts.to_vector<int64_t>(), (std::vector<int64_t>{11, 14, 17}));

  Tensor dst = random_tensor({3});
  EXPECT_TRUE(throws_with([&] { add_(dst, random_tensor({4})); }, {"add_", "[3]", "[4]"}));
  EXPECT_TRUE(throws_with([&] { add_(counts, random_tensor({3})); }, {"add_", "f32[3]", "i64[3]"}));
  EXPECT_TRUE(throws_with([&] { add_(counts, counts, 0.5); }, {"add_", "0.5"}));
}

TEST(MulScalarInPlace, ScalesAndRoundsOnce) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    Tensor t = random_tensor({1000, 41}, dt, 3);
    const std::vector<double> before = host(t);
    mul_scalar_(t, 1.25);
    const auto tol = tolerance_for(dt);
    EXPECT_TRUE(all_close(t, ref_map(before, [](double x) { return 1.25 * x; }), tol.atol, tol.rtol)) << dtype_name(dt);
  }
  Tensor i = from_vector<int32_t>({-3, 4, 9}, {3});
  mul_scalar_(i, -2);
  EXPECT_EQ(i.to_vector<int32_t>(), (std::vector<int32_t>{6, -8, -18}));
}

}  // namespace
}  // namespace octet
