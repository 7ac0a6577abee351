// kernels::linear_* on the GPU (cuBLASLt epilogues where they apply, the generic kernels where they
// do not) against the same functions on the CPU, on the same random inputs. Norm-wise relative
// error ||gpu - cpu||_2 / ||cpu||_2 in f64: 1e-5 for f32, 1e-2 for bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "kernels/cuda/gemm_cuda.h"
#include "kernels/cuda/reduce_cuda.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "tests/testing.h"
#include "tests/cuda/cuda_testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::random_tensor;
using testing::relative_error;
using testing::tolerance;

struct Case {
  int64_t in, out;
  bool bias;
  DType dtype;
};

std::string name(const Case& c) {
  return "in=" + std::to_string(c.in) + " out=" + std::to_string(c.out) + " bias=" + std::to_string(c.bias) + " " +
         dtype_name(c.dtype);
}

// Two output widths, a multiple of 8 and an odd one: where cuBLASLt offers no epilogue algorithm
// for a shape, the generic path runs instead.
std::vector<Case> cases() {
  std::vector<Case> all;
  for (DType dtype : {DType::f32, DType::bf16})
    for (bool bias : {true, false})
      for (int64_t out : {24, 7}) all.push_back({33, out, bias, dtype});
  return all;
}

TEST(CudaLinear, ForwardMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 10;
  for (const Case& c : cases()) {
    const Tensor x = random_tensor({2, 5, c.in}, c.dtype, seed += 3);
    const Tensor w = random_tensor({c.out, c.in}, c.dtype, seed += 3, 0.2);
    const Tensor b = c.bias ? random_tensor({c.out}, c.dtype, seed += 3) : Tensor();
    const Tensor want = kernels::linear_forward(x, w, b);
    const Tensor got = kernels::linear_forward(x.to(kGpu), w.to(kGpu), c.bias ? b.to(kGpu) : Tensor());
    EXPECT_TRUE(got.is_cuda());
    EXPECT_LE(relative_error(got, want), tolerance(c.dtype)) << name(c);
  }
}

// linear_forward with a residual (a block's residual adds, after proj and after fc2): residual + x·Wᵀ + b
// against float64.
// The bound, element by element, with u = 2^-24 (f32) or 2^-8 (bf16) and A = Σ_k |x_k·w_k|: the
// f32 accumulation of K products, in any order, is within K·2^-24·A of exact; where cuBLASLt adds the
// residual in its epilogue (a bias, and it offers an algorithm) the sum is rounded once, so
//   |got - exact| <= e + u·(|exact| + e),  e = K·2^-24·A;
// elsewhere y is rounded, then the sum: e' = e + u·(|y| + e), |got - exact| <= e' + u·(|exact| + e').
// The small cases may take either path and are held to the second bound; ViT-Base's fc2 and proj
// (bf16, a bias, every row 16-byte aligned) must take the epilogue, and are held to the first.
TEST(CudaLinear, ResidualAddedInTheEpilogueRoundsOnce) {
  SKIP_WITHOUT_GPU();
  auto check = [](const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& r, bool one_rounding,
                  const std::string& what) {
    const Tensor got = kernels::linear_forward(x.to(kGpu), w.to(kGpu), b.defined() ? b.to(kGpu) : Tensor(), r.to(kGpu));
    ASSERT_TRUE(got.is_cuda());
    ASSERT_EQ(got.shape(), r.shape());
    const Tensor b64 = b.defined() ? b.to(DType::f64) : Tensor();
    const Tensor y64 = kernels::linear_forward(x.to(DType::f64), w.to(DType::f64), b64);
    const std::vector<double> y = y64.to_vector<double>();
    const std::vector<double> exact = kernels::add(y64, r.to(DType::f64)).to_vector<double>();
    const std::vector<double> mag =
        kernels::linear_forward(kernels::abs(x.to(DType::f64)), kernels::abs(w.to(DType::f64)), Tensor())
            .to_vector<double>();
    const std::vector<double> g = got.to(DType::f64).to_vector<double>();
    const double u = x.dtype() == DType::bf16 ? 0x1p-8 : 0x1p-24;
    const double K = static_cast<double>(w.size(1));
    int64_t outside = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const double e = K * 0x1p-24 * mag[i];
      const double e2 = one_rounding ? e : e + u * (std::fabs(y[i]) + e);
      if (std::fabs(g[i] - exact[i]) > e2 + u * (std::fabs(exact[i]) + e2)) ++outside;
    }
    EXPECT_EQ(outside, 0) << what;
  };
  uint64_t seed = 300;
  for (const Case& c : cases()) {
    const Tensor x = random_tensor({2, 5, c.in}, c.dtype, seed += 3);
    const Tensor w = random_tensor({c.out, c.in}, c.dtype, seed += 3, 0.2);
    const Tensor b = c.bias ? random_tensor({c.out}, c.dtype, seed += 3) : Tensor();
    check(x, w, b, random_tensor({2, 5, c.out}, c.dtype, seed += 3), false, name(c));
  }
  const Tensor x = random_tensor({2, 197, 3072}, DType::bf16, 330);
  const Tensor w = random_tensor({768, 3072}, DType::bf16, 331, 0.03);
  check(x, w, random_tensor({768}, DType::bf16, 332), random_tensor({2, 197, 768}, DType::bf16, 333, 2.0), true,
        "ViT-Base fc2");
  check(random_tensor({2, 197, 768}, DType::bf16, 334), random_tensor({768, 768}, DType::bf16, 335, 0.03),
        random_tensor({768}, DType::bf16, 336), random_tensor({2, 197, 768}, DType::bf16, 337, 2.0), true,
        "ViT-Base proj");
  // The residual checked like any input.
  EXPECT_TRUE(testing::throws_with(
      [&] { kernels::linear_forward(x.to(kGpu), w.to(kGpu), Tensor(), random_tensor({2, 197, 767}).to(kGpu)); },
      {"linear_forward", "residual", "[2, 197, 768]"}));
}

// An addend goes with the BIAS epilogue only: with no epilogue, where the GEMM reads C from the output,
// it would be dropped without a word, so it is refused, and the output left unwritten.
TEST(CudaLinear, AnAddendWithoutTheBiasEpilogueIsRefused) {
  SKIP_WITHOUT_GPU();
  const Tensor a = random_tensor({32, 64}, DType::bf16, 340).to(kGpu);
  const Tensor b = random_tensor({48, 64}, DType::bf16, 341).to(kGpu);
  const Tensor before = random_tensor({32, 48}, DType::bf16, 342);
  const Tensor c = before.to(kGpu);
  kernels::cuda::GemmEpilogueArgs epilogue;
  epilogue.addend = random_tensor({32, 48}, DType::bf16, 343).to(kGpu);
  kernels::cuda::GemmProblem problem;
  problem.m = 32, problem.n = 48, problem.k = 64;
  problem.stride_a = 32 * 64, problem.stride_b = 48 * 64, problem.stride_c = 32 * 48;
  EXPECT_TRUE(testing::throws_with(
      [&] { kernels::cuda::gemm_with_epilogue(a, false, b, true, c, problem, 1.0, 1.0, epilogue); },
      {"gemm", "addend", "BIAS epilogue", "no epilogue"}));
  EXPECT_TRUE(testing::same_bits(c, before));
}

TEST(CudaLinear, BackwardMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 500;
  for (const Case& c : cases()) {
    const Tensor x = random_tensor({2, 5, c.in}, c.dtype, seed += 3);
    const Tensor w = random_tensor({c.out, c.in}, c.dtype, seed += 3, 0.2);
    const Tensor b = random_tensor({c.out}, c.dtype, seed += 3);
    const Tensor dy = random_tensor({2, 5, c.out}, c.dtype, seed += 3);
    const kernels::LinearGrads want = kernels::linear_backward(dy, x, w, true, true, c.bias);
    const kernels::LinearGrads got = kernels::linear_backward(dy.to(kGpu), x.to(kGpu), w.to(kGpu), true, true, c.bias);
    EXPECT_LE(relative_error(got.dx, want.dx), tolerance(c.dtype)) << name(c);
    EXPECT_LE(relative_error(got.dweight, want.dweight), tolerance(c.dtype)) << name(c);
    if (c.bias) {
      EXPECT_LE(relative_error(got.dbias, want.dbias), tolerance(c.dtype)) << name(c);
    } else {
      EXPECT_FALSE(got.dbias.defined());
    }
  }
}

// Both designs of the bias gradient (kernels/linear.h LinearBiasGradDesign) where BGRADB applies (bf16
// dy, out a multiple of 8) and the column sum takes its packed path (394 rows of 264 columns, 33 packs),
// with a bf16 weight and with an f32 one (an f32 dweight and dbias, written from the f32 sums). Against
// the float64 Σ over dy's rows, element by element: the f32 sums, in any order, are within
// e = (n - 1)·2^-24·Σ|dy| of it, and the one rounding to bf16 adds at most 2^-8·(|exact| + e) (none for
// f32); a row left out or counted twice moves a column by ~0.8, past e + 2^-8·|exact| (~0.1 here). The
// column-sum design's dbias is kernels::cuda::sum's, bit for bit (the two run the same kernels), and the
// weight gradient stays the CPU's within the suite's bound.
TEST(CudaLinear, BothBiasGradDesignsSumDyOnceRounded) {
  SKIP_WITHOUT_GPU();
  using kernels::LinearBiasGradDesign;
  const int64_t n = 394, in = 96, out = 264;
  const Tensor x = random_tensor({2, 197, in}, DType::bf16, 171), dy = random_tensor({2, 197, out}, DType::bf16, 172);
  const std::vector<double> dyv = dy.to_vector<double>();
  std::vector<double> exact(out, 0.0), magnitude(out, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      exact[o] += dyv[r * out + o];
      magnitude[o] += std::fabs(dyv[r * out + o]);
    }
  }
  for (DType weight_dtype : {DType::bf16, DType::f32}) {
    const Tensor w = random_tensor({out, in}, weight_dtype, 173, 0.2);
    const kernels::LinearGrads cpu = kernels::linear_backward(dy, x, w.to(DType::bf16), false, true, true);
    for (LinearBiasGradDesign design : {LinearBiasGradDesign::kEpilogue, LinearBiasGradDesign::kColumnSum}) {
      const std::string what = std::string(dtype_name(weight_dtype)) + " weight, " +
                               (design == LinearBiasGradDesign::kEpilogue ? "epilogue" : "column sum");
      const kernels::LinearGrads got = [&] {
        kernels::set_linear_bias_grad_design(design);
        struct Restore {  // even when linear_backward throws: later tests run with the default
          LinearBiasGradDesign before = kernels::linear_bias_grad_design();
          ~Restore() { kernels::set_linear_bias_grad_design(before); }
        } restore;
        return kernels::linear_backward(dy.to(kGpu), x.to(kGpu), w.to(kGpu), false, true, true);
      }();
      ASSERT_TRUE(got.dbias.defined()) << what;
      EXPECT_EQ(got.dbias.dtype(), weight_dtype) << what;
      const double u = weight_dtype == DType::bf16 ? 0x1p-8 : 0.0;
      const std::vector<double> db = got.dbias.to_vector<double>();
      int64_t outside = 0;
      for (int64_t o = 0; o < out; ++o) {
        const double e = static_cast<double>(n - 1) * 0x1p-24 * magnitude[o];
        if (std::fabs(db[o] - exact[o]) > e + u * (std::fabs(exact[o]) + e)) ++outside;
      }
      EXPECT_EQ(outside, 0) << what;
      EXPECT_LE(relative_error(got.dweight.to(DType::bf16).to(DType::f32), cpu.dweight.to(DType::f32)), 1e-2) << what;
      if (design == LinearBiasGradDesign::kColumnSum) {
        const Tensor want = kernels::cuda::sum(dy.to(kGpu).reshape({n, out}), 1, n, out, 1.f, weight_dtype, "test");
        EXPECT_TRUE(testing::same_bits(got.dbias, want)) << what;
      }
    }
  }
}

TEST(CudaLinear, AnF32WeightIsConvertedToTheActivationsDtype) {
  SKIP_WITHOUT_GPU();
  const Tensor x = random_tensor({6, 32}, DType::bf16, 91);
  const Tensor w = random_tensor({16, 32}, DType::f32, 92, 0.2);
  const Tensor b = random_tensor({16}, DType::f32, 93);
  const Tensor dy = random_tensor({6, 16}, DType::bf16, 94);
  const Tensor got = kernels::linear_forward(x.to(kGpu), w.to(kGpu), b.to(kGpu));
  const Tensor want = kernels::linear_forward(x, w.to(DType::bf16), b.to(DType::bf16));
  EXPECT_LE(relative_error(got, want), 1e-2);
  const kernels::LinearGrads g = kernels::linear_backward(dy.to(kGpu), x.to(kGpu), w.to(kGpu), true, true, true);
  EXPECT_EQ(g.dweight.dtype(), DType::f32);
  EXPECT_EQ(g.dbias.dtype(), DType::f32);
  const kernels::LinearGrads g_cpu = kernels::linear_backward(dy, x, w.to(DType::bf16), true, true, true);
  EXPECT_LE(relative_error(g.dx, g_cpu.dx), 1e-2);
  EXPECT_LE(relative_error(g.dweight, g_cpu.dweight.to(DType::f32)), 1e-2);
}

TEST(CudaLinear, AutogradLinearOnTheGpuMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Tensor x0 = random_tensor({3, 4, 16}, dtype, 101);
    const Tensor w0 = random_tensor({8, 16}, dtype, 102, 0.3);
    const Tensor b0 = random_tensor({8}, dtype, 103);
    const Tensor probe = random_tensor({3, 4, 8}, dtype, 104);
    Tensor grads[2][3];
    Tensor outputs[2];
    for (int on_gpu = 0; on_gpu < 2; ++on_gpu) {
      const Device d = on_gpu ? kGpu : Device::cpu();
      Tensor x = x0.to(d).clone(), w = w0.to(d).clone(), b = b0.to(d).clone();
      x.requires_grad_(true);
      w.requires_grad_(true);
      b.requires_grad_(true);
      Tensor y = linear(x, w, b);
      outputs[on_gpu] = y.detach();
      y.backward(probe.to(d));
      grads[on_gpu][0] = x.grad();
      grads[on_gpu][1] = w.grad();
      grads[on_gpu][2] = b.grad();
    }
    EXPECT_LE(relative_error(outputs[1], outputs[0]), tolerance(dtype)) << dtype_name(dtype);
    for (int i = 0; i < 3; ++i) EXPECT_LE(relative_error(grads[1][i], grads[0][i]), tolerance(dtype)) << i;
  }
}

}  // namespace
}  // namespace octet
