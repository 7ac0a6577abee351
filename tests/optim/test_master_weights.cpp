// bf16 training through f32 master weights: the optimizer keeps an f32 copy of every bf16
// parameter, updates it, and writes bf16(master) back into the parameter. Checked here on the CPU
// (the exact emulation of the GPU path): the bf16 run tracks the f32 run, the parameter always
// equals its rounded master, and a save/load round trip continues bit for bit.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/elementwise.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/sgd.h"
#include "tests/testing.h"

namespace {

using namespace octet;
using octet::testing::random_tensor;
using octet::testing::relative_error_to_reference;
using octet::testing::throws_with;
using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

std::unique_ptr<optim::Optimizer> make_adamw(std::vector<Tensor> params) {
  return std::make_unique<optim::AdamW>(std::move(params), 0.01, 0.9, 0.999, 1e-8, 0.05);
}
std::unique_ptr<optim::Optimizer> make_sgd(std::vector<Tensor> params) {
  return std::make_unique<optim::SGD>(std::move(params), 0.05, 0.9, 0.0, /*nesterov=*/false, 1e-4);
}

// Parameters with values that bf16 holds exactly, so both precisions start from the same point.
std::vector<Tensor> make_params(DType dtype) {
  std::vector<Tensor> params = {random_tensor({33, 7}, DType::bf16, 1).to(dtype),
                                random_tensor({7}, DType::bf16, 2).to(dtype),
                                random_tensor({1, 5, 3}, DType::bf16, 3).to(dtype)};
  for (Tensor& p : params) p.requires_grad_();
  return params;
}

std::vector<Tensor> targets() {
  return {random_tensor({33, 7}, DType::f32, 11), random_tensor({7}, DType::f32, 12),
          random_tensor({1, 5, 3}, DType::f32, 13)};
}

// The gradient of ½·|p - target|², computed in f32 and handed over in the parameter's dtype (as
// a bf16 backward would produce it).
void set_quadratic_grads(const std::vector<Tensor>& params, const std::vector<Tensor>& target) {
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor p = params[i];
    const Tensor g = kernels::sub(p.detach().to(DType::f32), target[i]);
    p.set_grad(g.to(p.dtype()));
  }
}

void expect_param_is_rounded_master(const optim::Optimizer& opt, const std::vector<Tensor>& params) {
  const std::map<std::string, Tensor> state = opt.state_dict();
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& master = state.at("state.0." + std::to_string(i) + ".master");
    ASSERT_EQ(master.dtype(), DType::f32);
    EXPECT_EQ(params[i].dtype(), DType::bf16);
    EXPECT_EQ(params[i].to_vector<float>(), master.to(DType::bf16).to_vector<float>()) << "parameter " << i;
  }
}

struct OptimizerCase {
  const char* name;
  MakeOptimizer make;
};
void PrintTo(const OptimizerCase& c, std::ostream* os) { *os << c.name; }

class MasterWeights : public ::testing::TestWithParam<OptimizerCase> {};

TEST_P(MasterWeights, Bf16ParametersTrackF32TrainingAndEqualTheirRoundedMaster) {
  const std::vector<Tensor> target = targets();
  const std::vector<Tensor> p32 = make_params(DType::f32), p16 = make_params(DType::bf16);
  auto opt32 = GetParam().make(p32);
  auto opt16 = GetParam().make(p16);
  for (int step = 0; step < 40; ++step) {
    set_quadratic_grads(p32, target), set_quadratic_grads(p16, target);
    opt32->step(), opt16->step();
    expect_param_is_rounded_master(*opt16, p16);
  }
  const std::map<std::string, Tensor> state16 = opt16->state_dict();
  for (size_t i = 0; i < p32.size(); ++i) {
    // The master follows the f32 run up to bf16 rounding of the gradients; the bf16 parameter adds
    // its own rounding (2^-9 relative) on top.
    EXPECT_LT(relative_error_to_reference(state16.at("state.0." + std::to_string(i) + ".master"), p32[i]), 5e-3) << i;
    EXPECT_LT(relative_error_to_reference(p16[i], p32[i]), 1e-2) << i;
  }
  // The state itself is f32, not the parameter's dtype.
  for (const auto& [key, value] : state16) {
    if (key.rfind("state.", 0) == 0 && key.find(".step") == std::string::npos) {
      EXPECT_EQ(value.dtype(), DType::f32) << key;
    }
  }
}

TEST_P(MasterWeights, SaveAndLoadContinueBitForBit) {
  const std::vector<Tensor> target = targets();
  const std::vector<Tensor> straight = make_params(DType::bf16), resumed = make_params(DType::bf16);
  auto uninterrupted = GetParam().make(straight);
  auto first_half = GetParam().make(resumed);
  for (int step = 0; step < 7; ++step) {
    set_quadratic_grads(straight, target), set_quadratic_grads(resumed, target);
    uninterrupted->step(), first_half->step();
  }
  // A fresh optimizer over fresh parameters, as a resumed process has: the weights come from the
  // model checkpoint, the masters from the optimizer's.
  std::map<std::string, Tensor> saved;
  for (const auto& [key, value] : first_half->state_dict()) saved[key] = value.clone();
  std::vector<Tensor> reloaded;
  for (const Tensor& p : resumed) {
    Tensor c = p.detach().clone();
    c.requires_grad_();
    reloaded.push_back(c);
  }
  auto second_half = GetParam().make(reloaded);
  second_half->load_state_dict(saved);
  for (int step = 0; step < 6; ++step) {
    set_quadratic_grads(straight, target), set_quadratic_grads(reloaded, target);
    uninterrupted->step(), second_half->step();
  }
  const std::map<std::string, Tensor> a = uninterrupted->state_dict(), b = second_half->state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [key, value] : a) {
    EXPECT_EQ(value.to_vector<double>(), b.at(key).to_vector<double>()) << key;
  }
  for (size_t i = 0; i < straight.size(); ++i) {
    EXPECT_EQ(straight[i].to_vector<float>(), reloaded[i].to_vector<float>()) << "parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, MasterWeights,
                         ::testing::Values(OptimizerCase{"AdamW", make_adamw}, OptimizerCase{"SGD", make_sgd}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(MasterWeightsLoad, AMasterForAnF32ParameterOrAMissingMasterIsRefused) {
  const std::vector<Tensor> target = targets();
  const std::vector<Tensor> p16 = make_params(DType::bf16);
  optim::AdamW opt16(p16, 0.01);
  set_quadratic_grads(p16, target);
  opt16.step();
  const std::map<std::string, Tensor> with_masters = opt16.state_dict();

  const std::vector<Tensor> p32 = make_params(DType::f32);
  optim::AdamW opt32(p32, 0.01);
  EXPECT_TRUE(throws_with([&] { opt32.load_state_dict(with_masters); },
                          {"AdamW.load_state_dict", "state.0.0.master", "needs none", "--precision"}));

  std::map<std::string, Tensor> without = with_masters;
  without.erase("state.0.1.master");
  optim::AdamW other16(make_params(DType::bf16), 0.01);
  EXPECT_TRUE(throws_with([&] { other16.load_state_dict(without); },
                          {"AdamW.load_state_dict", "state.0.1.master is missing", "bf16[7]"}));
  EXPECT_EQ(other16.step_count(0, 1), 0);  // a refused load changes nothing
}

TEST(MasterWeightsClip, ClipGradNormOverBf16GradientsScalesThemAll) {
  const std::vector<Tensor> params = make_params(DType::bf16);
  std::vector<Tensor> big;
  for (const Tensor& p : params) big.push_back(kernels::mul_scalar(p.detach().to(DType::f32), 10.0));
  set_quadratic_grads(params, big);
  double before = 0;
  for (const Tensor& p : params) {
    for (double g : p.grad().to_vector<double>()) before += g * g;
  }
  const double norm = optim::clip_grad_norm_(params, 1.0);
  EXPECT_NEAR(norm, std::sqrt(before), 1e-6 * std::sqrt(before));
  double after = 0;
  for (const Tensor& p : params) {
    EXPECT_EQ(p.grad().dtype(), DType::bf16);
    for (double g : p.grad().to_vector<double>()) after += g * g;
  }
  EXPECT_NEAR(std::sqrt(after), 1.0, 1e-2);
}

}  // namespace

// A bf16 parameter written between steps by someone else (weights loaded into the model, a head
// re-initialised) keeps that value, as it would in PyTorch: the next step starts from it, not from the
// master the optimizer kept. Plain SGD at lr 0.5 on a gradient of ones: after the write, the step
// gives bf16(f32(x) - 0.5), where the old master would have given the first step's values minus 0.5.
TEST(MasterWeights, AParameterWrittenBetweenStepsKeepsTheWrittenValue) {
  Tensor p = random_tensor({6, 5}, DType::bf16, 21).requires_grad_();
  optim::SGD sgd({p}, 0.5);
  p.set_grad(full({6, 5}, 1.0, DType::bf16));
  sgd.step();
  const Tensor x = random_tensor({6, 5}, DType::bf16, 22, 4.0);
  p.detach().copy_(x);
  p.set_grad(full({6, 5}, 1.0, DType::bf16));
  sgd.step();
  const Tensor want = kernels::sub(x.to(DType::f32), full({6, 5}, 0.5)).to(DType::bf16);
  EXPECT_TRUE(octet::testing::same_bits(p.detach(), want));
  EXPECT_TRUE(octet::testing::same_bits(sgd.state_dict().at("state.0.0.master"), kernels::sub(x.to(DType::f32),
                                                                                                full({6, 5}, 0.5))));
}

// Writing the bytes a parameter already holds (a checkpoint's model loaded after its optimizer state)
// keeps the master and the bits bf16 cannot hold: the run continues exactly as without the write.
TEST(MasterWeights, RewritingTheSameBytesKeepsTheMaster) {
  auto run = [](bool rewrite) {
    const std::vector<Tensor> params = make_params(DType::bf16);
    std::unique_ptr<optim::Optimizer> opt = make_adamw(params);
    const std::vector<Tensor> target = targets();
    for (int step = 0; step < 3; ++step) {
      if (rewrite && step == 1) {
        for (const Tensor& p : params) p.detach().copy_(p.detach().clone());
      }
      set_quadratic_grads(params, target);
      opt->step();
    }
    return opt->state_dict();
  };
  const std::map<std::string, Tensor> plain = run(false), rewritten = run(true);
  for (const auto& [name, t] : plain) EXPECT_TRUE(octet::testing::same_bits(rewritten.at(name), t)) << name;
}
