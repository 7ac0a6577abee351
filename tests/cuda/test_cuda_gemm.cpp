// cuBLASLt GEMM against the CPU GEMM on the same random inputs: every transpose pair, odd sizes,
// batched and shared-b problems, alpha/beta with beta = 1 accumulation, bf16 operands into an f32
// output, and pointers less than 256-byte aligned. Results are compared by norm-wise relative error,
// ||gpu - cpu||_2 / ||cpu||_2 in f64, against a CPU result computed in f32: at most 1e-5 for f32
// and 1e-2 for bf16 outputs.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "tests/testing.h"
#include "tests/cuda/cuda_testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::random_tensor;
using testing::relative_error;
using testing::relative_error_to_reference;
using testing::throws_with;
using testing::tolerance;

Shape operand_shape(int64_t batch, int64_t rows, int64_t cols, bool trans) {
  Shape s;
  if (batch > 0) s.push_back(batch);
  s.push_back(trans ? cols : rows);
  s.push_back(trans ? rows : cols);
  return s;
}

struct Problem {
  int64_t batch_a, batch_b;  // 0: no batch dim
  int64_t m, n, k;
  bool ta, tb;
};

std::string name(const Problem& p, DType in, DType out) {
  return "batch " + std::to_string(p.batch_a) + "/" + std::to_string(p.batch_b) + " m=" + std::to_string(p.m) +
         " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k) + " ta=" + std::to_string(p.ta) +
         " tb=" + std::to_string(p.tb) + " " + dtype_name(in) + "->" + dtype_name(out);
}

// Runs c = alpha·op(a)·op(b) + beta·c0 on both devices and compares. With bf16/f16 operands whose rows
// are not 16-byte multiples cuBLASLt may have no kernel: then the error must say so and name the
// shapes; `unaligned_failures` counts those (the test prints them).
void check_problem(const Problem& p, DType in, DType out, double alpha, double beta, uint64_t seed,
                   int* unaligned_failures = nullptr) {
  const Tensor a = random_tensor(operand_shape(p.batch_a, p.m, p.k, p.ta), in, seed);
  const Tensor b = random_tensor(operand_shape(p.batch_b, p.k, p.n, p.tb), in, seed + 1);
  Shape c_shape = operand_shape(p.batch_a, p.m, p.n, false);
  const Tensor c0 = random_tensor(c_shape, out, seed + 2);

  Tensor want = c0.to(DType::f32).clone();
  kernels::gemm(a, p.ta, b, p.tb, want, alpha, beta);
  Tensor got = c0.to(kGpu);
  try {
    kernels::gemm(a.to(kGpu), p.ta, b.to(kGpu), p.tb, got, alpha, beta);
  } catch (const Error& e) {
    const std::string msg = e.what();
    const bool explained = msg.find("no algorithm") != std::string::npos && msg.find("gemm") != std::string::npos;
    EXPECT_TRUE(explained && in != DType::f32 && unaligned_failures != nullptr) << name(p, in, out) << ": " << msg;
    if (unaligned_failures) ++*unaligned_failures;
    return;
  }
  EXPECT_EQ(got.dtype(), out);
  EXPECT_TRUE(got.is_cuda());
  EXPECT_LE(relative_error_to_reference(got, want), tolerance(out)) << name(p, in, out);
}

TEST(CudaGemm, AllTransposesAndOddSizesMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const int64_t sizes[] = {1, 7, 33, 129};
  int unaligned_failures = 0, problems = 0;
  uint64_t seed = 100;
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t m : sizes)
      for (int64_t n : sizes)
        for (int64_t k : sizes)
          for (int t = 0; t < 4; ++t) {
            const Problem p{0, 0, m, n, k, (t & 1) != 0, (t & 2) != 0};
            check_problem(p, dtype, dtype, 1.0, 0.0, seed += 3, &unaligned_failures);
            ++problems;
          }
  }
  std::printf("bf16 problems without a cuBLASLt algorithm (clear error given): %d of %d\n", unaligned_failures,
              problems / 2);
}

TEST(CudaGemm, AlignedBf16AndF16SizesAlwaysHaveAnAlgorithm) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 900;
  for (DType dtype : {DType::bf16, DType::f16})
    for (int t = 0; t < 4; ++t) check_problem({0, 0, 24, 40, 64, (t & 1) != 0, (t & 2) != 0}, dtype, dtype, 1.0, 0.0, seed += 3);
}

TEST(CudaGemm, BatchedAndSharedB) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2000;
  for (DType dtype : {DType::f32, DType::bf16})
    for (int t = 0; t < 4; ++t) {
      const bool ta = (t & 1) != 0, tb = (t & 2) != 0;
      check_problem({3, 3, 33, 40, 24, ta, tb}, dtype, dtype, 1.0, 0.0, seed += 3);  // strided batch
      check_problem({5, 0, 17, 16, 32, ta, tb}, dtype, dtype, 1.0, 0.0, seed += 3);  // shared b: folded / stride 0
    }
}

TEST(CudaGemm, AlphaBetaAndAccumulation) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 3000;
  for (DType dtype : {DType::f32, DType::bf16})
    for (double beta : {1.0, 0.25}) check_problem({0, 0, 33, 24, 40, false, true}, dtype, dtype, 0.5, beta, seed += 3);
  // wgrad into an f32 master gradient: bf16 operands, f32 output, beta = 1.
  for (int t = 0; t < 4; ++t)
    check_problem({0, 0, 40, 24, 129, (t & 1) != 0, (t & 2) != 0}, DType::bf16, DType::f32, 1.0, 1.0, seed += 3);
  check_problem({2, 2, 16, 8, 24, true, false}, DType::bf16, DType::f32, 1.0, 1.0, seed += 3);
}

TEST(CudaGemm, PointersLessThan256ByteAligned) {
  SKIP_WITHOUT_GPU();
  // Views one element into a flat buffer (as FSDP's flat parameters are): 4- and 2-byte alignment.
  for (DType dtype : {DType::f32, DType::bf16}) {
    const int64_t m = 16, n = 24, k = 32;
    const Tensor flat_a = random_tensor({m * k + 1}, dtype, 41).to(kGpu);
    const Tensor flat_b = random_tensor({k * n + 1}, dtype, 42).to(kGpu);
    const Tensor a = flat_a.narrow(1, m * k).reshape({m, k});
    const Tensor b = flat_b.narrow(1, k * n).reshape({k, n});
    const Tensor got = kernels::matmul(a, b);
    const Tensor want = kernels::matmul(a.to(Device::cpu()), b.to(Device::cpu()), false, false, DType::f32);
    EXPECT_LE(relative_error_to_reference(got, want), tolerance(dtype)) << dtype_name(dtype);
  }
}

TEST(CudaGemm, EmptyInnerDimensionScalesTheOutput) {
  SKIP_WITHOUT_GPU();
  const Tensor a = empty({5, 0}, DType::f32, kGpu), b = empty({0, 3}, DType::f32, kGpu);
  const Tensor c0 = random_tensor({5, 3}, DType::f32, 51);
  Tensor kept = c0.to(kGpu);
  kernels::gemm(a, false, b, false, kept, 1.0, 1.0);
  EXPECT_EQ(relative_error(kept, c0), 0.0);
  Tensor zeroed = c0.to(kGpu);
  kernels::gemm(a, false, b, false, zeroed, 1.0, 0.0);
  EXPECT_EQ(relative_error(zeroed, zeros({5, 3})), 0.0);
}

TEST(CudaGemm, UnsupportedOperandsGiveClearErrors) {
  SKIP_WITHOUT_GPU();
  const Tensor a = random_tensor({8, 16}, DType::f32, 61).to(kGpu);
  const Tensor b = random_tensor({16, 8}, DType::bf16, 62).to(kGpu);
  EXPECT_TRUE(throws_with([&] { kernels::matmul(a, b); }, {"gemm", "one dtype", "f32[8, 16]", "bf16[16, 8]"}));
  const Tensor b16 = random_tensor({16, 8}, DType::bf16, 63).to(kGpu);
  const Tensor a16 = random_tensor({8, 16}, DType::bf16, 64).to(kGpu);
  EXPECT_TRUE(throws_with([&] { kernels::matmul(a16, b16, false, false, DType::f16); }, {"gemm", "output"}));
  EXPECT_TRUE(throws_with([&] { kernels::matmul(a16, b16.to(Device::cpu())); }, {"gemm", "cuda:0", "cpu"}));
}

}  // namespace
}  // namespace octet
