// The fused AdamW and SGD updates and the blocked sum of squares, against float64 references written
// here from the textbook formulas (bias-corrected m̂ and v̂ for Adam; the weight decay as p - lr·wd·p),
// on random inputs already rounded to the tested dtypes, one parameter per call. Then lists of
// parameters against the same entries one call each (bf16 and f16 params with f32 masters against f32
// steps on the masters), and the argument errors.
#include "kernels/optimizers.h"

#include <omp.h>

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "tests/testing.h"

namespace {

using namespace octet;
using octet::testing::all_close;
using octet::testing::random_tensor;
using octet::testing::throws_with;
using octet::testing::uniform_tensor;
using Vec = std::vector<double>;

Vec vals(const Tensor& t) { return t.to_vector<double>(); }

// Large enough that the CPU kernels take their OpenMP path.
constexpr int64_t kLarge = 100003;

struct AdamWCase {
  DType param_dtype, grad_dtype;
  int64_t n;
  int64_t step;
  double weight_decay;
};

void PrintTo(const AdamWCase& c, std::ostream* os) {
  *os << "param " << dtype_name(c.param_dtype) << ", grad " << dtype_name(c.grad_dtype) << ", n " << c.n
      << ", step " << c.step << ", weight_decay " << c.weight_decay;
}

struct AdamRef {
  Vec p, m, v;
};

AdamRef ref_adamw(Vec p, const Vec& g, Vec m, Vec v, double lr, double b1, double b2, double eps, double wd,
                  int64_t step) {
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] -= lr * wd * p[i];
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    const double m_hat = m[i] / (1 - std::pow(b1, step));
    const double v_hat = v[i] / (1 - std::pow(b2, step));
    p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
  }
  return {p, m, v};
}

class AdamWKernel : public ::testing::TestWithParam<AdamWCase> {};

TEST_P(AdamWKernel, MatchesFloat64Reference) {
  const AdamWCase c = GetParam();
  const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8;
  const Tensor p = random_tensor({c.n}, c.param_dtype, 1);
  const Tensor g = random_tensor({c.n}, c.grad_dtype, 2, 0.1);
  // Mid-training moments: m of either sign, v positive and of the order of g².
  const Tensor m = random_tensor({c.n}, c.param_dtype, 3, 0.05);
  const Tensor v = uniform_tensor({c.n}, 1e-4, 2e-2, c.param_dtype, 4);
  const AdamRef want = ref_adamw(vals(p), vals(g), vals(m), vals(v), lr, b1, b2, eps, c.weight_decay, c.step);

  kernels::adamw_step_multi_({{p, g, m, v, Tensor()}}, lr, b1, b2, eps, c.weight_decay, c.step);
  // f32 arithmetic on O(1) values: a few ulps of the result.
  const double tol = c.param_dtype == DType::f64 ? 1e-13 : 2e-6;
  EXPECT_TRUE(all_close(p, want.p, tol, tol));
  EXPECT_TRUE(all_close(m, want.m, tol * 0.1, tol));
  EXPECT_TRUE(all_close(v, want.v, tol * 0.01, tol));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AdamWKernel,
                         ::testing::Values(AdamWCase{DType::f32, DType::f32, 37, 1, 0.05},
                                           AdamWCase{DType::f32, DType::f32, kLarge, 9, 0.05},
                                           AdamWCase{DType::f32, DType::bf16, kLarge, 3, 0.1},
                                           AdamWCase{DType::f64, DType::f64, 37, 1, 0.0},
                                           AdamWCase{DType::f64, DType::f64, kLarge, 1000, 0.05}));

// The first step from zero moments moves every element by about lr (m̂/sqrt(v̂) = sign(g)).
TEST(AdamWKernelSteps, FirstStepMovesByLrTimesSign) {
  const int64_t n = 50;
  const Tensor p = random_tensor({n}, DType::f64, 5);
  const Tensor g = random_tensor({n}, DType::f64, 6);
  const Tensor m = zeros({n}, DType::f64), v = zeros({n}, DType::f64);
  const Vec p0 = vals(p), gv = vals(g);
  kernels::adamw_step_multi_({{p, g, m, v, Tensor()}}, 0.01, 0.9, 0.999, 0.0, 0.0, 1);
  Vec want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = p0[i] - 0.01 * (gv[i] > 0 ? 1 : -1);
  EXPECT_TRUE(all_close(p, want, 1e-15, 1e-13));
}

struct SgdCase {
  DType param_dtype, grad_dtype;
  int64_t n;
  double momentum, dampening;
  bool nesterov;
  double weight_decay;
  bool first_step;
};

void PrintTo(const SgdCase& c, std::ostream* os) {
  *os << "param " << dtype_name(c.param_dtype) << ", grad " << dtype_name(c.grad_dtype) << ", n " << c.n
      << ", momentum " << c.momentum << ", dampening " << c.dampening << (c.nesterov ? ", nesterov" : "")
      << ", weight_decay " << c.weight_decay << (c.first_step ? ", first step" : "");
}

void ref_sgd(Vec& p, const Vec& g, Vec& buf, const SgdCase& c, double lr) {
  for (size_t i = 0; i < p.size(); ++i) {
    const double d = g[i] + c.weight_decay * p[i];
    double step = d;
    if (c.momentum != 0) {
      buf[i] = c.first_step ? d : c.momentum * buf[i] + (1 - c.dampening) * d;
      step = c.nesterov ? d + c.momentum * buf[i] : buf[i];
    }
    p[i] = p[i] - lr * step;
  }
}

class SgdKernel : public ::testing::TestWithParam<SgdCase> {};

TEST_P(SgdKernel, MatchesFloat64Reference) {
  const SgdCase c = GetParam();
  const double lr = 0.05;
  const Tensor p = random_tensor({c.n}, c.param_dtype, 11);
  const Tensor g = random_tensor({c.n}, c.grad_dtype, 12);
  const Tensor buf = c.momentum != 0 ? random_tensor({c.n}, c.param_dtype, 13) : Tensor();
  Vec want_p = vals(p), want_buf = buf.defined() ? vals(buf) : Vec(c.n);
  ref_sgd(want_p, vals(g), want_buf, c, lr);

  kernels::sgd_step_multi_({{p, g, buf, Tensor()}}, lr, c.momentum, c.dampening, c.nesterov, c.weight_decay,
                           c.first_step);
  const double tol = c.param_dtype == DType::f64 ? 1e-14 : 1e-6;
  EXPECT_TRUE(all_close(p, want_p, tol, tol));
  if (buf.defined()) {
    EXPECT_TRUE(all_close(buf, want_buf, tol, tol));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, SgdKernel,
    ::testing::Values(SgdCase{DType::f32, DType::f32, 41, 0.0, 0.0, false, 0.0, false},
                      SgdCase{DType::f32, DType::f32, kLarge, 0.0, 0.0, false, 1e-2, true},
                      SgdCase{DType::f32, DType::f32, kLarge, 0.9, 0.1, false, 1e-2, false},
                      SgdCase{DType::f32, DType::bf16, kLarge, 0.9, 0.0, true, 1e-2, false},
                      SgdCase{DType::f32, DType::f32, 41, 0.9, 0.5, false, 0.0, true},
                      SgdCase{DType::f64, DType::f64, 41, 0.8, 0.0, true, 5e-3, true},
                      SgdCase{DType::f64, DType::f64, kLarge, 0.8, 0.3, false, 5e-3, false}));

TEST(SgdKernelSteps, MomentumZeroIgnoresAGivenBuffer) {
  const Tensor p = random_tensor({9}, DType::f64, 20), g = random_tensor({9}, DType::f64, 21);
  const Tensor buf = random_tensor({9}, DType::f64, 22);
  const Vec buf0 = vals(buf), p0 = vals(p), gv = vals(g);
  kernels::sgd_step_multi_({{p, g, buf, Tensor()}}, 0.1, 0.0, 0.0, false, 0.0, false);
  Vec want(9);
  for (int i = 0; i < 9; ++i) want[i] = p0[i] - 0.1 * gv[i];
  EXPECT_TRUE(all_close(p, want, 1e-15, 1e-15));
  EXPECT_EQ(vals(buf), buf0);
}

// ---- sum of squares -------------------------------------------------------------------------------------

TEST(SumOfSquares, MatchesLongDoubleReferenceForEveryFloatingDtype) {
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{3 * kLarge}}) {
      const Tensor t = random_tensor({n}, d, 30 + n);
      long double want = 0;
      for (double x : vals(t)) want += static_cast<long double>(x) * x;
      const double got = kernels::sum_of_squares(t);
      EXPECT_NEAR(got, static_cast<double>(want), 1e-12 * static_cast<double>(want))
          << dtype_name(d) << " n=" << n;
    }
  }
}

TEST(SumOfSquares, SameBitsForAnyThreadCount) {
  const Tensor t = random_tensor({5 * kLarge}, DType::f32, 40);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = kernels::sum_of_squares(t);
  omp_set_num_threads(3);
  const double three = kernels::sum_of_squares(t);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, three);
}

TEST(SumOfSquares, InfAndNanPropagate) {
  const Tensor t = random_tensor({100}, DType::f32, 41);
  t.data<float>()[17] = INFINITY;
  EXPECT_TRUE(std::isinf(kernels::sum_of_squares(t)));
  t.data<float>()[3] = NAN;
  EXPECT_TRUE(std::isnan(kernels::sum_of_squares(t)));
}

// A "cuda:0" tensor faked over host memory, so the device checks run without a GPU; the checks
// fail before any byte is touched.
Tensor fake_cuda_tensor(const Shape& shape) {
  const Tensor host = random_tensor(shape);
  auto storage = std::make_shared<Storage>(host.data_ptr(), host.nbytes(), Device::cuda(0), [host](void*) {});
  return Tensor(storage, 0, shape, DType::f32);
}

// ---- multi-tensor forms -------------------------------------------------------------------------------------

// Sizes below and above the OpenMP threshold, and one element.
const std::vector<int64_t> kMultiSizes = {37, kLarge, 1, 4099};

std::vector<float> floats(const Tensor& t) { return t.to_vector<float>(); }

TEST(MultiTensorSteps, AdamWEqualsOneEntryAtATime) {
  const double lr = 2e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.05;
  std::vector<kernels::AdamWTensors> multi, single;
  for (size_t i = 0; i < kMultiSizes.size(); ++i) {
    const int64_t n = kMultiSizes[i];
    const uint64_t seed = 100 + 10 * i;
    // The last entry takes a bf16 gradient for its f32 param, as the step allows.
    const DType grad_dtype = i + 1 == kMultiSizes.size() ? DType::bf16 : DType::f32;
    const Tensor p = random_tensor({n}, DType::f32, seed), g = random_tensor({n}, grad_dtype, seed + 1, 0.1);
    const Tensor m = random_tensor({n}, DType::f32, seed + 2, 0.05);
    const Tensor v = uniform_tensor({n}, 1e-4, 2e-2, DType::f32, seed + 3);
    multi.push_back({p, g, m, v, Tensor()});
    single.push_back({p.clone(), g.clone(), m.clone(), v.clone(), Tensor()});
  }
  for (int64_t step = 1; step <= 3; ++step) {
    kernels::adamw_step_multi_(multi, lr, b1, b2, eps, wd, step);
    for (const auto& t : single) kernels::adamw_step_multi_({t}, lr, b1, b2, eps, wd, step);
  }
  for (size_t i = 0; i < multi.size(); ++i) {
    EXPECT_EQ(floats(multi[i].param), floats(single[i].param)) << "entry " << i;
    EXPECT_EQ(floats(multi[i].exp_avg), floats(single[i].exp_avg)) << "entry " << i;
    EXPECT_EQ(floats(multi[i].exp_avg_sq), floats(single[i].exp_avg_sq)) << "entry " << i;
  }
}

// bf16 training: the update runs on the f32 master exactly as an f32 step would, and the bf16 param
// is the master rounded, after every step. f16 params work the same way.
TEST(MultiTensorSteps, AdamWOnAMasterEqualsTheF32StepAndRoundsTheParam) {
  const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  for (DType low : {DType::bf16, DType::f16}) {
    std::vector<kernels::AdamWTensors> mixed, reference;
    for (size_t i = 0; i < kMultiSizes.size(); ++i) {
      const int64_t n = kMultiSizes[i];
      const Tensor master = random_tensor({n}, DType::f32, 200 + i);
      const Tensor m = zeros({n}), v = zeros({n});
      mixed.push_back({master.to(low), Tensor(), m, v, master});
      reference.push_back({master.clone(), Tensor(), m.clone(), v.clone(), Tensor()});
    }
    for (int64_t step = 1; step <= 3; ++step) {
      for (size_t i = 0; i < mixed.size(); ++i) {
        // The gradient a bf16 model produces: low precision; the reference widens the same values.
        const Tensor g = random_tensor({kMultiSizes[i]}, low, 300 + 10 * step + i, 0.1);
        mixed[i].grad = g;
        reference[i].grad = g.to(DType::f32);
      }
      kernels::adamw_step_multi_(mixed, lr, b1, b2, eps, wd, step);
      kernels::adamw_step_multi_(reference, lr, b1, b2, eps, wd, step);
      for (size_t i = 0; i < mixed.size(); ++i) {
        EXPECT_EQ(floats(mixed[i].master), floats(reference[i].param)) << dtype_name(low) << " entry " << i;
        EXPECT_EQ(floats(mixed[i].exp_avg_sq), floats(reference[i].exp_avg_sq)) << dtype_name(low) << " entry " << i;
        EXPECT_EQ(floats(mixed[i].param), floats(mixed[i].master.to(low))) << dtype_name(low) << " entry " << i;
      }
    }
  }
}

TEST(MultiTensorSteps, SgdEqualsOneEntryAtATimeAndHandlesMasters) {
  const double lr = 0.05, momentum = 0.9, wd = 1e-2;
  for (bool nesterov : {false, true}) {
    std::vector<kernels::SgdTensors> f32_multi, f32_single, bf16_multi;
    for (size_t i = 0; i < kMultiSizes.size(); ++i) {
      const int64_t n = kMultiSizes[i];
      const Tensor p = random_tensor({n}, DType::f32, 400 + i);
      f32_multi.push_back({p, Tensor(), zeros({n}), Tensor()});
      f32_single.push_back({p.clone(), Tensor(), zeros({n}), Tensor()});
      bf16_multi.push_back({p.to(DType::bf16), Tensor(), zeros({n}), p.clone()});
    }
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < kMultiSizes.size(); ++i) {
        const Tensor g = random_tensor({kMultiSizes[i]}, DType::bf16, 500 + 10 * step + i);
        f32_multi[i].grad = g.to(DType::f32);
        f32_single[i].grad = g.to(DType::f32);
        bf16_multi[i].grad = g;
      }
      kernels::sgd_step_multi_(f32_multi, lr, momentum, 0.0, nesterov, wd, step == 0);
      kernels::sgd_step_multi_(bf16_multi, lr, momentum, 0.0, nesterov, wd, step == 0);
      for (const auto& t : f32_single) kernels::sgd_step_multi_({t}, lr, momentum, 0.0, nesterov, wd, step == 0);
    }
    for (size_t i = 0; i < kMultiSizes.size(); ++i) {
      EXPECT_EQ(floats(f32_multi[i].param), floats(f32_single[i].param)) << "entry " << i;
      EXPECT_EQ(floats(f32_multi[i].momentum_buffer), floats(f32_single[i].momentum_buffer)) << "entry " << i;
      EXPECT_EQ(floats(bf16_multi[i].master), floats(f32_single[i].param)) << "entry " << i;
      EXPECT_EQ(floats(bf16_multi[i].param), floats(bf16_multi[i].master.to(DType::bf16))) << "entry " << i;
    }
  }
}

TEST(MultiTensorSteps, SgdWithoutMomentumTakesNoBuffer) {
  const Tensor master = random_tensor({33}, DType::f32, 600), g = random_tensor({33}, DType::bf16, 601);
  const Tensor param = master.to(DType::bf16);
  const Vec m0 = vals(master), gv = vals(g);
  kernels::sgd_step_multi_({{param, g, Tensor(), master}}, 0.1, 0.0, 0.0, false, 0.0, true);
  Vec want(33);
  for (int i = 0; i < 33; ++i)
    want[i] = static_cast<float>(m0[i] - static_cast<float>(0.1f * static_cast<float>(gv[i])));
  EXPECT_TRUE(all_close(master, want, 0, 0));
  EXPECT_EQ(floats(param), floats(master.to(DType::bf16)));
}

TEST(MultiTensorSteps, SumOfSquaresIsTheSumOverTensorsInOrder) {
  std::vector<Tensor> tensors;
  double want = 0;
  for (DType d : {DType::f32, DType::bf16, DType::f64, DType::f16}) {
    for (int64_t n : {int64_t{1}, int64_t{1000}, 3 * kLarge}) {
      tensors.push_back(random_tensor({n}, d, 700 + n));
      want += kernels::sum_of_squares(tensors.back());
    }
  }
  EXPECT_EQ(kernels::sum_of_squares_multi(tensors), want);
  EXPECT_EQ(kernels::sum_of_squares_multi({}), 0.0);
}

// The f32 master copies of a first bf16 step: widen_to_f32_multi_ gives Tensor::to(f32)'s bits for
// every source, bf16 and f16 in one call, of odd sizes, views at odd offsets, and the values a
// widening must keep exactly (infinities, NaN, subnormals, -0, the largest finite).
TEST(MultiTensorSteps, WidenToF32IsToF32BitForBit) {
  const Tensor specials = from_vector<float>(
      {INFINITY, -INFINITY, NAN, 1e-40f, -3e-39f, -0.0f, 3.3e38f, 65504.f, 6e-8f, 1.0f / 3}, {10});
  std::vector<Tensor> sources, destinations;
  uint64_t seed = 900;
  for (DType dtype : {DType::bf16, DType::f16}) {
    sources.push_back(specials.to(dtype));
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{37}, int64_t{4099}, kLarge}) {
      sources.push_back(random_tensor({n}, dtype, ++seed));
      sources.push_back(random_tensor({n + 3}, dtype, ++seed).narrow(3, n));  // a view at an odd offset
    }
  }
  sources.push_back(random_tensor({5, 3, 2}, DType::bf16, ++seed));
  for (const Tensor& s : sources) destinations.push_back(full(s.shape(), 7.0, DType::f32));
  kernels::widen_to_f32_multi_(sources, destinations);
  for (size_t i = 0; i < sources.size(); ++i) {
    EXPECT_TRUE(octet::testing::same_bits(destinations[i], sources[i].to(DType::f32))) << "entry " << i;
  }
  EXPECT_NO_THROW(kernels::widen_to_f32_multi_({}, {}));
}

TEST(MultiTensorStepErrors, WidenToF32NamesTheEntryAndTheFix) {
  const Tensor b = random_tensor({6}, DType::bf16), d = zeros({6});
  EXPECT_TRUE(throws_with([&] { kernels::widen_to_f32_multi_({b, b.clone()}, {d}); },
                          {"widen_to_f32_multi_", "2 sources and 1 destinations"}));
  EXPECT_TRUE(throws_with([&] { kernels::widen_to_f32_multi_({b, random_tensor({6})}, {d, zeros({6})}); },
                          {"widen_to_f32_multi_ on tensors[1]", "f32[6]", "bf16 or f16"}));
  EXPECT_TRUE(throws_with([&] { kernels::widen_to_f32_multi_({b}, {zeros({6}, DType::f64)}); },
                          {"widen_to_f32_multi_ on tensors[0]", "f64[6]", "must be f32"}));
  EXPECT_TRUE(throws_with([&] { kernels::widen_to_f32_multi_({b}, {zeros({2, 3})}); },
                          {"widen_to_f32_multi_ on tensors[0]", "f32[2, 3]", "shape"}));
  EXPECT_TRUE(throws_with([&] { kernels::widen_to_f32_multi_({b, b.clone()}, {d, d}); },
                          {"widen_to_f32_multi_", "tensors[0].destination and tensors[1].destination share memory"}));
  EXPECT_TRUE(throws_with([&] { kernels::widen_to_f32_multi_({b}, {fake_cuda_tensor({6})}); },
                          {"widen_to_f32_multi_ on tensors[0]", "cuda:0"}));
}

TEST(MultiTensorSteps, EmptyListsAreNoOps) {
  EXPECT_NO_THROW(kernels::adamw_step_multi_({}, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1));
  EXPECT_NO_THROW(kernels::sgd_step_multi_({}, 0.1, 0.9, 0.0, false, 0.0, true));
}

TEST(MultiTensorStepErrors, EntriesAreNamedWithTheFix) {
  const Tensor p = random_tensor({6}), g = random_tensor({6}, DType::f32, 2), m = zeros({6}), v = zeros({6});
  auto adamw_multi = [](const std::vector<kernels::AdamWTensors>& t) {
    kernels::adamw_step_multi_(t, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1);
  };
  EXPECT_TRUE(throws_with([&] { adamw_multi({{p, g, m, v, p.clone()}}); },
                          {"adamw_step_multi_ on tensors[0]", "master", "bf16 or f16", "leave master undefined"}));
  const Tensor pb = p.to(DType::bf16);
  EXPECT_TRUE(throws_with([&] { adamw_multi({{p, g, m, v, Tensor()}, {pb, g, m.clone(), v.clone(), p.clone()}}); },
                          {"tensors[1]", "grad f32[6]", "bf16[6]", "param's dtype"}));
  EXPECT_TRUE(throws_with([&] { adamw_multi({{pb, pb.clone(), m, v, Tensor()}}); },
                          {"tensors[0]", "bf16[6]", "master"}));
  EXPECT_TRUE(throws_with([&] { adamw_multi({{pb, pb.clone(), m, v, p.to(DType::f64)}}); },
                          {"tensors[0]", "master", "f64[6]", "must be f32"}));
  EXPECT_TRUE(throws_with([&] { adamw_multi({{pb, pb.clone(), m.to(DType::bf16), v, p.clone()}}); },
                          {"tensors[0]", "state", "allocate the state with dtype f32"}));
  // The same state tensor handed to two entries.
  EXPECT_TRUE(throws_with(
      [&] {
        adamw_multi({{p, g, m, v, Tensor()}, {p.clone(), g.clone(), m, zeros({6}), Tensor()}});
      },
      {"adamw_step_multi_", "tensors[0].exp_avg and tensors[1].exp_avg share memory"}));
  EXPECT_TRUE(throws_with(
      [&] {
        adamw_multi(
            {{p, g, m, v, Tensor()},
             {fake_cuda_tensor({6}), fake_cuda_tensor({6}), fake_cuda_tensor({6}), fake_cuda_tensor({6}), Tensor()}});
      },
      {"adamw_step_multi_", "tensors[1] is on cuda:0", "once per device"}));
  EXPECT_TRUE(throws_with(
      [&] {
        kernels::sgd_step_multi_({{p, g, Tensor(), Tensor()}}, 0.1, 0.9, 0, false, 0, true);
      },
      {"sgd_step_multi_ on tensors[0]", "tensors[0].momentum_buffer is undefined"}));
  EXPECT_TRUE(throws_with([&] { kernels::sum_of_squares_multi({p, arange(3)}); },
                          {"sum_of_squares_multi", "floating", "i64[3]"}));
}

// ---- errors -----------------------------------------------------------------------------------------------

// One f32 parameter, a list of one.
void adamw(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, double lr = 1e-3,
           double b1 = 0.9, double b2 = 0.999, double eps = 1e-8, double wd = 0.0, int64_t step = 1) {
  kernels::adamw_step_multi_({{p, g, m, v, Tensor()}}, lr, b1, b2, eps, wd, step);
}
void sgd(const Tensor& p, const Tensor& g, const Tensor& buf, double lr, double momentum, double dampening,
         bool nesterov, double wd, bool first_step) {
  kernels::sgd_step_multi_({{p, g, buf, Tensor()}}, lr, momentum, dampening, nesterov, wd, first_step);
}

TEST(OptimizerKernelErrors, ShapesDtypesAndDevicesAreNamedWithTheFix) {
  const Tensor p = random_tensor({4, 3}), g = random_tensor({4, 3}, DType::f32, 2);
  const Tensor m = zeros({4, 3}), v = zeros({4, 3});
  EXPECT_TRUE(throws_with([&] { adamw(p, random_tensor({12}), m, v); },
                          {"adamw_step_", "f32[12]", "f32[4, 3]", "param's shape"}));
  EXPECT_TRUE(throws_with([&] { adamw(p, g, zeros({3, 4}), v); }, {"adamw_step_", "f32[3, 4]", "state"}));
  EXPECT_TRUE(throws_with([&] { adamw(p, g, m, zeros({4, 3}, DType::f64)); },
                          {"adamw_step_", "f64[4, 3]", "dtype"}));
  EXPECT_TRUE(throws_with([&] { adamw(p.to(DType::bf16), g.to(DType::bf16), m, v); },
                          {"adamw_step_", "bf16[4, 3]", "master weights", "f32"}));
  EXPECT_TRUE(throws_with([&] { adamw(p, g.to(DType::f16), m, v); },
                          {"adamw_step_", "f16[4, 3]", ".to(f32)"}));
  const Tensor p64 = p.to(DType::f64), m64 = m.to(DType::f64), v64 = v.to(DType::f64);
  EXPECT_TRUE(throws_with([&] { adamw(p64, g.to(DType::bf16), m64, v64); }, {"adamw_step_", "bf16", "f64"}));
  EXPECT_TRUE(throws_with([&] { adamw(p, g, m, Tensor()); }, {"adamw_step_", "undefined"}));
  EXPECT_TRUE(throws_with([&] { adamw(p, fake_cuda_tensor({4, 3}), m, v); },
                          {"adamw_step_", "cuda:0", "cpu", ".to(device)"}));
#if !OCTET_HAS_CUDA
  // A CPU-only build refuses device tensors by name (a CUDA build runs them on the GPU).
  const Tensor pc = fake_cuda_tensor({4, 3}), gc = fake_cuda_tensor({4, 3});
  const Tensor mc = fake_cuda_tensor({4, 3}), vc = fake_cuda_tensor({4, 3});
  EXPECT_TRUE(throws_with([&] { adamw(pc, gc, mc, vc); }, {"adamw_step_", "built without CUDA", "cuda:0"}));
  EXPECT_TRUE(throws_with([&] { sgd(pc, gc, Tensor(), 0.1, 0, 0, false, 0, true); },
                          {"sgd_step_", "built without CUDA"}));
  EXPECT_TRUE(throws_with([&] { kernels::sum_of_squares(gc); }, {"sum_of_squares", "built without CUDA"}));
#endif
  EXPECT_TRUE(throws_with([&] { kernels::sum_of_squares(arange(5)); },
                          {"sum_of_squares", "floating", "i64[5]"}));
}

TEST(OptimizerKernelErrors, AliasedTensorsAreRefused) {
  const Tensor p = random_tensor({8}), m = zeros({8}), v = zeros({8});
  EXPECT_TRUE(throws_with([&] { adamw(p, p, m, v); }, {"adamw_step_", "param and grad share memory"}));
  EXPECT_TRUE(throws_with([&] { adamw(p, random_tensor({8}), m, m); }, {"adamw_step_", "share memory"}));
  // Overlapping views of one buffer.
  const Tensor flat = random_tensor({12});
  EXPECT_TRUE(throws_with([&] { adamw(flat.narrow(0, 8), random_tensor({8}), flat.narrow(4, 8), v); },
                          {"adamw_step_", "share memory"}));
  // Disjoint views are fine.
  EXPECT_NO_THROW(adamw(flat.narrow(0, 6), random_tensor({6}), flat.narrow(6, 6), zeros({6})));
}

TEST(OptimizerKernelErrors, HyperparametersAreChecked) {
  const Tensor p = random_tensor({5}), g = random_tensor({5}, DType::f32, 3), m = zeros({5}), v = zeros({5});
  EXPECT_TRUE(throws_with([&] { adamw(p, g, m, v, -1e-3); }, {"adamw_step_", "lr", ">= 0", "-0.001"}));
  EXPECT_TRUE(throws_with([&] { adamw(p, g, m, v, NAN); }, {"adamw_step_", "lr", "finite"}));
  EXPECT_TRUE(throws_with([&] { adamw(p, g, m, v, 1e-3, 1.0); }, {"adamw_step_", "beta1", "[0, 1)"}));
  EXPECT_TRUE(throws_with([&] { adamw(p, g, m, v, 1e-3, 0.9, -0.5); }, {"adamw_step_", "beta2", "[0, 1)"}));
  EXPECT_TRUE(throws_with([&] { adamw(p, g, m, v, 1e-3, 0.9, 0.99, -1); }, {"adamw_step_", "eps"}));
  EXPECT_TRUE(throws_with([&] { adamw(p, g, m, v, 1e-3, 0.9, 0.99, 1e-8, -0.1); },
                          {"adamw_step_", "weight_decay"}));
  EXPECT_TRUE(throws_with([&] { adamw(p, g, m, v, 1e-3, 0.9, 0.99, 1e-8, 0.1, 0); },
                          {"adamw_step_", "step", "from 1"}));
  EXPECT_TRUE(throws_with([&] { sgd(p, g, Tensor(), 0.1, 0.9, 0, false, 0, true); },
                          {"sgd_step_", "momentum_buffer is undefined", "allocate"}));
  EXPECT_TRUE(throws_with([&] { sgd(p, g, Tensor(), 0.1, 0.0, 0, true, 0, true); },
                          {"sgd_step_", "nesterov", "momentum > 0"}));
  EXPECT_TRUE(throws_with([&] { sgd(p, g, zeros({5}), 0.1, 0.9, 0.1, true, 0, true); },
                          {"sgd_step_", "nesterov", "dampening 0"}));
  EXPECT_TRUE(throws_with([&] { sgd(p, g, Tensor(), 0.1, -0.9, 0, false, 0, true); },
                          {"sgd_step_", "momentum", ">= 0"}));
}

}  // namespace
