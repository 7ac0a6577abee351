#pragma once
// How far an FP8 training step on the CPU moves when its FP8 GEMMs round the way a GPU's may: the
// yardstick for comparing a GPU step with the CPU emulation (tests/cuda/test_cuda_fp8_step.cpp,
// test_cuda_fp8_producers.cpp).
//
// Why a yardstick and not a fixed bound. The emulation computes what the GPU computes, with f32 sums;
// Hopper's FP8 tensor cores keep about 14 bits while they accumulate (tests/cuda/fp8_bound.h), so an
// FP8 GEMM's output lies up to ~2^-13 from the f32 result, and where the exact value is that close to
// a bf16 rounding boundary the bf16 output differs by one ulp: with ulps of 2^-8..2^-7 relative, a few
// percent of the elements (2·2^-13 / 2^-7.5 ≈ 4%). The next FP8 cast turns such an element into
// another E4M3 or E5M2 code about once in 16 or 32 times, and a code step is 6-25% of the element;
// those flips feed the next GEMMs, and so on through every layer of forward and backward. So the two
// devices' gradients part by far more than one rounding: on the small ViT of these tests, flipping
// each FP8 Linear's bf16 output by one ulp with probability 3% (in CPU runs, against the same CPU run
// without flips) moves the gradients by 8-14% norm-wise, the amount the first GPU run showed
// (2026-11-27: 8-14%); even a probability of 1e-4 moves them by 4-6%. In bf16 alone the same flips
// move them by under 1%. The step is ill-conditioned in FP8, not wrong.
//
// So: run the CPU step again with such flips, under a few seeds, and take the largest norm-wise change
// of each tensor as its sensitivity. A GPU result may then differ from the CPU's by at most a small
// multiple of that (and never needs less than the old fixed bound). A real defect -- a wrong scale, a
// transposed operand, the other format, a dropped bias -- moves a tensor by O(1), far beyond.
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "tests/testing.h"

namespace octet::testing {

// The probability with which each FP8 Linear's bf16 output element moves by one ulp (see above).
inline constexpr double kFp8GemmFlipProbability = 0.03;
// How many perturbed runs the sensitivity takes the largest change over.
inline constexpr int kFp8SensitivitySeeds = 3;
// A GPU tensor may differ from the CPU's by this many times its sensitivity.
inline constexpr double kFp8SensitivityMultiple = 2.0;

// Registers a forward hook on every Linear of `model` whose name starts with `prefix` (the FP8 ones):
// each element of its output moves up or down by one ulp of its dtype with probability
// `probability`, drawn from a generator seeded with `seed` (the hooks keep their own stream). The
// hooks make the fused FP8 producers run unfused, which gives the same bits (their own tests).
inline void perturb_linear_outputs(nn::Module& model, const std::string& prefix, double probability, uint64_t seed) {
  auto gen = std::make_shared<Generator>(seed);
  for (const auto& [name, m] : model.named_modules()) {
    if (name.rfind(prefix, 0) != 0 || std::dynamic_pointer_cast<nn::Linear>(m) == nullptr) continue;
    m->register_forward_hook([gen, probability](nn::Module&, const Tensor&, const Tensor& y) {
      const Tensor y32 = y.detach().to(DType::f32).to(Device::cpu());
      const Tensor u = rand(y.shape(), *gen, DType::f64);
      Tensor step = zeros(y.shape(), DType::f32);
      const double* pu = u.data<double>();
      const float* py = y32.data<float>();
      float* ps = step.data<float>();
      const int mantissa_bits = y.dtype() == DType::f32 ? 24 : y.dtype() == DType::f16 ? 11 : 8;
      for (int64_t i = 0; i < y.numel(); ++i) {
        if (pu[i] >= probability || py[i] == 0.0f || !std::isfinite(py[i])) continue;
        int exponent = 0;
        std::frexp(py[i], &exponent);
        const float ulp = std::ldexp(1.0f, exponent - mantissa_bits);
        ps[i] = pu[i] < probability / 2 ? ulp : -ulp;
      }
      // y + step is exact in f32 and lands on the neighbouring value of y's dtype; the gradient
      // passes through unchanged.
      return add(y, step.to(y.dtype()).to(y.device()));
    });
  }
}

// For each named tensor, the largest norm-wise change over `seeds` runs of `run(seed)` against
// `reference` (seed 0 is never passed: it stands for the unperturbed run).
template <class Run>
std::map<std::string, double> sensitivity(const std::map<std::string, Tensor>& reference, Run&& run,
                                          int seeds = kFp8SensitivitySeeds) {
  std::map<std::string, double> worst;
  for (int s = 1; s <= seeds; ++s) {
    const std::map<std::string, Tensor> perturbed = run(static_cast<uint64_t>(s));
    for (const auto& [name, t] : reference) {
      const auto it = perturbed.find(name);
      EXPECT_TRUE(it != perturbed.end()) << name;
      if (it == perturbed.end()) continue;
      worst[name] = std::max(worst[name], relative_error(it->second, t));
    }
  }
  return worst;
}

}  // namespace octet::testing
