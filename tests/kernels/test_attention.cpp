// Unfused attention against a float64 reference written here with plain loops: the forward output
// and log-sum-exp, the analytic gradients, and (on a tiny case) central finite differences.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <tuple>

#include "kernels/attention.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::all_close;
using testing::random_tensor;

struct Dims {
  int64_t b, h, s, sk, d;
  int64_t heads() const { return b * h; }
};
void PrintTo(const Dims& n, std::ostream* os) {
  *os << "B=" << n.b << " H=" << n.h << " S=" << n.s << " Sk=" << n.sk << " D=" << n.d;
}

// P[head][i][j] = softmax_j(scale · q_i·k_j), with each row's log-sum-exp.
void ref_probs(const std::vector<double>& q, const std::vector<double>& k, const Dims& n, double scale,
               std::vector<double>& p, std::vector<double>& lse) {
  p.assign(n.heads() * n.s * n.sk, 0.0);
  lse.assign(n.heads() * n.s, 0.0);
  for (int64_t h = 0; h < n.heads(); ++h) {
    for (int64_t i = 0; i < n.s; ++i) {
      double* row = &p[(h * n.s + i) * n.sk];
      double mx = -INFINITY;
      for (int64_t j = 0; j < n.sk; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < n.d; ++c) dot += q[(h * n.s + i) * n.d + c] * k[(h * n.sk + j) * n.d + c];
        row[j] = scale * dot;
        mx = std::max(mx, row[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < n.sk; ++j) sum += std::exp(row[j] - mx);
      lse[h * n.s + i] = mx + std::log(sum);
      for (int64_t j = 0; j < n.sk; ++j) row[j] = std::exp(row[j] - lse[h * n.s + i]);
    }
  }
}

// out = P·v
std::vector<double> ref_forward(const std::vector<double>& q, const std::vector<double>& k,
                                const std::vector<double>& v, const Dims& n, double scale,
                                std::vector<double>* lse_out = nullptr) {
  std::vector<double> p, lse;
  ref_probs(q, k, n, scale, p, lse);
  std::vector<double> out(n.heads() * n.s * n.d, 0.0);
  for (int64_t h = 0; h < n.heads(); ++h)
    for (int64_t i = 0; i < n.s; ++i)
      for (int64_t j = 0; j < n.sk; ++j)
        for (int64_t c = 0; c < n.d; ++c)
          out[(h * n.s + i) * n.d + c] += p[(h * n.s + i) * n.sk + j] * v[(h * n.sk + j) * n.d + c];
  if (lse_out) *lse_out = lse;
  return out;
}

struct RefGrads {
  std::vector<double> dq, dk, dv;
};

// The chain rule through out = P·v and P = softmax(X), with the softmax backward written in its
// textbook form dX_ij = P_ij·(dP_ij − Σ_l P_il·dP_il).
RefGrads ref_backward(const std::vector<double>& dout, const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, const Dims& n, double scale) {
  std::vector<double> p, lse;
  ref_probs(q, k, n, scale, p, lse);
  RefGrads g{std::vector<double>(q.size(), 0.0), std::vector<double>(k.size(), 0.0),
             std::vector<double>(v.size(), 0.0)};
  std::vector<double> dp(n.sk);
  for (int64_t h = 0; h < n.heads(); ++h) {
    for (int64_t i = 0; i < n.s; ++i) {
      const double* P = &p[(h * n.s + i) * n.sk];
      const double* dO = &dout[(h * n.s + i) * n.d];
      double row_dot = 0;
      for (int64_t j = 0; j < n.sk; ++j) {
        dp[j] = 0;
        for (int64_t c = 0; c < n.d; ++c) {
          dp[j] += dO[c] * v[(h * n.sk + j) * n.d + c];
          g.dv[(h * n.sk + j) * n.d + c] += P[j] * dO[c];
        }
        row_dot += P[j] * dp[j];
      }
      for (int64_t j = 0; j < n.sk; ++j) {
        const double dx = P[j] * (dp[j] - row_dot);
        for (int64_t c = 0; c < n.d; ++c) {
          g.dq[(h * n.s + i) * n.d + c] += scale * dx * k[(h * n.sk + j) * n.d + c];
          g.dk[(h * n.sk + j) * n.d + c] += scale * dx * q[(h * n.s + i) * n.d + c];
        }
      }
    }
  }
  return g;
}

// How far dq and dk may stray because the backward forms δ_i = Σ_c dO_ic·O_ic from the forward's
// output rounded to its dtype (as flash attention does): each O_ic is off by up to u·|O_ic| (u the
// format's unit roundoff), so δ_i by up to Δ_i = u·Σ_c |dO_ic·O_ic|. δ enters dX_ij = P_ij·(dP_ij − δ_i),
// so dq_ic = scale·Σ_j dX_ij·k_jc moves by up to scale·Δ_i·Σ_j P_ij·|k_jc|, and dk_jc by up to
// scale·Σ_i P_ij·Δ_i·|q_ic|.
struct DeltaBounds {
  std::vector<double> dq, dk;
};
DeltaBounds delta_bounds(const std::vector<double>& dout, const std::vector<double>& out, const std::vector<double>& q,
                         const std::vector<double>& k, const Dims& n, double scale, double u) {
  std::vector<double> p, lse;
  ref_probs(q, k, n, scale, p, lse);
  DeltaBounds b{std::vector<double>(q.size(), 0.0), std::vector<double>(k.size(), 0.0)};
  for (int64_t h = 0; h < n.heads(); ++h) {
    for (int64_t i = 0; i < n.s; ++i) {
      double delta = 0;
      for (int64_t c = 0; c < n.d; ++c) delta += std::abs(dout[(h * n.s + i) * n.d + c] * out[(h * n.s + i) * n.d + c]);
      delta *= u;
      for (int64_t j = 0; j < n.sk; ++j) {
        const double w = scale * p[(h * n.s + i) * n.sk + j] * delta;
        for (int64_t c = 0; c < n.d; ++c) {
          b.dq[(h * n.s + i) * n.d + c] += w * std::abs(k[(h * n.sk + j) * n.d + c]);
          b.dk[(h * n.sk + j) * n.d + c] += w * std::abs(q[(h * n.s + i) * n.d + c]);
        }
      }
    }
  }
  return b;
}

// Elements of `got` outside |got − want| <= extra + atol + rtol·|want|.
int64_t outside(const Tensor& got, const std::vector<double>& want, const std::vector<double>& extra, double atol,
                double rtol) {
  const std::vector<double> g = got.to_vector<double>();
  int64_t count = 0;
  for (size_t i = 0; i < g.size(); ++i) count += !(std::abs(g[i] - want[i]) <= extra[i] + atol + rtol * std::abs(want[i]));
  return count;
}

struct Inputs {
  Tensor q, k, v;
};
Inputs make_inputs(const Dims& n, DType dtype, uint64_t seed, double amplitude = 1.0) {
  return {random_tensor({n.b, n.h, n.s, n.d}, dtype, seed, amplitude),
          random_tensor({n.b, n.h, n.sk, n.d}, dtype, seed + 1, amplitude),
          random_tensor({n.b, n.h, n.sk, n.d}, dtype, seed + 2)};
}

const std::vector<Dims> kShapes = {{1, 1, 1, 1, 8},    {2, 3, 5, 7, 8}, {1, 2, 1, 9, 64},  {2, 2, 17, 13, 80},
                                   {1, 3, 33, 33, 64}, {2, 1, 7, 1, 8}, {1, 2, 12, 40, 80}};

class AttentionTest : public ::testing::TestWithParam<std::tuple<Dims, DType>> {};

TEST_P(AttentionTest, ForwardMatchesFloat64Softmax) {
  const auto [n, dtype] = GetParam();
  const auto in = make_inputs(n, dtype, 100);
  const double scale = 1.0 / std::sqrt(static_cast<double>(n.d));
  const auto res = kernels::attention_forward(in.q, in.k, in.v, scale);
  ASSERT_EQ(res.out.shape(), in.q.shape());
  ASSERT_EQ(res.out.dtype(), dtype);
  ASSERT_EQ(res.lse.shape(), (Shape{n.b, n.h, n.s}));
  ASSERT_EQ(res.lse.dtype(), dtype);  // f32 and f64 are their own compute dtypes
  std::vector<double> lse;
  const auto out =
      ref_forward(in.q.to_vector<double>(), in.k.to_vector<double>(), in.v.to_vector<double>(), n, scale, &lse);
  const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
  EXPECT_TRUE(all_close(res.out, out, tol, tol));
  EXPECT_TRUE(all_close(res.lse, lse, tol, tol));
}

TEST_P(AttentionTest, BackwardMatchesAnalyticFloat64Gradients) {
  const auto [n, dtype] = GetParam();
  const auto in = make_inputs(n, dtype, 200);
  const Tensor dout = random_tensor({n.b, n.h, n.s, n.d}, dtype, 203);
  const double scale = 0.5 / std::sqrt(static_cast<double>(n.d)) + 0.1;
  const auto fwd = kernels::attention_forward(in.q, in.k, in.v, scale);
  const auto g = kernels::attention_backward(dout, in.q, in.k, in.v, fwd.out, fwd.lse, scale);
  ASSERT_EQ(g.dq.shape(), in.q.shape());
  ASSERT_EQ(g.dk.shape(), in.k.shape());
  ASSERT_EQ(g.dv.shape(), in.v.shape());
  const auto ref = ref_backward(dout.to_vector<double>(), in.q.to_vector<double>(), in.k.to_vector<double>(),
                                in.v.to_vector<double>(), n, scale);
  const double tol = dtype == DType::f64 ? 1e-11 : 2e-5;
  EXPECT_TRUE(all_close(g.dq, ref.dq, tol, tol)) << "dq";
  EXPECT_TRUE(all_close(g.dk, ref.dk, tol, tol)) << "dk";
  EXPECT_TRUE(all_close(g.dv, ref.dv, tol, tol)) << "dv";
  // Shifting every key by one vector shifts each score row by a constant, which softmax ignores:
  // the key gradients of one query sum to zero over the keys.
  const auto dk = g.dk.to_vector<double>();
  for (int64_t h = 0; h < n.heads(); ++h) {
    for (int64_t c = 0; c < n.d; ++c) {
      double sum = 0;
      for (int64_t j = 0; j < n.sk; ++j) sum += dk[(h * n.sk + j) * n.d + c];
      EXPECT_NEAR(sum, 0.0, 10 * tol) << "head " << h << " feature " << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Combine(::testing::ValuesIn(kShapes), ::testing::Values(DType::f32, DType::f64)));

TEST(Attention, BackwardMatchesFiniteDifferences) {
  // L = Σ out ⊙ r, so ∂L/∂out = r; differentiate the float64 reference forward numerically.
  const Dims n{1, 2, 3, 4, 5};
  const auto in = make_inputs(n, DType::f64, 300);
  const Tensor r = random_tensor({n.b, n.h, n.s, n.d}, DType::f64, 303);
  const double scale = 0.7;
  const auto fwd = kernels::attention_forward(in.q, in.k, in.v, scale);
  const auto g = kernels::attention_backward(r, in.q, in.k, in.v, fwd.out, fwd.lse, scale);
  const auto rv = r.to_vector<double>();
  std::vector<double> x[3] = {in.q.to_vector<double>(), in.k.to_vector<double>(), in.v.to_vector<double>()};
  const Tensor* grads[3] = {&g.dq, &g.dk, &g.dv};
  const auto loss = [&] {
    const auto out = ref_forward(x[0], x[1], x[2], n, scale);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * rv[i];
    return l;
  };
  const double eps = 1e-6;
  for (int which = 0; which < 3; ++which) {
    std::vector<double> numeric(x[which].size());
    for (size_t i = 0; i < x[which].size(); ++i) {
      const double keep = x[which][i];
      x[which][i] = keep + eps;
      const double up = loss();
      x[which][i] = keep - eps;
      const double down = loss();
      x[which][i] = keep;
      numeric[i] = (up - down) / (2 * eps);
    }
    EXPECT_TRUE(all_close(*grads[which], numeric, 1e-8, 1e-6)) << "input " << which;
  }
}

TEST(Attention, LowPrecisionInputsComputeInF32AndRoundOnce) {
  const Dims n{2, 2, 9, 11, 16};
  for (DType dtype : {DType::bf16, DType::f16}) {
    const auto in = make_inputs(n, dtype, 400);
    const Tensor dout = random_tensor({n.b, n.h, n.s, n.d}, dtype, 403);
    const double scale = 0.25;
    const auto fwd = kernels::attention_forward(in.q, in.k, in.v, scale);
    EXPECT_EQ(fwd.out.dtype(), dtype);
    EXPECT_EQ(fwd.lse.dtype(), DType::f32);
    // The same computation on the widened values in f32, rounded once, is exactly the result.
    const auto f32 = kernels::attention_forward(in.q.to(DType::f32), in.k.to(DType::f32), in.v.to(DType::f32), scale);
    EXPECT_TRUE(all_close(fwd.out, f32.out.to(dtype), 0, 0));
    EXPECT_TRUE(all_close(fwd.lse, f32.lse, 0, 0));
    std::vector<double> lse;
    const auto q = in.q.to_vector<double>(), k = in.k.to_vector<double>(), v = in.v.to_vector<double>();
    const auto out = ref_forward(q, k, v, n, scale, &lse);
    const auto tol = testing::tolerance_for(dtype);
    EXPECT_TRUE(all_close(fwd.out, out, tol.atol, tol.rtol));
    EXPECT_TRUE(all_close(fwd.lse, lse, 1e-5, 1e-5));
    const auto g = kernels::attention_backward(dout, in.q, in.k, in.v, fwd.out, fwd.lse, scale);
    EXPECT_EQ(g.dq.dtype(), dtype);
    const auto ref = ref_backward(dout.to_vector<double>(), q, k, v, n, scale);
    // δ comes from the rounded out: dq and dk get delta_bounds on top of the format's tolerance.
    const DeltaBounds b = delta_bounds(dout.to_vector<double>(), fwd.out.to_vector<double>(), q, k, n, scale,
                                       dtype == DType::bf16 ? 0x1p-8 : 0x1p-11);
    EXPECT_EQ(outside(g.dq, ref.dq, b.dq, tol.atol, tol.rtol), 0) << dtype << " dq";
    EXPECT_EQ(outside(g.dk, ref.dk, b.dk, tol.atol, tol.rtol), 0) << dtype << " dk";
    EXPECT_TRUE(all_close(g.dv, ref.dv, tol.atol, tol.rtol)) << dtype << " dv";
  }
}

// bf16 attention widens each head's operands into f32 rows as it goes and rounds each head's results
// into place (kernels/cpu/attention_cpu.h): forward and backward give the bits of the f32 kernels on
// the tensors widened whole, rounded, in both layouts, for head dims that put the packed rows off a
// 64-byte boundary (20) or on it (64), on 1 thread and on 3.
TEST(Attention, Bf16HeadsWidenedOneAtATimeAreTheF32KernelsRounded) {
  const int saved = omp_get_max_threads();
  const auto bits = [](const Tensor& t) { return t.to_vector<double>(); };
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    for (const Dims& n : {Dims{2, 3, 50, 50, 64}, Dims{1, 2, 7, 11, 20}}) {
      const std::string where = "s=" + std::to_string(n.s) + " sk=" + std::to_string(n.sk) + " d=" +
                                std::to_string(n.d) + ", " + std::to_string(threads) + " threads";
      const double scale = 0.2;
      const auto f32 = [](const Tensor& t) { return t.to(DType::f32); };
      const auto bf16 = [](const Tensor& t) { return t.to(DType::bf16); };
      // [B, H, S, D]
      const auto in = make_inputs(n, DType::bf16, 410);
      const Tensor dout = random_tensor({n.b, n.h, n.s, n.d}, DType::bf16, 413);
      const auto fwd = kernels::attention_forward(in.q, in.k, in.v, scale);
      const auto ref = kernels::attention_forward(f32(in.q), f32(in.k), f32(in.v), scale);
      ASSERT_EQ(fwd.out.dtype(), DType::bf16);
      EXPECT_EQ(bits(fwd.out), bits(bf16(ref.out))) << where;
      EXPECT_EQ(bits(fwd.lse), bits(ref.lse)) << where;
      const auto g = kernels::attention_backward(dout, in.q, in.k, in.v, fwd.out, fwd.lse, scale);
      const auto gref =
          kernels::attention_backward(f32(dout), f32(in.q), f32(in.k), f32(in.v), f32(fwd.out), fwd.lse, scale);
      EXPECT_EQ(bits(g.dq), bits(bf16(gref.dq))) << where;
      EXPECT_EQ(bits(g.dk), bits(bf16(gref.dk))) << where;
      EXPECT_EQ(bits(g.dv), bits(bf16(gref.dv))) << where;
      // The packed qkv [B, S, 3, H, D] (self-attention: S keys)
      const Tensor qkv = random_tensor({n.b, n.s, 3, n.h, n.d}, DType::bf16, 420);
      const Tensor pdout = random_tensor({n.b, n.s, n.h, n.d}, DType::bf16, 421);
      const auto pf = kernels::packed_attention_forward(qkv, scale);
      const auto pref = kernels::packed_attention_forward(f32(qkv), scale);
      EXPECT_EQ(bits(pf.out), bits(bf16(pref.out))) << "packed, " << where;
      EXPECT_EQ(bits(pf.lse), bits(pref.lse)) << "packed, " << where;
      const Tensor dqkv = kernels::packed_attention_backward(pdout, qkv, pf.out, pf.lse, scale);
      const Tensor dref = kernels::packed_attention_backward(f32(pdout), f32(qkv), f32(pf.out), pf.lse, scale);
      ASSERT_EQ(dqkv.dtype(), DType::bf16);
      EXPECT_EQ(bits(dqkv), bits(bf16(dref))) << "packed, " << where;
    }
  }
  omp_set_num_threads(saved);
}

TEST(Attention, ZeroScaleAveragesTheValues) {
  // All scores equal: every query gets the mean of the values, and lse = log Sk.
  const Dims n{2, 3, 4, 6, 8};
  const auto in = make_inputs(n, DType::f32, 500);
  const auto res = kernels::attention_forward(in.q, in.k, in.v, 0.0);
  const auto v = in.v.to_vector<double>();
  std::vector<double> mean(n.heads() * n.s * n.d, 0.0);
  for (int64_t h = 0; h < n.heads(); ++h)
    for (int64_t i = 0; i < n.s; ++i)
      for (int64_t c = 0; c < n.d; ++c) {
        for (int64_t j = 0; j < n.sk; ++j) mean[(h * n.s + i) * n.d + c] += v[(h * n.sk + j) * n.d + c] / n.sk;
      }
  EXPECT_TRUE(all_close(res.out, mean, 1e-6, 1e-6));
  EXPECT_TRUE(all_close(res.lse, std::vector<double>(n.heads() * n.s, std::log(6.0)), 1e-6, 1e-6));
}

TEST(Attention, LargeLogitsStayFinite) {
  // Scores in the hundreds overflow exp in f32 unless the row max is subtracted first.
  const Dims n{1, 2, 6, 10, 8};
  const auto in = make_inputs(n, DType::f32, 600, 10.0);
  const auto res = kernels::attention_forward(in.q, in.k, in.v, 1.0);
  std::vector<double> lse;
  const auto out =
      ref_forward(in.q.to_vector<double>(), in.k.to_vector<double>(), in.v.to_vector<double>(), n, 1.0, &lse);
  EXPECT_GT(*std::max_element(lse.begin(), lse.end()), 100.0);
  EXPECT_TRUE(all_close(res.out, out, 1e-3, 1e-3));
  EXPECT_TRUE(all_close(res.lse, lse, 1e-4, 1e-5));
  const Tensor dout = random_tensor({n.b, n.h, n.s, n.d}, DType::f32, 603);
  const auto g = kernels::attention_backward(dout, in.q, in.k, in.v, res.out, res.lse, 1.0);
  for (const Tensor* t : {&g.dq, &g.dk, &g.dv}) {
    for (double x : t->to_vector<double>()) ASSERT_TRUE(std::isfinite(x));
  }
}

TEST(Attention, ManyHeadsSpanSeveralChunks) {
  // 12 heads of 300×300 scores exceed one chunk of score buffers; every head must still be right.
  const Dims n{3, 4, 300, 300, 16};
  const auto in = make_inputs(n, DType::f64, 700);
  const Tensor dout = random_tensor({n.b, n.h, n.s, n.d}, DType::f64, 703);
  const double scale = 0.25;
  const auto fwd = kernels::attention_forward(in.q, in.k, in.v, scale);
  const auto q = in.q.to_vector<double>(), k = in.k.to_vector<double>(), v = in.v.to_vector<double>();
  std::vector<double> lse;
  EXPECT_TRUE(all_close(fwd.out, ref_forward(q, k, v, n, scale, &lse), 1e-12, 1e-10));
  EXPECT_TRUE(all_close(fwd.lse, lse, 1e-12, 1e-10));
  const auto g = kernels::attention_backward(dout, in.q, in.k, in.v, fwd.out, fwd.lse, scale);
  const auto ref = ref_backward(dout.to_vector<double>(), q, k, v, n, scale);
  EXPECT_TRUE(all_close(g.dq, ref.dq, 1e-11, 1e-9));
  EXPECT_TRUE(all_close(g.dk, ref.dk, 1e-11, 1e-9));
  EXPECT_TRUE(all_close(g.dv, ref.dv, 1e-11, 1e-9));
}

TEST(Attention, ErrorsNameTheShapes) {
  const Tensor q = random_tensor({2, 3, 5, 8}), k = random_tensor({2, 3, 7, 8}), v = random_tensor({2, 3, 7, 8});
  const Tensor wide_k = random_tensor({2, 3, 7, 16}), short_v = random_tensor({2, 3, 6, 8});
  const Tensor heads4 = random_tensor({2, 4, 7, 8}), q3 = random_tensor({3, 5, 8}), k16 = k.to(DType::bf16);
  using kernels::attention_forward;
  EXPECT_TRUE(octet::testing::throws_with([&] { attention_forward(q, wide_k, v, 1); }, {"attention_forward", "[2, 3, 7, 16]"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { attention_forward(q, k, short_v, 1); }, {"[2, 3, 7, 8]", "[2, 3, 6, 8]"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { attention_forward(q, heads4, heads4, 1); }, {"[2, 3, 5, 8]", "[2, 4, 7, 8]"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { attention_forward(q3, k, v, 1); }, {"attention_forward", "[3, 5, 8]"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { attention_forward(q, k16, v, 1); }, {"attention_forward", "bf16"}));
  const auto fwd = attention_forward(q, k, v, 1.0);
  const Tensor bad_dout = random_tensor({2, 3, 5, 7}), bad_lse = random_tensor({2, 3, 7}),
               lse64 = fwd.lse.to(DType::f64);
  using kernels::attention_backward;
  EXPECT_TRUE(octet::testing::throws_with([&] { attention_backward(bad_dout, q, k, v, fwd.out, fwd.lse, 1); },
                                {"attention_backward", "[2, 3, 5, 7]", "[2, 3, 5, 8]"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { attention_backward(fwd.out, q, k, v, fwd.out, bad_lse, 1); },
                                {"attention_backward", "lse", "[2, 3, 7]", "[2, 3, 5]"}));
  EXPECT_TRUE(octet::testing::throws_with([&] { attention_backward(fwd.out, q, k, v, fwd.out, lse64, 1); }, {"lse", "f64"}));
}

// ---- the packed layout: q, k, v read in place from qkv [B, S, 3, H, D] ------------------------------

// Index of element (b, h, i, c) of a [B, H, S, D] head-major tensor, and of the same element in the
// packed qkv [B, S, 3, H, D] (part 0, 1, 2 = q, k, v) and the packed output [B, S, H, D].
int64_t bhsd(const Dims& n, int64_t b, int64_t h, int64_t i, int64_t c) { return ((b * n.h + h) * n.s + i) * n.d + c; }
int64_t packed(const Dims& n, int64_t b, int64_t i, int64_t part, int64_t h, int64_t c) {
  return (((b * n.s + i) * 3 + part) * n.h + h) * n.d + c;
}
int64_t packed_out(const Dims& n, int64_t b, int64_t i, int64_t h, int64_t c) {
  return ((b * n.s + i) * n.h + h) * n.d + c;
}

// Part `part` of a packed qkv gathered into the head-major order the reference works in.
std::vector<double> unpack(const std::vector<double>& qkv, const Dims& n, int64_t part) {
  std::vector<double> x(static_cast<size_t>(n.b * n.h * n.s * n.d));
  for (int64_t b = 0; b < n.b; ++b)
    for (int64_t h = 0; h < n.h; ++h)
      for (int64_t i = 0; i < n.s; ++i)
        for (int64_t c = 0; c < n.d; ++c) x[bhsd(n, b, h, i, c)] = qkv[packed(n, b, i, part, h, c)];
  return x;
}

// Odd sequence lengths and head counts, and S that is not a multiple of 8 or 16 (50 is
// vit_fashion_mnist's, 197 ViT-B/16's at 224²).
const std::vector<Dims> kPackedShapes = {{1, 1, 1, 1, 8},    {2, 3, 7, 7, 8},    {1, 5, 13, 13, 16},
                                         {2, 3, 50, 50, 64}, {1, 2, 17, 17, 80}, {1, 4, 197, 197, 32}};

class PackedAttentionTest : public ::testing::TestWithParam<std::tuple<Dims, DType>> {};

TEST_P(PackedAttentionTest, ForwardMatchesFloat64Reference) {
  const auto [n, dtype] = GetParam();
  const Tensor qkv = random_tensor({n.b, n.s, 3, n.h, n.d}, dtype, 500);
  const double scale = 1.0 / std::sqrt(static_cast<double>(n.d));
  const auto res = kernels::packed_attention_forward(qkv, scale);
  ASSERT_EQ(res.out.shape(), (Shape{n.b, n.s, n.h, n.d}));
  ASSERT_EQ(res.out.dtype(), dtype);
  ASSERT_EQ(res.lse.shape(), (Shape{n.b, n.h, n.s}));
  const auto all = qkv.to_vector<double>();
  std::vector<double> lse;
  const auto ref = ref_forward(unpack(all, n, 0), unpack(all, n, 1), unpack(all, n, 2), n, scale, &lse);
  std::vector<double> expected(ref.size());  // [B, H, S, D] -> [B, S, H, D]
  for (int64_t b = 0; b < n.b; ++b)
    for (int64_t h = 0; h < n.h; ++h)
      for (int64_t i = 0; i < n.s; ++i)
        for (int64_t c = 0; c < n.d; ++c) expected[packed_out(n, b, i, h, c)] = ref[bhsd(n, b, h, i, c)];
  const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
  EXPECT_TRUE(all_close(res.out, expected, tol, tol));
  EXPECT_TRUE(all_close(res.lse, lse, tol, tol));
}

TEST_P(PackedAttentionTest, BackwardWritesDqDkDvIntoOnePackedGradient) {
  const auto [n, dtype] = GetParam();
  const Tensor qkv = random_tensor({n.b, n.s, 3, n.h, n.d}, dtype, 600);
  const Tensor dout = random_tensor({n.b, n.s, n.h, n.d}, dtype, 601);
  const double scale = 0.5 / std::sqrt(static_cast<double>(n.d)) + 0.1;
  const auto fwd = kernels::packed_attention_forward(qkv, scale);
  const Tensor dqkv = kernels::packed_attention_backward(dout, qkv, fwd.out, fwd.lse, scale);
  ASSERT_EQ(dqkv.shape(), qkv.shape());
  ASSERT_EQ(dqkv.dtype(), dtype);
  const auto all = qkv.to_vector<double>(), dout_packed = dout.to_vector<double>();
  std::vector<double> dout_heads(dout_packed.size());
  for (int64_t b = 0; b < n.b; ++b)
    for (int64_t h = 0; h < n.h; ++h)
      for (int64_t i = 0; i < n.s; ++i)
        for (int64_t c = 0; c < n.d; ++c) dout_heads[bhsd(n, b, h, i, c)] = dout_packed[packed_out(n, b, i, h, c)];
  const auto ref = ref_backward(dout_heads, unpack(all, n, 0), unpack(all, n, 1), unpack(all, n, 2), n, scale);
  std::vector<double> expected(all.size());
  const std::vector<double>* parts[3] = {&ref.dq, &ref.dk, &ref.dv};
  for (int64_t part = 0; part < 3; ++part)
    for (int64_t b = 0; b < n.b; ++b)
      for (int64_t h = 0; h < n.h; ++h)
        for (int64_t i = 0; i < n.s; ++i)
          for (int64_t c = 0; c < n.d; ++c) expected[packed(n, b, i, part, h, c)] = (*parts[part])[bhsd(n, b, h, i, c)];
  const double tol = dtype == DType::f64 ? 1e-11 : 2e-5;
  EXPECT_TRUE(all_close(dqkv, expected, tol, tol));
}

INSTANTIATE_TEST_SUITE_P(Shapes, PackedAttentionTest,
                         ::testing::Combine(::testing::ValuesIn(kPackedShapes),
                                            ::testing::Values(DType::f32, DType::f64)));

// The packed kernels run the same arithmetic as the [B, H, S, D] ones, only through strides: in f32
// (bf16 storage) both layouts give the same bits.
TEST(PackedAttention, EqualsTheHeadMajorKernelsBitForBit) {
  const Dims n{2, 3, 50, 50, 64};
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Tensor qkv = random_tensor({n.b, n.s, 3, n.h, n.d}, dtype, 700);
    const Tensor dout = random_tensor({n.b, n.s, n.h, n.d}, dtype, 701);
    const double scale = 0.125;
    // The head-major copies: [B, S, 3, H, D] -> [3, B, H, S, D], made with plain loops.
    Tensor heads[3], dout_heads = empty({n.b, n.h, n.s, n.d}, dtype);
    const auto all = qkv.to_vector<double>(), dv = dout.to_vector<double>();
    for (int64_t part = 0; part < 3; ++part) {
      heads[part] = from_vector(unpack(all, n, part), {n.b, n.h, n.s, n.d}, dtype);
    }
    std::vector<double> dh(dv.size());
    for (int64_t b = 0; b < n.b; ++b)
      for (int64_t h = 0; h < n.h; ++h)
        for (int64_t i = 0; i < n.s; ++i)
          for (int64_t c = 0; c < n.d; ++c) dh[bhsd(n, b, h, i, c)] = dv[packed_out(n, b, i, h, c)];
    dout_heads = from_vector(dh, {n.b, n.h, n.s, n.d}, dtype);
    const auto packed_fwd = kernels::packed_attention_forward(qkv, scale);
    const auto ref_fwd = kernels::attention_forward(heads[0], heads[1], heads[2], scale);
    EXPECT_EQ(packed_fwd.lse.to_vector<double>(), ref_fwd.lse.to_vector<double>()) << dtype_name(dtype);
    const Tensor dqkv = kernels::packed_attention_backward(dout, qkv, packed_fwd.out, packed_fwd.lse, scale);
    const auto ref_grads = kernels::attention_backward(dout_heads, heads[0], heads[1], heads[2], ref_fwd.out,
                                                       ref_fwd.lse, scale);
    const auto out_v = packed_fwd.out.to_vector<double>(), ref_out = ref_fwd.out.to_vector<double>();
    const auto grad_v = dqkv.to_vector<double>();
    const auto dq = ref_grads.dq.to_vector<double>(), dk = ref_grads.dk.to_vector<double>(),
               dvv = ref_grads.dv.to_vector<double>();
    int64_t out_mismatch = 0, grad_mismatch = 0;
    for (int64_t b = 0; b < n.b; ++b)
      for (int64_t h = 0; h < n.h; ++h)
        for (int64_t i = 0; i < n.s; ++i)
          for (int64_t c = 0; c < n.d; ++c) {
            out_mismatch += out_v[packed_out(n, b, i, h, c)] != ref_out[bhsd(n, b, h, i, c)];
            grad_mismatch += grad_v[packed(n, b, i, 0, h, c)] != dq[bhsd(n, b, h, i, c)];
            grad_mismatch += grad_v[packed(n, b, i, 1, h, c)] != dk[bhsd(n, b, h, i, c)];
            grad_mismatch += grad_v[packed(n, b, i, 2, h, c)] != dvv[bhsd(n, b, h, i, c)];
          }
    EXPECT_EQ(out_mismatch, 0) << dtype_name(dtype);
    EXPECT_EQ(grad_mismatch, 0) << dtype_name(dtype);
  }
}

TEST(PackedAttention, ErrorsNameTheShapes) {
  const Tensor qkv = random_tensor({2, 5, 3, 2, 8});
  const Tensor four_d = random_tensor({2, 5, 6, 8}), two_parts = random_tensor({2, 5, 2, 2, 8});
  using kernels::packed_attention_backward;
  using kernels::packed_attention_forward;
  EXPECT_TRUE(testing::throws_with([&] { packed_attention_forward(four_d, 1); },
                                   {"packed_attention_forward", "[B, S, 3, H, D]", "[2, 5, 6, 8]"}));
  EXPECT_TRUE(testing::throws_with([&] { packed_attention_forward(two_parts, 1); }, {"[2, 5, 2, 2, 8]"}));
  const auto fwd = packed_attention_forward(qkv, 1.0);
  const Tensor bad_dout = random_tensor({2, 5, 2, 7}), bad_lse = random_tensor({2, 5, 2});
  EXPECT_TRUE(testing::throws_with([&] { packed_attention_backward(bad_dout, qkv, fwd.out, fwd.lse, 1); },
                                   {"packed_attention_backward", "[2, 5, 2, 8]", "[2, 5, 2, 7]"}));
  EXPECT_TRUE(testing::throws_with([&] { packed_attention_backward(fwd.out, qkv, fwd.out, bad_lse, 1); },
                                   {"packed_attention_backward", "lse", "[2, 5, 2]", "[2, 2, 5]"}));
}

}  // namespace
}  // namespace octet
