// LayerNorm, GELU, cross-entropy and dropout against float64 references written here as plain
// loops, on inputs already rounded to the tested dtype (so only the kernel's arithmetic is judged).
#include "kernels/nn_ops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/philox.h"
#include "kernels/common.h"
#include "kernels/reduce.h"
#include "tests/testing.h"

namespace octet::kernels {
// Names the GELU form in parameterized test names instead of printing its bytes.
static void PrintTo(GeluApproximation a, std::ostream* os) { *os << (a == GeluApproximation::Tanh ? "tanh" : "erf"); }
}  // namespace octet::kernels

namespace {

using namespace octet;
using namespace octet::kernels;
using octet::testing::all_close;
using octet::testing::random_tensor;
using octet::testing::tolerance_for;
using Vec = std::vector<double>;
using Targets = std::vector<int64_t>;

Vec vals(const Tensor& t) { return t.to_vector<double>(); }

// Runs f, expects an octet::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  EXPECT_TRUE(octet::testing::throws_with(f, parts));
}

// ---- float64 references --------------------------------------------------------------------------------

struct LnRef { Vec y, mean, rstd; };
// w and b empty for no affine.
LnRef ref_layernorm(const Vec& x, const Vec& w, const Vec& b, int64_t C, double eps) {
  const int64_t rows = static_cast<int64_t>(x.size()) / C;
  LnRef r{Vec(x.size()), Vec(rows), Vec(rows)};
  for (int64_t i = 0; i < rows; ++i) {
    const double* xr = &x[i * C];
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += xr[c] / C;
    for (int64_t c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m) / C;
    r.mean[i] = m;
    r.rstd[i] = 1.0 / std::sqrt(v + eps);
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (xr[c] - m) * r.rstd[i];
      r.y[i * C + c] = w.empty() ? xhat : xhat * w[c] + b[c];
    }
  }
  return r;
}

struct LnGradRef { Vec dx, dw, db; };
// From y = xhat·w + b, xhat_j = (x_j - μ)·rstd: ∂μ/∂x_i = 1/C and ∂rstd/∂x_i = -rstd³·(x_i - μ)/C,
// so ∂xhat_j/∂x_i = rstd·(δ_ij - 1/C) - xhat_j·xhat_i·rstd/C, and dx_i = Σ_j dy_j·w_j·∂xhat_j/∂x_i,
// summed here term by term (not through the kernel's closed form).
LnGradRef ref_layernorm_backward(const Vec& dy, const Vec& x, const Vec& w, int64_t C, double eps) {
  const LnRef f = ref_layernorm(x, {}, {}, C, eps);  // y = xhat
  LnGradRef g{Vec(x.size()), Vec(C, 0.0), Vec(C, 0.0)};
  for (int64_t r = 0; r < static_cast<int64_t>(f.rstd.size()); ++r) {
    const double* xhat = &f.y[r * C];
    const double rs = f.rstd[r];
    for (int64_t i = 0; i < C; ++i) {
      double s = 0;
      for (int64_t j = 0; j < C; ++j) {
        s += dy[r * C + j] * (w.empty() ? 1.0 : w[j]) * (rs * ((i == j) - 1.0 / C) - xhat[j] * xhat[i] * rs / C);
      }
      g.dx[r * C + i] = s;
      g.dw[i] += dy[r * C + i] * xhat[i];
      g.db[i] += dy[r * C + i];
    }
  }
  return g;
}

const double kPi = std::numbers::pi;
double ref_gelu(double x, bool tanh_form) {
  if (!tanh_form) return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x)));
}
// Derivatives by hand: erf form Φ(x) + x·φ(x); tanh form by the product and chain rules.
double ref_gelu_grad(double x, bool tanh_form) {
  if (!tanh_form) return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * kPi);
  const double k = std::sqrt(2.0 / kPi), t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * x * x);
}

struct CeRef { double loss; Vec lse, dlogits; };
// loss = mean over counted rows of Σ_c q_c·(lse - z_c); dlogits = dloss/count · (softmax - q).
CeRef ref_cross_entropy(const Vec& z, const Targets& t, int64_t C, double s, int64_t ignore, double dloss) {
  const int64_t N = static_cast<int64_t>(t.size());
  CeRef r{0.0, Vec(N), Vec(z.size(), 0.0)};
  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i) count += t[i] != ignore;
  for (int64_t i = 0; i < N; ++i) {
    const double* zr = &z[i * C];
    const double mx = *std::max_element(zr, zr + C);
    double se = 0;
    for (int64_t c = 0; c < C; ++c) se += std::exp(zr[c] - mx);
    r.lse[i] = mx + std::log(se);
    for (int64_t c = 0; c < C && t[i] != ignore; ++c) {
      const double q = (1 - s) * (c == t[i]) + s / C;
      r.loss += q * (r.lse[i] - zr[c]) / count;
      r.dlogits[i * C + c] = dloss / count * (std::exp(zr[c] - r.lse[i]) - q);
    }
  }
  return r;
}

// Whether dropout keeps element i: the Philox convention of core/philox.h, spelled out.
bool ref_keep(uint64_t seed, uint64_t offset, int64_t i, double p) {
  return philox::uniform(philox::block_words(seed, offset + i / 4).w[i % 4]) >= p;
}

// ---- LayerNorm -------------------------------------------------------------------------------------------

class LayerNormTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, DType>> {};  // rows, C, dtype

TEST_P(LayerNormTest, ForwardAffineMatchesReference) {
  const auto [rows, C, dt] = GetParam();
  const Tensor x = random_tensor({rows, C}, dt, 11, 2.0), w = random_tensor({C}, dt, 12);
  const Tensor b = random_tensor({C}, dt, 13);
  const LayerNormOutput out = layernorm_forward(x, w, b, 1e-5);
  const LnRef ref = ref_layernorm(vals(x), vals(w), vals(b), C, 1e-5);
  const auto tol = tolerance_for(dt), stat_tol = tolerance_for(compute_dtype(dt));
  EXPECT_EQ(out.y.dtype(), dt);
  EXPECT_EQ(out.mean.dtype(), compute_dtype(dt));
  EXPECT_EQ(out.mean.shape(), Shape{rows});
  EXPECT_TRUE(all_close(out.y, ref.y, tol.atol, tol.rtol));
  EXPECT_TRUE(all_close(out.mean, ref.mean, stat_tol.atol, stat_tol.rtol));
  EXPECT_TRUE(all_close(out.rstd, ref.rstd, stat_tol.atol, stat_tol.rtol));
}

TEST_P(LayerNormTest, BackwardMatchesAnalyticGradient) {
  const auto [rows, C, dt] = GetParam();
  const Tensor x = random_tensor({rows, C}, dt, 21, 2.0), w = random_tensor({C}, dt, 22);
  const Tensor dy = random_tensor({rows, C}, dt, 23);
  const LayerNormOutput out = layernorm_forward(x, w, random_tensor({C}, dt, 24));
  const LayerNormGrads g = layernorm_backward(dy, x, w, out.mean, out.rstd);
  const LnGradRef ref = ref_layernorm_backward(vals(dy), vals(x), vals(w), C, 1e-6);
  const auto tol = tolerance_for(dt);
  const double sum_atol = tol.atol * std::sqrt(static_cast<double>(rows));  // dweight/dbias sum over rows
  EXPECT_TRUE(all_close(g.dx, ref.dx, tol.atol, tol.rtol));
  EXPECT_TRUE(all_close(g.dweight, ref.dw, sum_atol, tol.rtol));
  EXPECT_TRUE(all_close(g.dbias, ref.db, sum_atol, tol.rtol));
  EXPECT_EQ(g.dweight.dtype(), dt);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LayerNormTest,
                         ::testing::Combine(::testing::Values(1, 5, 300), ::testing::Values(3, 7, 64, 769),
                                            ::testing::Values(DType::f32, DType::f64, DType::bf16)));

TEST(LayerNorm, NoAffineForwardAndBackward) {
  const Tensor x = random_tensor({2, 3, 7}, DType::f32, 31), dy = random_tensor({2, 3, 7}, DType::f32, 32);
  const LayerNormOutput out = layernorm_forward(x, Tensor(), Tensor());
  EXPECT_EQ(out.rstd.shape(), (Shape{2, 3}));
  EXPECT_TRUE(all_close(out.y, ref_layernorm(vals(x), {}, {}, 7, 1e-6).y, 1e-5, 1e-5));
  const LayerNormGrads g = layernorm_backward(dy, x, Tensor(), out.mean, out.rstd);
  EXPECT_FALSE(g.dweight.defined() || g.dbias.defined());
  EXPECT_TRUE(all_close(g.dx, ref_layernorm_backward(vals(dy), vals(x), {}, 7, 1e-6).dx, 1e-5, 1e-5));
}

TEST(LayerNorm, WeightWithoutBias) {
  const Tensor x = random_tensor({5, 64}, DType::f64, 33), w = random_tensor({64}, DType::f64, 34);
  const Vec ref = ref_layernorm(vals(x), vals(w), Vec(64, 0.0), 64, 1e-6).y;
  EXPECT_TRUE(all_close(layernorm_forward(x, w, Tensor()).y, ref, 1e-12, 1e-10));
}

TEST(LayerNorm, Bf16InputWithF32Weight) {
  const int64_t rows = 300, C = 769;
  const Tensor x = random_tensor({rows, C}, DType::bf16, 41), dy = random_tensor({rows, C}, DType::bf16, 42);
  const Tensor w = random_tensor({C}, DType::f32, 43), b = random_tensor({C}, DType::f32, 44);
  const LayerNormOutput out = layernorm_forward(x, w, b);
  EXPECT_EQ(out.y.dtype(), DType::bf16);
  EXPECT_EQ(out.mean.dtype(), DType::f32);
  EXPECT_TRUE(all_close(out.y, ref_layernorm(vals(x), vals(w), vals(b), C, 1e-6).y, 1e-2, 1e-2));
  const LayerNormGrads g = layernorm_backward(dy, x, w, out.mean, out.rstd);
  const LnGradRef ref = ref_layernorm_backward(vals(dy), vals(x), vals(w), C, 1e-6);
  EXPECT_EQ(g.dx.dtype(), DType::bf16);
  EXPECT_EQ(g.dweight.dtype(), DType::f32);  // the weight's own precision: summed in f32, never rounded to bf16
  EXPECT_TRUE(all_close(g.dx, ref.dx, 1e-2, 1e-2));
  EXPECT_TRUE(all_close(g.dweight, ref.dw, 2e-4, 1e-5));
  EXPECT_TRUE(all_close(g.dbias, ref.db, 2e-4, 1e-5));
}

// bf16 rows are widened one at a time into a buffer at the alignment their f32 row would have (the
// f32 kernel's vectorized sums split a row into lanes by its address): y, mean and rstd are the bits
// of the f32 kernel on x widened whole, y rounded, for widths that put rows at every alignment (7, 100)
// or none off it (96), on 1 thread and on 3, with and without the affine parameters.
TEST(LayerNorm, Bf16RowsAreTheF32KernelRounded) {
  const int saved = omp_get_max_threads();
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    for (int64_t C : {7, 96, 100, 769}) {
      for (int64_t rows : {1, 37, 300}) {
        const Tensor x = random_tensor({rows, C}, DType::bf16, 45 + C, 3.0);
        const Tensor w = random_tensor({C}, DType::f32, 46), b = random_tensor({C}, DType::f32, 47);
        for (int affine = 0; affine < 3; ++affine) {  // weight and bias, weight alone (bf16), neither
          const Tensor wt = affine == 0 ? w : affine == 1 ? w.to(DType::bf16) : Tensor();
          const Tensor bt = affine == 0 ? b : Tensor();
          const LayerNormOutput got = layernorm_forward(x, wt, bt);
          const LayerNormOutput want = layernorm_forward(x.to(DType::f32), wt.defined() ? wt.to(DType::f32) : wt, bt);
          const std::string where = "C=" + std::to_string(C) + " rows=" + std::to_string(rows) + " affine " +
                                    std::to_string(affine) + ", " + std::to_string(threads) + " threads";
          ASSERT_EQ(got.y.dtype(), DType::bf16) << where;
          EXPECT_EQ(vals(got.y), vals(want.y.to(DType::bf16))) << where;
          EXPECT_EQ(vals(got.mean), vals(want.mean)) << where;
          EXPECT_EQ(vals(got.rstd), vals(want.rstd)) << where;
        }
      }
    }
  }
  omp_set_num_threads(saved);
}

// The backward likewise (layernorm_backward and add_layernorm_backward, a row at a time in f32): dx
// (with the residual gradient added before its one rounding), dweight and dbias are the bits of the
// f32 kernel on the tensors widened whole, rounded; 300 rows are five blocks of partial sums.
TEST(LayerNorm, Bf16BackwardRowsAreTheF32KernelRounded) {
  const int saved = omp_get_max_threads();
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    for (int64_t C : {7, 96, 100, 769}) {
      for (int64_t rows : {1, 37, 300}) {
        const Tensor x = random_tensor({rows, C}, DType::bf16, 55 + C, 3.0);
        const Tensor dy = random_tensor({rows, C}, DType::bf16, 56 + C), dres = random_tensor({rows, C}, DType::bf16, 57);
        const Tensor w = random_tensor({C}, DType::f32, 58);
        for (int affine = 0; affine < 3; ++affine) {  // an f32 weight, a bf16 one, none
          const Tensor wt = affine == 0 ? w : affine == 1 ? w.to(DType::bf16) : Tensor();
          const Tensor w32 = wt.defined() ? wt.to(DType::f32) : wt;
          const LayerNormOutput fwd = layernorm_forward(x, wt, Tensor());
          const std::string where = "C=" + std::to_string(C) + " rows=" + std::to_string(rows) + " affine " +
                                    std::to_string(affine) + ", " + std::to_string(threads) + " threads";
          const LayerNormGrads got = layernorm_backward(dy, x, wt, fwd.mean, fwd.rstd);
          const LayerNormGrads want = layernorm_backward(dy.to(DType::f32), x.to(DType::f32), w32, fwd.mean, fwd.rstd);
          ASSERT_EQ(got.dx.dtype(), DType::bf16) << where;
          EXPECT_TRUE(octet::testing::same_bits(got.dx, want.dx.to(DType::bf16))) << where;
          const AddLayerNormGrads added = add_layernorm_backward(dy, dres, x, wt, fwd.mean, fwd.rstd);
          const AddLayerNormGrads added_want =
              add_layernorm_backward(dy.to(DType::f32), dres.to(DType::f32), x.to(DType::f32), w32, fwd.mean, fwd.rstd);
          ASSERT_EQ(added.dh.dtype(), DType::bf16) << where;
          EXPECT_TRUE(octet::testing::same_bits(added.dh, added_want.dh.to(DType::bf16))) << where;
          ASSERT_EQ(got.dweight.defined(), wt.defined()) << where;
          if (!wt.defined()) continue;
          EXPECT_EQ(got.dweight.dtype(), wt.dtype()) << where;
          EXPECT_TRUE(octet::testing::same_bits(got.dweight, want.dweight.to(wt.dtype()))) << where;
          EXPECT_TRUE(octet::testing::same_bits(got.dbias, want.dbias.to(wt.dtype()))) << where;
          EXPECT_TRUE(octet::testing::same_bits(added.dweight, got.dweight)) << where;
          EXPECT_TRUE(octet::testing::same_bits(added.dbias, got.dbias)) << where;
        }
      }
    }
  }
  omp_set_num_threads(saved);
}

// Rows at 1e4 + N(0, 1): E[x²] - E[x]² in f32 loses every digit of the variance here, and a plain
// f32 running sum puts the mean off by ~5e-3. What remains is the rounding of the f32 mean itself
// (half an ulp of 1e4 ≈ 5e-4).
TEST(LayerNorm, StableForLargeMean) {
  const int64_t rows = 8, C = 768;
  Vec xs = vals(random_tensor({rows, C}, DType::f64, 51));
  for (double& v : xs) v += 1e4;
  const Tensor x = from_vector(xs, {rows, C}, DType::f32);
  const LayerNormOutput out = layernorm_forward(x, Tensor(), Tensor());
  const LnRef ref = ref_layernorm(vals(x), {}, {}, C, 1e-6);
  EXPECT_TRUE(all_close(out.mean, ref.mean, 0, 1e-7));
  EXPECT_TRUE(all_close(out.rstd, ref.rstd, 0, 1e-3));
  EXPECT_TRUE(all_close(out.y, ref.y, 1e-3, 0));
}

TEST(LayerNorm, BackwardReductionsDoNotDependOnThreadCount) {
  const Tensor x = random_tensor({1000, 64}, DType::f32, 61), dy = random_tensor({1000, 64}, DType::f32, 62);
  const Tensor w = random_tensor({64}, DType::f32, 63);
  const LayerNormOutput out = layernorm_forward(x, w, Tensor());
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const LayerNormGrads one = layernorm_backward(dy, x, w, out.mean, out.rstd);
  omp_set_num_threads(3);
  const LayerNormGrads three = layernorm_backward(dy, x, w, out.mean, out.rstd);
  omp_set_num_threads(saved);
  EXPECT_EQ(vals(one.dweight), vals(three.dweight));
  EXPECT_EQ(vals(one.dbias), vals(three.dbias));
  EXPECT_EQ(vals(one.dx), vals(three.dx));
}

TEST(LayerNorm, ErrorsNameOpAndTensors) {
  const Tensor x = random_tensor({4, 7}), w = random_tensor({7}), none;
  const char* op = "layernorm_forward";
  expect_error([&] { layernorm_forward(x, random_tensor({8}), none); },
               {op, "weight must be [7]", "f32[4, 7]", "f32[8]"});
  expect_error([&] { layernorm_forward(x, w, random_tensor({7}, DType::f64)); }, {op, "bias must be f32[7]"});
  expect_error([&] { layernorm_forward(x, none, random_tensor({7})); }, {op, "without weight"});
  // The weight is f32 or x's dtype: a bf16 x with f16 weights (or f32 with f64 ones) is refused.
  expect_error([&] { layernorm_forward(random_tensor({4, 7}, DType::bf16), random_tensor({7}, DType::f16), none); },
               {op, "weight is f16 but x is bf16", "must be f32 or x's dtype", ".to(DType::f32)"});
  expect_error([&] { layernorm_forward(x, random_tensor({7}, DType::f64), none); }, {op, "weight is f64 but x is f32"});
  expect_error([&] { layernorm_forward(zeros({4, 7}, DType::i64), w, none); }, {op, "floating", "i64"});
  expect_error([&] { layernorm_forward(x, w, none, -1.0); }, {op, "eps"});
  const LayerNormOutput out = layernorm_forward(x, w, none);
  expect_error([&] { layernorm_backward(x, x, w, out.mean.to(DType::f64), out.rstd); },
               {"layernorm_backward", "mean and rstd must be f32[4]"});
  expect_error([&] { layernorm_backward(random_tensor({4, 6}), x, w, out.mean, out.rstd); },
               {"layernorm_backward", "differ in shape"});
}

// ---- GELU ------------------------------------------------------------------------------------------------

class GeluTest : public ::testing::TestWithParam<std::tuple<DType, GeluApproximation, int64_t>> {};  // dtype, form, n

TEST_P(GeluTest, ForwardAndBackwardMatchReference) {
  const auto [dt, form, n] = GetParam();
  const Tensor x = random_tensor({n}, dt, 72, 3.0), dy = random_tensor({n}, dt, 73);
  const Vec xv = vals(x), dyv = vals(dy);
  Vec y(n), dx(n);
  for (int64_t i = 0; i < n; ++i) {
    y[i] = ref_gelu(xv[i], form == GeluApproximation::Tanh);
    dx[i] = dyv[i] * ref_gelu_grad(xv[i], form == GeluApproximation::Tanh);
  }
  const auto tol = tolerance_for(dt);
  EXPECT_TRUE(all_close(gelu_forward(x, form), y, tol.atol, tol.rtol));
  EXPECT_TRUE(all_close(gelu_backward(dy, x, form), dx, tol.atol, tol.rtol));
}

INSTANTIATE_TEST_SUITE_P(Forms, GeluTest,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f64, DType::bf16),
                                            ::testing::Values(GeluApproximation::None, GeluApproximation::Tanh),
                                            ::testing::Values(7, 300 * 769)));

// bf16 GELU runs the f32 kernels a chunk of 1024 at a time (kernels/cpu/bf16_chunks.h): the same
// bits as widening the whole tensor, running them in f32 and rounding, at sizes around a chunk and
// past the threads' split, on 1 thread and on 3 (ranges that start inside a chunk).
TEST(Gelu, Bf16InChunksIsTheF32OpRounded) {
  const int saved = omp_get_max_threads();
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    for (GeluApproximation form : {GeluApproximation::None, GeluApproximation::Tanh}) {
      for (int64_t n : {1, 1023, 1025, 70001}) {
        const Tensor x = random_tensor({n}, DType::bf16, 74, 4.0), dy = random_tensor({n}, DType::bf16, 75);
        const Tensor x32 = x.to(DType::f32), dy32 = dy.to(DType::f32);
        EXPECT_EQ(vals(gelu_forward(x, form)), vals(gelu_forward(x32, form).to(DType::bf16)))
            << "n=" << n << ", " << threads << " threads";
        EXPECT_EQ(vals(gelu_backward(dy, x, form)), vals(gelu_backward(dy32, x32, form).to(DType::bf16)))
            << "n=" << n << ", " << threads << " threads";
      }
    }
  }
  omp_set_num_threads(saved);
}

TEST(Gelu, TailsAreFinite) {
  const Vec xs = {-1e20, -30, -10, -5, 0.5, 5, 10, 30, 1e20};
  const Tensor x = from_vector(xs, {9}, DType::f32);
  for (GeluApproximation form : {GeluApproximation::None, GeluApproximation::Tanh}) {
    const Vec y = vals(gelu_forward(x, form)), dx = vals(gelu_backward(ones({9}), x, form));
    for (size_t i = 0; i < xs.size(); ++i) {
      EXPECT_TRUE(std::isfinite(y[i]) && std::isfinite(dx[i])) << "x = " << xs[i];
      if (std::abs(xs[i]) > 9) {
        EXPECT_NEAR(dx[i], xs[i] > 0 ? 1.0 : 0.0, 1e-6) << "x = " << xs[i];
      }
    }
    EXPECT_EQ(y.back(), 1e20f);  // gelu(x) = x far right
  }
}

TEST(Gelu, Errors) {
  const Tensor x = random_tensor({3, 5});
  expect_error([&] { gelu_backward(random_tensor({5, 3}), x); }, {"gelu_backward", "differ in shape", "f32[5, 3]"});
  expect_error([&] { gelu_backward(random_tensor({3, 5}, DType::f64), x); }, {"gelu_backward", "different dtypes"});
  expect_error([&] { gelu_forward(zeros({3}, DType::i32)); }, {"gelu", "floating"});
}

// gelu_backward_and_forward (one pass on the GPU, for a backward that needs the GELU's output again):
// on the CPU the two calls, bit for bit, a new dx whether or not dy may be written over, and dy left
// alone; the same argument checks as gelu_backward, under its own name.
TEST(Gelu, BackwardAndForwardIsTheTwoCalls) {
  for (GeluApproximation form : {GeluApproximation::None, GeluApproximation::Tanh}) {
    for (DType d : {DType::f32, DType::f64, DType::bf16}) {
      const Tensor x = random_tensor({4, 33}, d, 91, 3.0), dy = random_tensor({4, 33}, d, 92);
      const Tensor dy_before = dy.clone();
      for (bool overwrite : {false, true}) {
        const GeluGradAndOutput r = gelu_backward_and_forward(dy, x, form, overwrite);
        EXPECT_TRUE(octet::testing::same_bits(r.dx, gelu_backward(dy, x, form)));
        EXPECT_TRUE(octet::testing::same_bits(r.y, gelu_forward(x, form)));
        EXPECT_TRUE(octet::testing::same_bits(dy, dy_before));
      }
    }
  }
  const Tensor x = random_tensor({3, 5});
  expect_error([&] { gelu_backward_and_forward(random_tensor({5, 3}), x, GeluApproximation::None); },
               {"gelu_backward_and_forward", "differ in shape", "f32[5, 3]"});
  expect_error([&] { gelu_backward_and_forward(random_tensor({3, 5}), x, GeluApproximation::None, false, DType::e4m3); },
               {"gelu_backward_and_forward", "bias gradient", "e4m3"});
  expect_error([&] { gelu_backward_and_forward(random_tensor({3, 5}, DType::f64), x, GeluApproximation::Tanh); },
               {"gelu_backward_and_forward", "different dtypes"});
}

// With a bias-gradient dtype, the CPU also returns sum(dx, 0) over dx's rows in that dtype: what
// kernels::linear_backward computes for the Linear whose output x is, bit for bit (the same dx, the same
// sum); 3-D x sums over both leading dims. Without one, no dbias.
TEST(Gelu, BackwardAndForwardSumsTheBiasGradient) {
  for (DType d : {DType::f32, DType::bf16}) {
    for (DType bias_dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(d) << ", dbias " << dtype_name(bias_dtype));
      const Tensor x = random_tensor({3, 5, 33}, d, 93, 3.0), dy = random_tensor({3, 5, 33}, d, 94);
      const GeluGradAndOutput r = gelu_backward_and_forward(dy, x, GeluApproximation::None, false, bias_dtype);
      EXPECT_TRUE(octet::testing::same_bits(r.dx, gelu_backward(dy, x)));
      ASSERT_TRUE(r.dbias.defined());
      EXPECT_EQ(r.dbias.shape(), Shape({33}));
      EXPECT_EQ(r.dbias.dtype(), bias_dtype);
      EXPECT_TRUE(octet::testing::same_bits(r.dbias, sum(r.dx.reshape({15, 33}), 0).to(bias_dtype)));
      // Against float64: the 15 rows of each column summed exactly. The f32 sum, in any order, is within
      // 14·2^-24·Σ|dx| of it (each of 14 additions rounds once, relative to a partial sum <= Σ|dx|);
      // rounding that to bf16 (for d or the bias) adds 2^-8 of its magnitude, once: bf16 -> bf16 and
      // bf16 -> f32 are exact.
      const std::vector<double> dx64 = r.dx.to(DType::f64).to_vector<double>(), got = r.dbias.to(DType::f64).to_vector<double>();
      for (int64_t c = 0; c < 33; ++c) {
        double exact = 0, magnitude = 0;
        for (int64_t row = 0; row < 15; ++row) {
          exact += dx64[row * 33 + c];
          magnitude += std::fabs(dx64[row * 33 + c]);
        }
        const double rounding = (d == DType::bf16 || bias_dtype == DType::bf16) ? 0x1p-8 : 0.0;
        const double summing = 14 * 0x1p-24 * magnitude;
        EXPECT_NEAR(got[c], exact, summing + rounding * (std::fabs(exact) + summing)) << "column " << c;
      }
      const GeluGradAndOutput plain = gelu_backward_and_forward(dy, x, GeluApproximation::None);
      EXPECT_FALSE(plain.dbias.defined());
    }
  }
  // No columns: the bias gradient is empty (no rows can be inferred from 0 elements).
  const Tensor empty_x = random_tensor({4, 0});
  const GeluGradAndOutput none = gelu_backward_and_forward(empty_x, empty_x, GeluApproximation::None, false, DType::bf16);
  EXPECT_EQ(none.dbias.shape(), Shape({0}));
  EXPECT_EQ(none.dbias.dtype(), DType::bf16);
  EXPECT_EQ(none.dx.shape(), Shape({4, 0}));
}

// ---- cross-entropy ---------------------------------------------------------------------------------------

Targets random_targets(int64_t N, int64_t C, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Targets t(N);
  for (int64_t& v : t) v = static_cast<int64_t>(rng() % C);
  return t;
}

using NC = std::pair<int64_t, int64_t>;
class CrossEntropyTest : public ::testing::TestWithParam<std::tuple<NC, double, DType, DType>> {};
// (N, C), label smoothing, logits dtype, targets dtype

TEST_P(CrossEntropyTest, ForwardAndBackwardMatchReference) {
  const auto [nc, s, dt, tdt] = GetParam();
  const auto [N, C] = nc;
  const Tensor z = random_tensor({N, C}, dt, 81, 3.0);
  Targets t = random_targets(N, C, 82);
  if (N > 2) t[1] = -100;
  const Tensor targets = from_vector(t, {N}, tdt);
  const CrossEntropyOutput out = cross_entropy_forward(z, targets, s);
  const Tensor dz = cross_entropy_backward(z, targets, out.lse, full({}, 1.7, DType::f64), s);
  const CeRef ref = ref_cross_entropy(vals(z), t, C, s, -100, 1.7);
  const auto stat_tol = tolerance_for(compute_dtype(dt)), tol = tolerance_for(dt);
  EXPECT_EQ(out.loss.dtype(), compute_dtype(dt));
  EXPECT_EQ(out.loss.shape(), Shape{});
  EXPECT_NEAR(out.loss.item(), ref.loss, stat_tol.atol + stat_tol.rtol * std::abs(ref.loss));
  EXPECT_TRUE(all_close(out.lse, ref.lse, stat_tol.atol, stat_tol.rtol));
  EXPECT_EQ(dz.dtype(), dt);
  EXPECT_TRUE(all_close(dz, ref.dlogits, tol.atol, tol.rtol));
}

INSTANTIATE_TEST_SUITE_P(Cases, CrossEntropyTest,
                         ::testing::Combine(::testing::Values(NC{1, 3}, NC{5, 7}, NC{300, 769}),
                                            ::testing::Values(0.0, 0.1),
                                            ::testing::Values(DType::f32, DType::f64, DType::bf16),
                                            ::testing::Values(DType::i64, DType::i32)));

TEST(CrossEntropy, IgnoreIndexRowsDropOutOfMeanAndGradient) {
  const Tensor z = random_tensor({6, 10}, DType::f64, 91);
  const Targets t = {2, 5, 9, 2, 0, 7};  // ignore_index 2 is also a class: its rows must be skipped, not scored
  const Tensor targets = from_vector(t, {6});
  const CrossEntropyOutput out = cross_entropy_forward(z, targets, 0.1, 2);
  const CeRef ref = ref_cross_entropy(vals(z), t, 10, 0.1, 2, 1.0);
  EXPECT_NEAR(out.loss.item(), ref.loss, 1e-12);
  const Vec dz = vals(cross_entropy_backward(z, targets, out.lse, full({}, 1.0), 0.1, 2));
  for (int64_t i : {0, 30}) EXPECT_EQ(Vec(dz.begin() + i, dz.begin() + i + 10), Vec(10, 0.0)) << "row " << i / 10;
  EXPECT_TRUE(all_close(from_vector(dz, {6, 10}), ref.dlogits, 1e-12, 1e-10));
}

TEST(CrossEntropy, AllRowsIgnoredGivesZeroLossAndGradient) {
  const Tensor z = random_tensor({3, 4}), targets = from_vector(std::vector<int32_t>{-100, -100, -100}, {3});
  const CrossEntropyOutput out = cross_entropy_forward(z, targets);
  EXPECT_EQ(out.loss.item(), 0.0);
  for (double v : vals(out.lse)) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(vals(cross_entropy_backward(z, targets, out.lse, full({}, 1.0))), Vec(12, 0.0));
}

TEST(CrossEntropy, StableForLargeLogits) {
  const Tensor z = random_tensor({4, 50}, DType::f32, 92, 1e3);
  const Targets t = random_targets(4, 50, 93);
  const CrossEntropyOutput out = cross_entropy_forward(z, from_vector(t, {4}), 0.1);
  const CeRef ref = ref_cross_entropy(vals(z), t, 50, 0.1, -100, 1.0);
  EXPECT_NEAR(out.loss.item(), ref.loss, 1e-5 * std::abs(ref.loss));
  EXPECT_TRUE(all_close(cross_entropy_backward(z, from_vector(t, {4}), out.lse, full({}, 1.0), 0.1), ref.dlogits, 1e-5, 1e-4));
}

TEST(CrossEntropy, OutOfRangeTargetNamesValueAndClassCount) {
  const Tensor z = random_tensor({3, 7}), bad = from_vector(Targets{1, 7, 2}, {3});
  expect_error([&] { cross_entropy_forward(z, bad); }, {"cross_entropy_forward", "target 7", "row 1", "C = 7"});
  const Tensor negative = from_vector(std::vector<int32_t>{1, 2, -1}, {3});
  expect_error([&] { cross_entropy_forward(z, negative); }, {"target -1", "row 2", "C = 7"});
  const Tensor lse = cross_entropy_forward(z, from_vector(Targets{0, 1, 2}, {3})).lse;
  expect_error([&] { cross_entropy_backward(z, bad, lse, full({}, 1.0)); }, {"cross_entropy_backward", "target 7", "C = 7"});
}

TEST(CrossEntropy, ShapeAndDtypeErrors) {
  const Tensor z = random_tensor({3, 7}), t = from_vector(Targets{0, 1, 2}, {3});
  expect_error([&] { cross_entropy_forward(z, t.to(DType::f32)); }, {"cross_entropy_forward", "i64 or i32", "f32[3]"});
  expect_error([&] { cross_entropy_forward(random_tensor({4, 7}), t); }, {"4 rows", "3 targets"});
  expect_error([&] { cross_entropy_forward(random_tensor({3, 7, 1}), t); }, {"2-d", "f32[3, 7, 1]"});
  expect_error([&] { cross_entropy_forward(z, t, 1.5); }, {"label_smoothing"});
  expect_error([&] { cross_entropy_backward(z, t, random_tensor({3}, DType::f64), full({}, 1.0)); }, {"lse must be f32[3]"});
}

// ---- dropout ---------------------------------------------------------------------------------------------

class DropoutKeepRate : public ::testing::TestWithParam<double> {};

TEST_P(DropoutKeepRate, FractionKeptIsBinomial) {
  const double p = GetParam();
  const int64_t n = 100000;
  int64_t kept = 0;
  for (double v : vals(dropout_forward(random_tensor({n}, DType::f32, 101), p, 7, 0))) kept += v != 0.0;
  EXPECT_NEAR(static_cast<double>(kept), n * (1 - p), 5 * std::sqrt(n * p * (1 - p)));  // 5 sigma
}

INSTANTIATE_TEST_SUITE_P(Rates, DropoutKeepRate, ::testing::Values(0.1, 0.5, 0.9));

class DropoutDtype : public ::testing::TestWithParam<DType> {};

// in / (1 - p) computed in the compute type (f32 below f64) and rounded once to the dtype.
double dropout_scaled(double in, double p, DType dt) {
  return dt == DType::f64 ? in / (1 - p) : static_cast<float>(in) / static_cast<float>(1 - p);
}

TEST_P(DropoutDtype, MaskFollowsPhiloxAndKeptValuesAreExact) {
  const DType dt = GetParam();
  const int64_t n = 1003;  // not a multiple of 4
  const Tensor x = random_tensor({n}, dt, 102);
  const Vec xv = vals(x);
  Vec expected(n, 0.0);
  for (int64_t i = 0; i < n; ++i) expected[i] = ref_keep(42, 17, i, 0.3) ? dropout_scaled(xv[i], 0.3, dt) : 0.0;
  EXPECT_EQ(vals(dropout_forward(x, 0.3, 42, 17)), vals(from_vector(expected, {n}, dt)));
}

TEST_P(DropoutDtype, BackwardUsesTheForwardMask) {
  const DType dt = GetParam();
  const int64_t n = 4097;
  const Tensor x = random_tensor({n}, dt, 103), dy = random_tensor({n}, dt, 104);
  const Vec y = vals(dropout_forward(x, 0.25, 5, 9)), dyv = vals(dy);
  Vec expected(n, 0.0);
  // x has no zeros, so y == 0 exactly where the forward mask dropped.
  for (int64_t i = 0; i < n; ++i) expected[i] = y[i] != 0.0 ? dropout_scaled(dyv[i], 0.25, dt) : 0.0;
  EXPECT_EQ(vals(dropout_backward(dy, 0.25, 5, 9)), vals(from_vector(expected, {n}, dt)));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DropoutDtype, ::testing::Values(DType::f32, DType::f64, DType::bf16));

TEST(Dropout, MaskIsAFunctionOfSeedAndOffset) {
  const Tensor x = random_tensor({5000});
  const Vec a = vals(dropout_forward(x, 0.5, 3, 100));
  EXPECT_EQ(a, vals(dropout_forward(x, 0.5, 3, 100)));
  // Offset 1350 starts past the 1250 blocks the first call used.
  for (const Vec& b : {vals(dropout_forward(x, 0.5, 3, 1350)), vals(dropout_forward(x, 0.5, 4, 100))}) {
    int64_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) differ += (a[i] == 0.0) != (b[i] == 0.0);
    EXPECT_GT(differ, 2000);  // independent masks disagree on about half the elements
  }
}

// Element i uses block offset + i/4: shifting the offset by one block shifts the mask by four.
TEST(Dropout, OffsetCountsBlocksOfFour) {
  const Vec a = vals(dropout_forward(ones({40}), 0.5, 8, 10)), b = vals(dropout_forward(ones({36}), 0.5, 8, 11));
  EXPECT_EQ(Vec(a.begin() + 4, a.end()), b);
  // A shorter tensor sees a prefix of the same mask.
  EXPECT_EQ(Vec(a.begin(), a.begin() + 5), vals(dropout_forward(ones({5}), 0.5, 8, 10)));
}

TEST(Dropout, ZeroPIsIdentity) {
  const Tensor x = random_tensor({3, 33}, DType::bf16);
  const Tensor y = dropout_forward(x, 0.0, 1, 2);
  EXPECT_EQ(vals(y), vals(x));
  EXPECT_NE(y.data_ptr(), x.data_ptr());  // a fresh tensor, not an alias of x
  EXPECT_EQ(vals(dropout_backward(x, 0.0, 1, 2)), vals(x));
}

TEST(Dropout, BadArgumentsError) {
  const Tensor x = random_tensor({8});
  for (double p : {1.0, 1.5, -0.1, std::numeric_limits<double>::quiet_NaN()}) {
    expect_error([&] { dropout_forward(x, p, 0, 0); }, {"dropout_forward", "p must be in [0, 1)", "f32[8]"});
    expect_error([&] { dropout_backward(x, p, 0, 0); }, {"dropout_backward", "p must be in [0, 1)"});
  }
  expect_error([&] { dropout_forward(zeros({8}, DType::i64), 0.5, 0, 0); }, {"dropout_forward", "floating"});
}

}  // namespace
