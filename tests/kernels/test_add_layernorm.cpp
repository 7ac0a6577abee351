// The residual add fused into LayerNorm (add_layernorm_forward/backward) against the unfused ops it
// replaces, on the CPU. In f32 and f64 the fused kernels must give the unfused results bit for bit:
// forward add() then layernorm_forward(), backward layernorm_backward() then add(). In narrower
// dtypes the forward is still bit for bit (h is rounded as add() rounds it, and normalized after),
// and the backward rounds the sum once. Inputs are random normals (never zeros), weights and biases
// random too, so a dropped term or a swapped operand shows.
#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>

#include "kernels/elementwise.h"
#include "kernels/nn_ops.h"
#include "tests/testing.h"

namespace octet {
namespace {

using kernels::add_layernorm_backward;
using kernels::add_layernorm_forward;
using kernels::layernorm_backward;
using kernels::layernorm_forward;
using testing::random_tensor;
using testing::same_bits;
using testing::throws_with;

// Which of weight and bias a case passes.
enum class Affine { None, WeightOnly, WeightAndBias };
const char* affine_name(Affine a) {
  return a == Affine::None ? "no affine" : a == Affine::WeightOnly ? "weight only" : "weight and bias";
}

struct Params {
  Tensor weight, bias;
};
Params params_for(Affine a, int64_t C, DType dtype, uint64_t seed) {
  Params p;
  if (a != Affine::None) p.weight = random_tensor({C}, dtype, seed);
  if (a == Affine::WeightAndBias) p.bias = random_tensor({C}, dtype, seed + 1);
  return p;
}

// Odd widths (no SIMD width divides 7 or 33) and ViT-B's; 130 rows at C = 768 go through the
// multi-threaded path and three backward blocks of 64 rows.
const std::initializer_list<int64_t> kWidths = {7, 33, 768};
const std::initializer_list<int64_t> kRows = {1, 5, 130};
const std::initializer_list<Affine> kAffines = {Affine::None, Affine::WeightOnly, Affine::WeightAndBias};

class AddLayerNormExact : public ::testing::TestWithParam<DType> {};  // f32, f64: bit for bit

TEST_P(AddLayerNormExact, ForwardEqualsAddThenLayerNorm) {
  const DType d = GetParam();
  for (int64_t C : kWidths) {
    for (int64_t rows : kRows) {
      for (Affine a : kAffines) {
        SCOPED_TRACE(::testing::Message() << dtype_name(d) << " rows " << rows << " C " << C << " "
                                          << affine_name(a));
        // The residual stream sits away from zero and is larger than the branch, as in a trained ViT.
        const Tensor x = kernels::add_scalar(random_tensor({rows, C}, d, 100 + C + rows, 3.0), 0.5);
        const Tensor y = random_tensor({rows, C}, d, 200 + C + rows, 0.7);
        const Params p = params_for(a, C, d, 300 + C);
        const auto fused = add_layernorm_forward(x, y, p.weight, p.bias, 1e-5);
        const Tensor h = kernels::add(x, y);
        const auto unfused = layernorm_forward(h, p.weight, p.bias, 1e-5);
        EXPECT_TRUE(same_bits(fused.h, h));
        EXPECT_TRUE(same_bits(fused.y, unfused.y));
        EXPECT_TRUE(same_bits(fused.mean, unfused.mean));
        EXPECT_TRUE(same_bits(fused.rstd, unfused.rstd));
      }
    }
  }
}

TEST_P(AddLayerNormExact, BackwardEqualsLayerNormBackwardThenAdd) {
  const DType d = GetParam();
  for (int64_t C : kWidths) {
    for (int64_t rows : kRows) {
      for (Affine a : kAffines) {
        SCOPED_TRACE(::testing::Message() << dtype_name(d) << " rows " << rows << " C " << C << " "
                                          << affine_name(a));
        const Tensor x = random_tensor({rows, C}, d, 400 + C + rows, 2.0);
        const Tensor y = random_tensor({rows, C}, d, 500 + C + rows);
        const Tensor dy = random_tensor({rows, C}, d, 600 + C + rows);
        const Tensor dres = random_tensor({rows, C}, d, 700 + C + rows, 0.5);
        const Params p = params_for(a, C, d, 800 + C);
        const auto fwd = add_layernorm_forward(x, y, p.weight, p.bias);
        const auto ln = layernorm_backward(dy, fwd.h, p.weight, fwd.mean, fwd.rstd);

        const auto with_residual = add_layernorm_backward(dy, dres, fwd.h, p.weight, fwd.mean, fwd.rstd);
        EXPECT_TRUE(same_bits(with_residual.dh, kernels::add(ln.dx, dres)));
        const auto without = add_layernorm_backward(dy, Tensor(), fwd.h, p.weight, fwd.mean, fwd.rstd);
        EXPECT_TRUE(same_bits(without.dh, ln.dx));
        if (a == Affine::None) {
          EXPECT_FALSE(with_residual.dweight.defined() || with_residual.dbias.defined());
        } else {
          EXPECT_TRUE(same_bits(with_residual.dweight, ln.dweight));
          EXPECT_TRUE(same_bits(with_residual.dbias, ln.dbias));
          EXPECT_TRUE(same_bits(without.dweight, ln.dweight));
          EXPECT_TRUE(same_bits(without.dbias, ln.dbias));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AddLayerNormExact, ::testing::Values(DType::f32, DType::f64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(AddLayerNorm, LeadingDimsAreRows) {
  const Tensor x = random_tensor({2, 3, 33}, DType::f32, 900, 2.0), y = random_tensor({2, 3, 33}, DType::f32, 901);
  const Tensor w = random_tensor({33}, DType::f32, 902), b = random_tensor({33}, DType::f32, 903);
  const auto fused = add_layernorm_forward(x, y, w, b);
  const auto unfused = layernorm_forward(kernels::add(x, y), w, b);
  EXPECT_EQ(fused.mean.shape(), (Shape{2, 3}));
  EXPECT_TRUE(same_bits(fused.y, unfused.y));
  EXPECT_TRUE(same_bits(fused.rstd, unfused.rstd));
}

// bf16, f16 and e4m3 storage: h is rounded to the dtype as add() rounds it, and the LayerNorm
// normalizes that rounded h, so the forward still equals the unfused ops bit for bit.
TEST(AddLayerNorm, NarrowDtypeForwardEqualsAddThenLayerNorm) {
  for (DType d : {DType::bf16, DType::f16, DType::e4m3}) {
    for (DType wd : {DType::f32, d}) {
      for (int64_t C : kWidths) {
        SCOPED_TRACE(::testing::Message() << dtype_name(d) << " weights " << dtype_name(wd) << " C " << C);
        const Tensor x = random_tensor({9, C}, d, 1000 + C, 2.0), y = random_tensor({9, C}, d, 1001 + C);
        const Tensor w = random_tensor({C}, wd, 1002 + C), b = random_tensor({C}, wd, 1003 + C);
        const auto fused = add_layernorm_forward(x, y, w, b);
        const Tensor h = kernels::add(x, y);
        const auto unfused = layernorm_forward(h, w, b);
        EXPECT_TRUE(same_bits(fused.h, h));
        EXPECT_TRUE(same_bits(fused.y, unfused.y));
        EXPECT_TRUE(same_bits(fused.mean, unfused.mean));
        EXPECT_TRUE(same_bits(fused.rstd, unfused.rstd));
      }
    }
  }
}

// In bf16 the sum dx + dh_residual is formed in f32 and rounded once: it equals the f32 kernels on
// the widened inputs, rounded at the end, bit for bit (the unfused ops would round twice).
TEST(AddLayerNorm, Bf16BackwardRoundsTheSumOnce) {
  for (int64_t C : kWidths) {
    SCOPED_TRACE(::testing::Message() << "C " << C);
    const Tensor x = random_tensor({70, C}, DType::bf16, 1100 + C, 2.0);
    const Tensor y = random_tensor({70, C}, DType::bf16, 1101 + C);
    const Tensor dy = random_tensor({70, C}, DType::bf16, 1102 + C);
    const Tensor dres = random_tensor({70, C}, DType::bf16, 1103 + C);
    const Tensor w = random_tensor({C}, DType::f32, 1104 + C);
    const auto fwd = add_layernorm_forward(x, y, w, Tensor());
    const auto fused = add_layernorm_backward(dy, dres, fwd.h, w, fwd.mean, fwd.rstd);
    const auto f32 = layernorm_backward(dy.to(DType::f32), fwd.h.to(DType::f32), w, fwd.mean, fwd.rstd);
    EXPECT_TRUE(same_bits(fused.dh, kernels::add(f32.dx, dres.to(DType::f32)).to(DType::bf16)));
    EXPECT_TRUE(same_bits(fused.dweight, f32.dweight));
    EXPECT_TRUE(same_bits(fused.dbias, f32.dbias));
  }
}

// A batch with no rows: empty outputs, and zero weight gradients (sums over no rows), for the
// fused and the plain backward alike (the plain one used to divide by zero blocks).
TEST(AddLayerNorm, NoRowsGiveEmptyOutputsAndZeroWeightGradients) {
  const Tensor x = empty({0, 8}), w = random_tensor({8}), b = random_tensor({8}, DType::f32, 2);
  const auto fwd = add_layernorm_forward(x, x, w, b);
  EXPECT_EQ(fwd.h.shape(), (Shape{0, 8}));
  EXPECT_EQ(fwd.mean.shape(), (Shape{0}));
  const Tensor zeros8 = zeros({8});
  const auto fused = add_layernorm_backward(x, x, fwd.h, w, fwd.mean, fwd.rstd);
  EXPECT_EQ(fused.dh.shape(), (Shape{0, 8}));
  EXPECT_TRUE(same_bits(fused.dweight, zeros8));
  EXPECT_TRUE(same_bits(fused.dbias, zeros8));
  const auto plain = layernorm_backward(x, x, w, fwd.mean, fwd.rstd);
  EXPECT_TRUE(same_bits(plain.dweight, zeros8));
  EXPECT_TRUE(same_bits(plain.dbias, zeros8));
}

// ---- errors ------------------------------------------------------------------------------------------

// A cuda:0 tensor faked over host memory (as tests/kernels/test_errors.cpp does), so the device
// checks run without a GPU; they fail before any byte is touched.
Tensor fake_cuda_tensor(const Shape& shape) {
  const Tensor host = random_tensor(shape);
  auto storage = std::make_shared<Storage>(host.data_ptr(), host.nbytes(), Device::cuda(0), [host](void*) {});
  return Tensor(storage, 0, shape, DType::f32);
}

TEST(AddLayerNormErrors, ForwardNamesTheMismatch) {
  const Tensor x = random_tensor({2, 8}), w = random_tensor({8}), b = random_tensor({8});
  // y broadcastable to x is still refused: the fused add is per row, with no broadcasting.
  EXPECT_TRUE(throws_with([&] { add_layernorm_forward(x, random_tensor({8}), w, b); },
                          {"add_layernorm_forward", "one shape", "f32[2, 8]", "f32[8]", "broadcast_to"}));
  EXPECT_TRUE(throws_with([&] { add_layernorm_forward(x, random_tensor({2, 7}), w, b); },
                          {"add_layernorm_forward", "[2, 8]", "[2, 7]"}));
  EXPECT_TRUE(throws_with([&] { add_layernorm_forward(x, random_tensor({2, 8}, DType::bf16), w, b); },
                          {"add_layernorm_forward", "one dtype", "f32[2, 8]", "bf16[2, 8]", ".to(dtype)"}));
  EXPECT_TRUE(throws_with([&] { add_layernorm_forward(x, fake_cuda_tensor({2, 8}), w, b); },
                          {"add_layernorm_forward", "on cpu", "on cuda:0", ".to(device)"}));
  EXPECT_TRUE(throws_with([&] { add_layernorm_forward(x, Tensor(), w, b); },
                          {"add_layernorm_forward", "undefined"}));
  EXPECT_TRUE(throws_with([&] { add_layernorm_forward(x, x, random_tensor({7}), b); },
                          {"add_layernorm_forward", "weight must be [8]", "f32[7]"}));
  EXPECT_TRUE(throws_with([&] { add_layernorm_forward(x, x, Tensor(), b); },
                          {"add_layernorm_forward", "bias", "without weight"}));
  EXPECT_TRUE(throws_with([&] { add_layernorm_forward(x, x, w, b, -1.0); }, {"add_layernorm_forward", "eps"}));
}

TEST(AddLayerNormErrors, BackwardNamesTheMismatch) {
  const Tensor x = random_tensor({2, 8}), w = random_tensor({8});
  const auto fwd = add_layernorm_forward(x, x, w, Tensor());
  const Tensor dy = random_tensor({2, 8});
  EXPECT_TRUE(throws_with([&] { add_layernorm_backward(dy, random_tensor({2, 7}), fwd.h, w, fwd.mean, fwd.rstd); },
                          {"add_layernorm_backward", "dh_residual", "f32[2, 7]", "f32[2, 8]", "undefined Tensor"}));
  EXPECT_TRUE(throws_with(
      [&] { add_layernorm_backward(dy, random_tensor({2, 8}, DType::bf16), fwd.h, w, fwd.mean, fwd.rstd); },
      {"add_layernorm_backward", "dh_residual", "bf16[2, 8]", "f32[2, 8]"}));
  EXPECT_TRUE(throws_with([&] { add_layernorm_backward(random_tensor({8}), Tensor(), fwd.h, w, fwd.mean, fwd.rstd); },
                          {"add_layernorm_backward", "dy_ln", "f32[8]", "f32[2, 8]"}));
  EXPECT_TRUE(throws_with(
      [&] { add_layernorm_backward(dy, Tensor(), fwd.h, w, fwd.mean.to(DType::f64), fwd.rstd); },
      {"add_layernorm_backward", "mean and rstd", "f64[2]"}));
  EXPECT_TRUE(throws_with([&] { add_layernorm_backward(dy, fake_cuda_tensor({2, 8}), fwd.h, w, fwd.mean, fwd.rstd); },
                          {"add_layernorm_backward", "on cpu", "on cuda:0", ".to(device)"}));
}

TEST(AddLayerNormErrors, CudaInputsWithoutCudaAreRefusedByName) {
  if (cuda::is_available()) GTEST_SKIP() << "this machine has a GPU; the refusal is tested where there is none";
  const Tensor x = fake_cuda_tensor({2, 8}), stats = fake_cuda_tensor({2});
#if OCTET_HAS_CUDA
  // The CUDA entry points allocate their outputs first, which names the missing device.
  EXPECT_TRUE(throws_with([&] { add_layernorm_forward(x, x, Tensor(), Tensor()); }, {"cuda:0", "0 CUDA device"}));
  EXPECT_TRUE(throws_with([&] { add_layernorm_backward(x, x, x, Tensor(), stats, stats); },
                          {"cuda:0", "0 CUDA device"}));
#else
  EXPECT_TRUE(throws_with([&] { add_layernorm_forward(x, x, Tensor(), Tensor()); },
                          {"add_layernorm_forward", "cuda:0", "built without CUDA"}));
  EXPECT_TRUE(throws_with([&] { add_layernorm_backward(x, x, x, Tensor(), stats, stats); },
                          {"add_layernorm_backward", "cuda:0", "built without CUDA"}));
#endif
}

}  // namespace
}  // namespace octet
