// kernels::linear_* on the GPU (cuBLASLt epilogues where they apply, the generic kernels where they
// do not) against the same functions on the CPU, on the same random inputs. Norm-wise relative
// error ||gpu - cpu||_2 / ||cpu||_2 in f64: 1e-5 for f32, 1e-2 for bf16. f32 results that went
// through cuBLASLt's GELU get 1e-3: its epilogue may evaluate tanh with the hardware approximation
// (tanh.approx.f32, relative error about 2^-11), which the CPU's exact tanh does not share.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/ops.h"
#include "kernels/linear.h"
#include "tests/testing.h"
#include "tests/cuda/cuda_testing.h"

namespace octet {
namespace {

using kernels::LinearActivation;
using testing::kGpu;
using testing::random_tensor;
using testing::relative_error;
using testing::tolerance;

// f32 through cuBLASLt's GELU epilogue gets 1e-3 (see the top of the file); everything else the suite's bound.
double tolerance(DType d, bool through_gelu) { return d == DType::f32 && through_gelu ? 1e-3 : tolerance(d); }

struct Case {
  int64_t in, out;
  bool bias;
  LinearActivation act;
  DType dtype;
};

std::string name(const Case& c) {
  return "in=" + std::to_string(c.in) + " out=" + std::to_string(c.out) + " bias=" + std::to_string(c.bias) +
         (c.act == LinearActivation::GeluTanh ? " gelu_tanh " : " none ") + dtype_name(c.dtype);
}

// out = 24 meets every epilogue's layout rules; out = 7 does not for the GELU ones (their aux matrix
// needs a leading dimension that is a multiple of 8), so it exercises the generic path too.
std::vector<Case> cases() {
  std::vector<Case> all;
  for (DType dtype : {DType::f32, DType::bf16})
    for (LinearActivation act : {LinearActivation::None, LinearActivation::GeluTanh})
      for (bool bias : {true, false})
        for (int64_t out : {24, 7}) all.push_back({33, out, bias, act, dtype});
  return all;
}

TEST(CudaLinear, ForwardMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 10;
  for (const Case& c : cases()) {
    const Tensor x = random_tensor({2, 5, c.in}, c.dtype, seed += 3);
    const Tensor w = random_tensor({c.out, c.in}, c.dtype, seed += 3, 0.2);
    const Tensor b = c.bias ? random_tensor({c.out}, c.dtype, seed += 3) : Tensor();
    const kernels::LinearForward want = kernels::linear_forward(x, w, b, c.act);
    const kernels::LinearForward got =
        kernels::linear_forward(x.to(kGpu), w.to(kGpu), c.bias ? b.to(kGpu) : Tensor(), c.act);
    const bool gelu = c.act == LinearActivation::GeluTanh;
    EXPECT_TRUE(got.y.is_cuda());
    EXPECT_LE(relative_error(got.y, want.y), tolerance(c.dtype, gelu)) << name(c);
    EXPECT_EQ(got.pre_activation.defined(), gelu) << name(c);
    if (gelu) {
      EXPECT_LE(relative_error(got.pre_activation, want.pre_activation), tolerance(c.dtype)) << name(c);
    }
  }
}

TEST(CudaLinear, BackwardMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 500;
  for (const Case& c : cases()) {
    const Tensor x = random_tensor({2, 5, c.in}, c.dtype, seed += 3);
    const Tensor w = random_tensor({c.out, c.in}, c.dtype, seed += 3, 0.2);
    const Tensor b = random_tensor({c.out}, c.dtype, seed += 3);
    const Tensor dy = random_tensor({2, 5, c.out}, c.dtype, seed += 3);
    const Tensor pre = c.act == LinearActivation::GeluTanh ? kernels::linear_forward(x, w, b, c.act).pre_activation
                                                           : Tensor();
    const kernels::LinearGrads want = kernels::linear_backward(dy, x, w, pre, c.act, true, true, c.bias);
    const kernels::LinearGrads got = kernels::linear_backward(dy.to(kGpu), x.to(kGpu), w.to(kGpu),
                                                              pre.defined() ? pre.to(kGpu) : Tensor(), c.act, true,
                                                              true, c.bias);
    // The GELU backward here is the generic kernel on both devices: no epilogue tolerance needed.
    EXPECT_LE(relative_error(got.dx, want.dx), tolerance(c.dtype)) << name(c);
    EXPECT_LE(relative_error(got.dweight, want.dweight), tolerance(c.dtype)) << name(c);
    if (c.bias) {
      EXPECT_LE(relative_error(got.dbias, want.dbias), tolerance(c.dtype)) << name(c);
    } else {
      EXPECT_FALSE(got.dbias.defined());
    }
  }
}

TEST(CudaLinear, WgradAccumulatesIntoAnF32MasterGradient) {
  SKIP_WITHOUT_GPU();
  for (int64_t out : {24, 7}) {
    const Tensor x = random_tensor({4, 9, 40}, DType::bf16, 71);
    const Tensor w = random_tensor({out, 40}, DType::bf16, 72);
    const Tensor dy = random_tensor({4, 9, out}, DType::bf16, 73);
    const Tensor grad0 = random_tensor({out, 40}, DType::f32, 74);
    const Tensor want_grad = grad0.clone();
    const kernels::LinearGrads want =
        kernels::linear_backward(dy, x, w, Tensor(), LinearActivation::None, false, true, true, want_grad);
    const Tensor got_grad = grad0.to(kGpu);
    const kernels::LinearGrads got = kernels::linear_backward(dy.to(kGpu), x.to(kGpu), w.to(kGpu), Tensor(),
                                                              LinearActivation::None, false, true, true, got_grad);
    EXPECT_EQ(got.dweight.data_ptr(), got_grad.data_ptr());
    EXPECT_EQ(got.dbias.dtype(), DType::f32);
    // f32 outputs of bf16 operands: both sides sum exact products in f32, so f32's tolerance holds.
    EXPECT_LE(relative_error(got_grad, want_grad), 1e-5) << "out=" << out;
    EXPECT_LE(relative_error(got.dbias, want.dbias), 1e-2) << "out=" << out;
  }
}

TEST(CudaLinear, GeluDgradMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 800;
  for (DType dtype : {DType::f32, DType::bf16})
    for (int64_t in : {32, 33})  // 32 takes DGELU(_BGRAD); 33 breaks the aux layout rule
      for (bool need_dbias : {true, false}) {
        const Tensor pre = random_tensor({3, 7, in}, dtype, seed += 3);
        const Tensor w = random_tensor({24, in}, dtype, seed += 3, 0.2);
        const Tensor dz = random_tensor({3, 7, 24}, dtype, seed += 3);
        const kernels::GeluDgrad want = kernels::linear_dgrad_gelu(dz, w, pre, need_dbias);
        const kernels::GeluDgrad got = kernels::linear_dgrad_gelu(dz.to(kGpu), w.to(kGpu), pre.to(kGpu), need_dbias);
        const std::string what = std::string(dtype_name(dtype)) + " in=" + std::to_string(in);
        EXPECT_LE(relative_error(got.d_pre_activation, want.d_pre_activation), tolerance(dtype, true)) << what;
        EXPECT_EQ(got.dbias.defined(), need_dbias) << what;
        if (need_dbias) {
          EXPECT_LE(relative_error(got.dbias, want.dbias), tolerance(dtype, true)) << what;
        }
      }
}

TEST(CudaLinear, AnF32WeightIsConvertedToTheActivationsDtype) {
  SKIP_WITHOUT_GPU();
  const Tensor x = random_tensor({6, 32}, DType::bf16, 91);
  const Tensor w = random_tensor({16, 32}, DType::f32, 92, 0.2);
  const Tensor b = random_tensor({16}, DType::f32, 93);
  const Tensor dy = random_tensor({6, 16}, DType::bf16, 94);
  const kernels::LinearForward got = kernels::linear_forward(x.to(kGpu), w.to(kGpu), b.to(kGpu));
  const kernels::LinearForward want = kernels::linear_forward(x, w.to(DType::bf16), b.to(DType::bf16));
  EXPECT_LE(relative_error(got.y, want.y), 1e-2);
  const kernels::LinearGrads g =
      kernels::linear_backward(dy.to(kGpu), x.to(kGpu), w.to(kGpu), Tensor(), LinearActivation::None, true, true, true);
  EXPECT_EQ(g.dweight.dtype(), DType::f32);
  EXPECT_EQ(g.dbias.dtype(), DType::f32);
  const kernels::LinearGrads g_cpu =
      kernels::linear_backward(dy, x, w.to(DType::bf16), Tensor(), LinearActivation::None, true, true, true);
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
