// Optimizer checkpoints: training k steps, saving, loading into a fresh optimizer over copies of the
// parameters and continuing must give the same bits as never stopping. Then what load_state_dict
// refuses, and that a refused load changes nothing.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/elementwise.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "optim/param_groups.h"
#include "optim/sgd.h"
#include "tests/testing.h"

namespace {

using namespace octet;
using octet::testing::random_tensor;
using octet::testing::throws_with;
using Named = std::vector<std::pair<std::string, Tensor>>;
using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(const Named&)>;

struct OptimizerCase {
  std::string name;
  MakeOptimizer make;
};
void PrintTo(const OptimizerCase& c, std::ostream* os) { *os << c.name; }

// A ViT-shaped parameter set: a matrix, a bias and a position embedding, plus one tensor that only
// gets gradients from step 2 on (so the saved state is partial at first).
Named make_params(DType dtype = DType::f32) {
  Named named = {{"blocks.0.fc.weight", random_tensor({4, 3}, dtype, 1)},
                 {"blocks.0.fc.bias", random_tensor({3}, dtype, 2)},
                 {"pos_embed", random_tensor({1, 2, 3}, dtype, 3)},
                 {"head.weight", random_tensor({2, 3}, dtype, 4)}};
  for (auto& [name, p] : named) p.requires_grad_();
  return named;
}

Named clone_params(const Named& named) {
  Named out;
  for (const auto& [name, p] : named) {
    Tensor c = p.detach().clone();
    c.requires_grad_();
    out.emplace_back(name, c);
  }
  return out;
}

// Gradient for step t: depends on the parameter (so the trajectory matters) and on t.
void set_grads(const Named& named, int64_t t) {
  for (size_t i = 0; i < named.size(); ++i) {
    Tensor p = named[i].second;
    if (i == 3 && t < 2) {
      p.set_grad(Tensor());
      continue;
    }
    const Tensor noise = random_tensor(p.shape(), p.dtype(), 1000 + 17 * static_cast<uint64_t>(t) + i);
    p.set_grad(kernels::add(kernels::mul_scalar(p.detach(), 0.5), noise));
  }
}

void train(optim::Optimizer& opt, const Named& named, int64_t from, int64_t to) {
  const optim::WarmupCosineSchedule schedule(0.05, 3, 12, 0.001);
  for (int64_t t = from; t < to; ++t) {
    set_grads(named, t);
    opt.set_lr(schedule.lr(t));
    opt.step();
  }
}

void expect_bitwise_equal(const Named& a, const Named& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].second.to_vector<double>(), b[i].second.to_vector<double>()) << a[i].first;
  }
}

class ResumeFromStateDict : public ::testing::TestWithParam<OptimizerCase> {};

TEST_P(ResumeFromStateDict, ContinuesBitwiseLikeAnUninterruptedRun) {
  const MakeOptimizer& make = GetParam().make;
  const Named init = make_params();
  for (int64_t k : {1, 5}) {
    const Named straight = clone_params(init);
    auto straight_opt = make(straight);
    train(*straight_opt, straight, 0, 10);

    const Named first = clone_params(init);
    auto first_opt = make(first);
    train(*first_opt, first, 0, k);
    const std::map<std::string, Tensor> saved = first_opt->state_dict();

    const Named resumed = clone_params(first);
    auto resumed_opt = make(resumed);
    resumed_opt->set_lr(123.0);  // overwritten by the load
    resumed_opt->load_state_dict(saved);
    EXPECT_EQ(resumed_opt->param_groups()[0].lr, first_opt->param_groups()[0].lr);
    train(*resumed_opt, resumed, k, 10);
    expect_bitwise_equal(resumed, straight);
  }
}

std::unique_ptr<optim::Optimizer> make_adamw(const Named& n) {
  return std::make_unique<optim::AdamW>(optim::weight_decay_groups(n, 0.05, 0.1), 0.05);
}
std::unique_ptr<optim::Optimizer> make_sgd_nesterov(const Named& n) {
  return std::make_unique<optim::SGD>(optim::weight_decay_groups(n, 0.05, 1e-3), 0.05, 0.9, 0.0, true);
}
std::unique_ptr<optim::Optimizer> make_plain_sgd(const Named& n) {
  return std::make_unique<optim::SGD>(optim::weight_decay_groups(n, 0.05, 0.0), 0.05);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ResumeFromStateDict,
                         ::testing::Values(OptimizerCase{"AdamW", make_adamw},
                                           OptimizerCase{"SgdNesterov", make_sgd_nesterov},
                                           OptimizerCase{"PlainSgd", make_plain_sgd}),
                         [](const auto& info) { return info.param.name; });

std::unique_ptr<optim::AdamW> trained_adamw(const Named& named, int64_t steps) {
  auto opt = std::make_unique<optim::AdamW>(optim::weight_decay_groups(named, 0.05, 0.1), 0.05);
  train(*opt, named, 0, steps);
  return opt;
}

TEST(StateDict, HoldsGroupsStepsAndMoments) {
  const Named named = make_params();
  auto opt = trained_adamw(named, 3);
  const auto sd = opt->state_dict();
  // weight_decay_groups: group 0 = bias and pos_embed (no decay), group 1 = the two matrices.
  EXPECT_EQ(sd.at("param_groups.0.num_params").item<int64_t>(), 2);
  EXPECT_EQ(sd.at("param_groups.1.num_params").item<int64_t>(), 2);
  EXPECT_EQ(sd.at("param_groups.0.weight_decay").item(), 0.0);
  EXPECT_EQ(sd.at("param_groups.1.weight_decay").item(), 0.1);
  EXPECT_EQ(sd.at("param_groups.1.lr").dtype(), DType::f64);
  EXPECT_EQ(sd.at("state.1.0.step").item<int64_t>(), 3);
  EXPECT_EQ(sd.at("state.1.1.step").item<int64_t>(), 1);  // head.weight: gradients from step 2 only
  EXPECT_EQ(sd.at("state.0.1.exp_avg_sq").shape(), Shape({1, 2, 3}));
  EXPECT_EQ(sd.at("state.0.1.exp_avg_sq").dtype(), DType::f32);
  EXPECT_EQ(sd.size(), 6u + 4u * 3u);
}

TEST(StateDict, LoadCopiesTheValuesIn) {
  const Named named = make_params();
  auto opt = trained_adamw(named, 2);
  auto sd = opt->state_dict();
  const Named other = clone_params(named);
  optim::AdamW fresh(optim::weight_decay_groups(other, 0.05, 0.1), 0.05);
  fresh.load_state_dict(sd);
  const std::vector<double> loaded = fresh.state_dict().at("state.1.0.exp_avg").to_vector<double>();
  sd.at("state.1.0.exp_avg").fill_(7.0);
  EXPECT_EQ(fresh.state_dict().at("state.1.0.exp_avg").to_vector<double>(), loaded);
}

// A load that fails must leave the optimizer as it was.
void expect_refused(optim::Optimizer& opt, const std::map<std::string, Tensor>& sd,
                    std::initializer_list<std::string> parts) {
  // Values, not the tensors: state_dict() shares storage with the optimizer.
  const auto values = [&] {
    std::map<std::string, std::vector<double>> out;
    for (const auto& [key, t] : opt.state_dict()) out[key] = t.to_vector<double>();
    return out;
  };
  const auto before = values();
  EXPECT_TRUE(throws_with([&] { opt.load_state_dict(sd); }, parts));
  EXPECT_EQ(values(), before);
}

TEST(StateDict, LoadRefusesAnotherLayoutNamingTheFix) {
  const Named named = make_params();
  const auto sd = trained_adamw(named, 3)->state_dict();

  Named other = clone_params(named);
  optim::AdamW one_group(std::vector<Tensor>{other[0].second, other[1].second}, 0.1);
  expect_refused(one_group, sd, {"AdamW.load_state_dict", "2 parameter groups of sizes [2, 2]", "[2]",
                                 "same parameter groups"});

  Named transposed = clone_params(named);
  transposed[0].second = random_tensor({3, 4}).requires_grad_();
  auto target = trained_adamw(transposed, 1);
  expect_refused(*target, sd, {"state.1.0.exp_avg", "f32[4, 3]", "f32[3, 4]", "same parameter groups"});

  const Named doubles = make_params(DType::f64);
  auto f64_target = trained_adamw(doubles, 1);
  expect_refused(*f64_target, sd, {"AdamW.load_state_dict", "state.0.0.exp_avg", "f32[3]", "f64[3]"});
}

TEST(StateDict, LoadRefusesForeignOrIncompleteState) {
  const Named named = make_params();
  const auto sd = trained_adamw(named, 3)->state_dict();
  Named other = clone_params(named);

  optim::SGD sgd(optim::weight_decay_groups(other, 0.1, 0.0), 0.1, 0.9);
  expect_refused(sgd, sd,
                 {"SGD.load_state_dict", "unexpected key 'state.0.0.exp_avg'", "step, momentum_buffer"});

  optim::AdamW adamw(optim::weight_decay_groups(other, 0.1, 0.0), 0.1);
  auto missing = sd;
  missing.erase("state.1.0.exp_avg_sq");
  expect_refused(adamw, missing, {"state.1.0.exp_avg_sq is missing", "exp_avg, exp_avg_sq"});
  auto no_step = sd;
  no_step.erase("state.0.0.step");
  expect_refused(adamw, no_step, {"state.0.0.step is missing", "whole dict"});
  auto stray = sd;
  stray["model.weight"] = random_tensor({2});
  expect_refused(adamw, stray, {"unexpected key 'model.weight'"});
  auto bad_step = sd;
  bad_step["state.0.0.step"] = full(Shape{}, 2.0, DType::f32);
  expect_refused(adamw, bad_step, {"state.0.0.step", "i64 scalar"});
  auto no_lr = sd;
  no_lr.erase("param_groups.1.lr");
  expect_refused(adamw, no_lr, {"param_groups.1.lr", "missing"});
}

}  // namespace
