// CUDA elementwise kernels against the CPU kernels on the same random inputs. Floating results are
// compared by norm-wise relative error, ||gpu - cpu||_2 / ||cpu||_2 in f64: at most 1e-5 for f32 and
// 1e-2 for bf16. Integer results and pure data movement must match exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "kernels/elementwise.h"
#include "tests/testing.h"
#include "tests/cuda/cuda_testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::max_row_relative_error;
using testing::random_tensor;
using testing::relative_error_matching_nans;
using testing::same_bits;
using testing::throws_with;
using testing::tolerance;
using testing::uniform_tensor;

// Operand shape pairs: equal, trailing bias, middle broadcast, both broadcast, scalars, one element,
// and odd sizes throughout.
const std::vector<std::pair<Shape, Shape>> kShapePairs = {
    {{7, 13, 33}, {7, 13, 33}}, {{7, 13, 33}, {33}},     {{7, 1, 33}, {13, 1}}, {{7, 13, 33}, {1}},
    {{1}, {1}},                 {{5, 1, 3, 1}, {1, 4, 1, 6}}, {{1000003}, {1000003}}, {{37}, {7, 1, 1}}};

using BinaryFn = Tensor (*)(const Tensor&, const Tensor&);

void check_binary(const char* name, BinaryFn fn, double lo, double hi, DType dtype) {
  for (const auto& [sa, sb] : kShapePairs) {
    const Tensor a = uniform_tensor(sa, lo, hi, dtype, 11), b = uniform_tensor(sb, lo, hi, dtype, 12);
    const Tensor want = fn(a, b);
    const Tensor got = fn(a.to(kGpu), b.to(kGpu));
    EXPECT_TRUE(got.is_cuda());
    EXPECT_LE(relative_error_matching_nans(got, want), tolerance(dtype)) << name << " " << a.describe() << " " << b.describe();
    EXPECT_LE(max_row_relative_error(got, want, 1024), tolerance(dtype))
        << name << " " << a.describe() << " " << b.describe() << ", a run of 1024 elements";
  }
}

TEST(CudaElementwise, BinaryOpsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    check_binary("add", kernels::add, -3, 3, dtype);
    check_binary("sub", kernels::sub, -3, 3, dtype);
    check_binary("mul", kernels::mul, -3, 3, dtype);
    check_binary("div", kernels::div, 0.5, 2, dtype);
    check_binary("pow", kernels::pow, 0.3, 2.5, dtype);
    check_binary("maximum", kernels::maximum, -3, 3, dtype);
  }
}

TEST(CudaElementwise, SameShapeOperandsAtUnalignedOffsets) {
  SKIP_WITHOUT_GPU();
  // Views one element into their storage: the 16-byte path must step aside for the scalar one.
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Tensor a = random_tensor({1001}, dtype, 3), b = random_tensor({1001}, dtype, 4);
    const Tensor ga = a.to(kGpu).narrow(1, 1000), gb = b.to(kGpu).narrow(0, 1000);
    const Tensor want = kernels::mul(a.narrow(1, 1000), b.narrow(0, 1000));
    EXPECT_LE(relative_error_matching_nans(kernels::mul(ga, gb), want), tolerance(dtype));
  }
}

TEST(CudaElementwise, UnaryOpsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  using UnaryFn = Tensor (*)(const Tensor&);
  struct Case {
    const char* name;
    UnaryFn fn;
    double lo, hi;
  };
  const std::vector<Case> cases = {{"neg", kernels::neg, -3, 3},    {"exp", kernels::exp, -5, 5},
                                   {"log", kernels::log, 0.01, 9},  {"tanh", kernels::tanh, -4, 4},
                                   {"sqrt", kernels::sqrt, 0, 9},   {"rsqrt", kernels::rsqrt, 0.01, 9},
                                   {"abs", kernels::abs, -3, 3},    {"sign", kernels::sign, -3, 3}};
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const Shape& shape : {Shape{7, 13, 33}, Shape{1}, Shape{9, 1000}}) {
      for (const Case& c : cases) {
        const Tensor a = uniform_tensor(shape, c.lo, c.hi, dtype, 5);
        EXPECT_LE(relative_error_matching_nans(c.fn(a.to(kGpu)), c.fn(a)), tolerance(dtype)) << c.name << " " << a.describe();
      }
    }
  }
}

TEST(CudaElementwise, ScalarOpsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  using ScalarFn = Tensor (*)(const Tensor&, double);
  struct Case {
    const char* name;
    ScalarFn fn;
    double s;
  };
  const std::vector<Case> cases = {{"add_scalar", kernels::add_scalar, 0.3},
                                   {"mul_scalar", kernels::mul_scalar, -1.7},
                                   {"rsub_scalar", kernels::rsub_scalar, 2.5},
                                   {"rdiv_scalar", kernels::rdiv_scalar, 3.0},
                                   {"pow_scalar", kernels::pow_scalar, 1.5}};
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Tensor a = uniform_tensor({7, 13, 33}, 0.2, 3, dtype, 6);
    for (const Case& c : cases) {
      EXPECT_LE(relative_error_matching_nans(c.fn(a.to(kGpu), c.s), c.fn(a, c.s)), tolerance(dtype)) << c.name << " " << a.describe();
    }
  }
}

TEST(CudaElementwise, IntegerOpsAreExact) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::i32, DType::i64}) {
    for (const auto& [sa, sb] : kShapePairs) {
      const Tensor a = random_tensor(sa, DType::f64, 7, 1000).to(dtype);
      const Tensor b = random_tensor(sb, DType::f64, 8, 1000).to(dtype);
      for (BinaryFn fn : {kernels::add, kernels::sub, kernels::mul, kernels::maximum}) {
        EXPECT_TRUE(same_bits(fn(a.to(kGpu), b.to(kGpu)), fn(a, b))) << a.describe() << " " << b.describe();
      }
      EXPECT_TRUE(same_bits(kernels::neg(a.to(kGpu)), kernels::neg(a)));
      EXPECT_TRUE(same_bits(kernels::abs(a.to(kGpu)), kernels::abs(a)));
      EXPECT_TRUE(same_bits(kernels::sign(a.to(kGpu)), kernels::sign(a)));
      EXPECT_TRUE(same_bits(kernels::add_scalar(a.to(kGpu), 5), kernels::add_scalar(a, 5)));
      EXPECT_TRUE(same_bits(kernels::mul_scalar(a.to(kGpu), -3), kernels::mul_scalar(a, -3)));
    }
  }
  // Wrapping overflow, as on the CPU.
  const Tensor big = from_vector<int32_t>({2147483647, -2147483647 - 1}, {2});
  EXPECT_TRUE(same_bits(kernels::add(big.to(kGpu), big.to(kGpu)), kernels::add(big, big)));
  EXPECT_TRUE(same_bits(kernels::neg(big.to(kGpu)), kernels::neg(big)));
}

TEST(CudaElementwise, Fp8GoesThroughF32LikeTheCpu) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::e4m3, DType::e5m2}) {
    const Tensor a = random_tensor({7, 13, 33}, dtype, 9), b = random_tensor({33}, dtype, 10);
    EXPECT_TRUE(same_bits(kernels::add(a.to(kGpu), b.to(kGpu)), kernels::add(a, b)));
    EXPECT_TRUE(same_bits(kernels::mul_scalar(a.to(kGpu), 0.5), kernels::mul_scalar(a, 0.5)));
  }
}

TEST(CudaElementwise, BroadcastToMovesAnyDtypeExactly) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{33}, {7, 13, 33}}, {{13, 1}, {7, 13, 33}}, {{1}, {5, 3}}, {{7, 1, 33}, {7, 13, 33}}, {{2, 3}, {2, 3}}};
  for (DType dtype : {DType::f32, DType::bf16, DType::u8, DType::f64, DType::e4m3}) {
    for (const auto& [from, to] : cases) {
      const Tensor a = random_tensor(from, DType::f64, 13, 50).to(dtype);
      EXPECT_TRUE(same_bits(kernels::broadcast_to(a.to(kGpu), to), kernels::broadcast_to(a, to))) << a.describe();
    }
  }
}

TEST(CudaElementwise, AddInPlaceAcrossDtypesAndIntoViews) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::pair<DType, DType>> pairs = {{DType::f32, DType::f32},  {DType::f32, DType::bf16},
                                                      {DType::bf16, DType::f32}, {DType::bf16, DType::bf16},
                                                      {DType::f32, DType::f64},  {DType::e4m3, DType::f32}};
  for (const auto& [dst_dtype, src_dtype] : pairs) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100003}}) {
      const Tensor dst = random_tensor({n}, dst_dtype, 14), src = random_tensor({n}, src_dtype, 15);
      const Tensor want = dst.clone(), got = dst.to(kGpu);
      kernels::add_(want, src, -0.37);
      kernels::add_(got, src.to(kGpu), -0.37);
      EXPECT_LE(relative_error_matching_nans(got, want), tolerance(dst_dtype == DType::f32 ? DType::f32 : DType::bf16))
          << dtype_name(dst_dtype) << " += " << dtype_name(src_dtype) << ", n = " << n;
    }
  }
  // dst a view into a flat buffer at an odd offset: only the view changes.
  const Tensor flat = random_tensor({2000}, DType::f32, 16), src = random_tensor({999}, DType::bf16, 17);
  const Tensor want = flat.clone(), got = flat.to(kGpu);
  kernels::add_(want.narrow(3, 999), src, 2.0);
  kernels::add_(got.narrow(3, 999), src.to(kGpu), 2.0);
  EXPECT_LE(relative_error_matching_nans(got, want), 1e-5);
  // Integers accumulate exactly.
  const Tensor ints = random_tensor({77}, DType::f64, 18, 100).to(DType::i64);
  const Tensor want_i = ints.clone(), got_i = ints.to(kGpu);
  kernels::add_(want_i, ints, 3);
  kernels::add_(got_i, ints.to(kGpu), 3);
  EXPECT_TRUE(same_bits(got_i, want_i));
}

TEST(CudaElementwise, MulScalarInPlace) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::bf16, DType::e5m2}) {
    const Tensor x = random_tensor({7, 13, 33}, dtype, 19);
    const Tensor want = x.clone(), got = x.to(kGpu);
    kernels::mul_scalar_(want, 0.731);
    kernels::mul_scalar_(got, 0.731);
    EXPECT_TRUE(same_bits(got, want)) << x.describe();  // one correctly rounded multiply each
  }
}

TEST(CudaElementwise, UnsupportedDtypesNameTheOpAndTheFix) {
  SKIP_WITHOUT_GPU();
  const Tensor d = random_tensor({4}, DType::f64).to(kGpu);
  EXPECT_TRUE(throws_with([&] { (void)kernels::exp(d); }, {"exp", "f64", ".to(DType::f32)"}));
  EXPECT_TRUE(throws_with([&] { (void)kernels::add(d, d); }, {"add", "f64", ".to(DType::f32)"}));
  const Tensor u = zeros({4}, DType::u8, kGpu);
  EXPECT_TRUE(throws_with([&] { (void)kernels::add(u, u); }, {"add", "u8"}));
  // Nine dims that no merge can shorten exceed the broadcast kernel's eight.
  const Tensor a = random_tensor({2, 1, 2, 1, 2, 1, 2, 1, 2}).to(kGpu), b = random_tensor({1, 2, 1, 2, 1, 2, 1, 2, 1}).to(kGpu);
  EXPECT_TRUE(throws_with([&] { (void)kernels::add(a, b); }, {"add", "at most 8 dims", "reshape"}));
}

}  // namespace
}  // namespace octet
