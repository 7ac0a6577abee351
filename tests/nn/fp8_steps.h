#pragma once
// Helpers for the FP8 tests that run a layer or a block through training steps and compare two runs
// bit for bit (tests/nn/test_fp8.cpp, tests/nn/test_fp8_producers.cpp).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "autograd/ops.h"
#include "nn/fp8.h"
#include "nn/layers.h"
#include "tests/testing.h"

namespace octet::nn::fp8_testing {

using octet::testing::random_tensor;
using octet::testing::same_bits;

inline std::shared_ptr<Linear> make_linear(int64_t in, int64_t out, DType dtype, uint64_t seed) {
  auto layer = std::make_shared<Linear>(in, out);
  layer->weight.copy_(random_tensor({out, in}, DType::f32, seed, 0.1));
  layer->bias.copy_(random_tensor({out}, DType::f32, seed + 1, 0.1));
  layer->to(dtype);
  return layer;
}

// One forward in a scope and one backward of Σ y·r; returns y.
inline Tensor step(Module& layer, const Tensor& x, const Tensor& r, const Fp8Recipe& recipe, AmaxReducer reducer = nullptr) {
  Tensor y;
  {
    Fp8Autocast fp8(true, recipe, std::move(reducer));
    y = layer(x);
  }
  sum(mul(y, r)).backward();
  return y;
}

// What two FP8 steps leave: every output and gradient and every layer's FP8 state, by name, and how
// many fused casts ran.
struct Fp8Steps {
  std::map<std::string, Tensor> tensors;
  int64_t fused_casts = 0;
};

inline void keep_fp8_state(Fp8Steps& out, Module& m, const std::string& prefix) {
  for (const auto& [name, t] : fp8_state_dict(m)) out.tensors[prefix + name] = t.clone();
}

inline void keep_grads(Fp8Steps& out, Module& m, const std::string& prefix) {
  for (const auto& [name, p] : m.named_parameters()) out.tensors[prefix + name + ".grad"] = p.grad().clone();
}

inline void expect_same_steps(const Fp8Steps& fused, const Fp8Steps& unfused) {
  ASSERT_EQ(fused.tensors.size(), unfused.tensors.size());
  for (const auto& [name, t] : unfused.tensors) {
    ASSERT_TRUE(fused.tensors.count(name)) << name;
    EXPECT_TRUE(same_bits(fused.tensors.at(name), t)) << name;
  }
  EXPECT_GT(fused.fused_casts, 0) << "the fused path should have run";
  EXPECT_EQ(unfused.fused_casts, 0) << "the unfused path should have run";
}

}  // namespace octet::nn::fp8_testing
