// nn::Module: names and order, modes, placement, hooks and state dicts, on small hand-built trees.
#include <gtest/gtest.h>

#include "autograd/ops.h"
#include "nn/module.h"
#include "tests/testing.h"

namespace octet::nn {
namespace {

using octet::testing::random_tensor;
using octet::testing::throws_with;

// y = x·scale + shift, with a step counter buffer (persistent, integer) and a scratch buffer that
// is not saved.
class Affine : public Module {
 public:
  explicit Affine(int64_t n, uint64_t seed = 1) : Module("Affine") {
    scale = register_parameter("scale", random_tensor({n}, DType::f32, seed));
    shift = register_parameter("shift", random_tensor({n}, DType::f32, seed + 1));
    steps = register_buffer("steps", zeros({1}, DType::i64));
    scratch = register_buffer("scratch", zeros({n}), /*persistent=*/false);
  }
  Tensor forward(const Tensor& x) override { return x * scale + shift; }
  Tensor scale, shift, steps, scratch;
};

// Two Affines in sequence plus a parameter of its own, registered after the children on purpose:
// a module's own parameters still come first (PyTorch's order).
class Pair : public Module {
 public:
  explicit Pair(int64_t n) : Module("Pair") {
    first = register_module("first", std::make_shared<Affine>(n, 10));
    second = register_module("second", std::make_shared<Affine>(n, 20));
    gain = register_parameter("gain", random_tensor({1}, DType::f32, 30));
  }
  Tensor forward(const Tensor& x) override { return (*second)((*first)(x)) * gain; }
  std::shared_ptr<Affine> first, second;
  Tensor gain;
};

std::vector<std::string> names_of(const std::vector<NamedTensor>& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

TEST(Module, NamesAreDottedInRegistrationOrderOwnTensorsFirst) {
  Pair pair(3);
  EXPECT_EQ(names_of(pair.named_parameters()),
            (std::vector<std::string>{"gain", "first.scale", "first.shift", "second.scale", "second.shift"}));
  EXPECT_EQ(names_of(pair.named_parameters(/*recurse=*/false)), (std::vector<std::string>{"gain"}));
  EXPECT_EQ(names_of(pair.named_buffers()),
            (std::vector<std::string>{"first.steps", "first.scratch", "second.steps", "second.scratch"}));
  EXPECT_TRUE(pair.named_parameters()[1].second.is_same(pair.first->scale)) << "the registered tensor itself";
  EXPECT_EQ(pair.num_parameters(), 1 + 4 * 3);
  EXPECT_EQ(pair.parameters().size(), 5u);
  for (const Tensor& p : pair.parameters()) EXPECT_TRUE(p.requires_grad() && p.is_leaf());

  std::vector<std::string> module_names;
  for (const auto& [name, m] : pair.named_modules()) module_names.push_back(name + ":" + m->name());
  EXPECT_EQ(module_names, (std::vector<std::string>{":Pair", "first:Affine", "second:Affine"}));
  ASSERT_EQ(pair.named_children().size(), 2u);
  EXPECT_EQ(pair.named_children()[1].first, "second");
}

TEST(Module, ASharedChildIsListedOnce) {
  class Tied : public Module {
   public:
    Tied() : Module("Tied") {
      auto shared = std::make_shared<Affine>(2);
      register_module("a", shared);
      register_module("b", shared);
    }
  } tied;
  EXPECT_EQ(names_of(tied.named_parameters()), (std::vector<std::string>{"a.scale", "a.shift"}));
  EXPECT_EQ(tied.named_modules().size(), 2u);
}

// A weight tied across two modules (one tensor registered in each, as an embedding and an output
// projection share theirs): one parameter, listed once, whose gradient sums both uses, stepped once,
// and still one tensor after a dtype change. Registering a detached handle instead made two leaves
// over one storage, each with its own share of the gradient, which to() then split apart.
TEST(Module, AWeightTiedAcrossModulesIsOneParameter) {
  class Scale : public Module {
   public:
    explicit Scale(const Tensor& w) : Module("Scale") { weight = register_parameter("weight", w); }
    Tensor forward(const Tensor& x) override { return x * weight; }
    Tensor weight;
  };
  class TiedPair : public Module {
   public:
    TiedPair() : Module("TiedPair") {
      const Tensor w = random_tensor({4}, DType::f32, 5);
      a = register_module("a", std::make_shared<Scale>(w));
      b = register_module("b", std::make_shared<Scale>(w));
    }
    Tensor forward(const Tensor& x) override { return (*b)((*a)(x)); }
    std::shared_ptr<Scale> a, b;
  } tied;
  EXPECT_EQ(names_of(tied.named_parameters()), (std::vector<std::string>{"a.weight"}));
  const Tensor x = random_tensor({4}, DType::f32, 6);
  sum(tied(x)).backward();
  // d(x·w·w)/dw = x·w + w·x, both uses summed into the one gradient: 2·(x·w), exactly.
  const Tensor w0 = tied.a->weight.detach().clone();
  EXPECT_TRUE(octet::testing::same_bits(tied.a->weight.grad(), (x * w0) * 2.0));
  EXPECT_EQ(tied.b->weight.grad().data_ptr(), tied.a->weight.grad().data_ptr());
  tied.to(DType::f64);
  EXPECT_EQ(tied.a->weight.data_ptr(), tied.b->weight.data_ptr()) << "to() split the tied weight";
}

TEST(Module, RegistrationErrorsNameTheProblem) {
  class Bad : public Module {
   public:
    Bad() : Module("Bad") { register_parameter("w", ones({2})); }
    void add_param(const std::string& name) { register_parameter(name, ones({2})); }
    void add_child(const std::string& name, std::shared_ptr<Module> m) {
      register_module(name, std::move(m));
    }
  } bad;
  EXPECT_TRUE(throws_with([&] { bad.add_param("w"); }, {"Bad", "'w'", "exists already"}));
  EXPECT_TRUE(
      throws_with([&] { bad.add_child("w", std::make_shared<Affine>(2)); }, {"'w'", "exists already"}));
  EXPECT_TRUE(throws_with([&] { bad.add_param("a.b"); }, {"'a.b'", "no '.'"}));
  EXPECT_TRUE(throws_with([&] { bad.add_param(""); }, {"non-empty"}));
  EXPECT_TRUE(throws_with([&] { bad.add_child("c", nullptr); }, {"'c'", "null"}));
  EXPECT_TRUE(throws_with([&] { bad(ones({2})); }, {"Bad", "forward() is not implemented"}));
}

TEST(Module, RegisteredParametersAreLeavesEvenFromAGraph) {
  class FromOp : public Module {
   public:
    explicit FromOp(const Tensor& source) : Module("FromOp") { p = register_parameter("p", source * 2.0); }
    Tensor p;
  };
  Tensor source = random_tensor({3});
  source.requires_grad_();
  FromOp m(source);
  EXPECT_TRUE(m.p.is_leaf());
  EXPECT_TRUE(m.p.requires_grad());
}

TEST(Module, TrainAndEvalReachEveryDescendant) {
  Pair pair(2);
  EXPECT_TRUE(pair.is_training());
  pair.eval();
  for (const auto& [name, m] : pair.named_modules()) EXPECT_FALSE(m->is_training()) << name;
  pair.first->train();
  EXPECT_TRUE(pair.first->is_training());
  EXPECT_FALSE(pair.is_training());
  pair.train();
  for (const auto& [name, m] : pair.named_modules()) EXPECT_TRUE(m->is_training()) << name;
}

TEST(Module, ToDTypeConvertsFloatingTensorsInPlaceAndTheirGrads) {
  Pair pair(3);
  const std::vector<Tensor> held = pair.parameters();  // what an optimizer would hold
  const std::vector<double> before = pair.first->scale.to_vector<double>();
  sum(pair(random_tensor({4, 3}))).backward();
  ASSERT_TRUE(pair.first->scale.grad().defined());
  const std::vector<double> grad_before = pair.first->scale.grad().to_vector<double>();

  pair.to(DType::f64);
  for (const Tensor& p : held) EXPECT_EQ(p.dtype(), DType::f64);
  EXPECT_EQ(pair.first->scale.dtype(), DType::f64) << "the layer's own handle sees it";
  EXPECT_EQ(pair.first->scale.to_vector<double>(), before);
  EXPECT_TRUE(pair.first->scale.requires_grad());
  EXPECT_EQ(pair.first->scale.grad().dtype(), DType::f64);
  EXPECT_EQ(pair.first->scale.grad().to_vector<double>(), grad_before);
  EXPECT_EQ(pair.first->steps.dtype(), DType::i64) << "integer buffers keep their type";
  EXPECT_EQ(pair.first->scratch.dtype(), DType::f64);

  // It still trains: a forward in f64 reaches the converted parameters.
  pair.zero_grad();
  sum(pair(random_tensor({2, 3}, DType::f64))).backward();
  EXPECT_EQ(held[0].grad().dtype(), DType::f64);

  pair.to(Device::cpu());  // already there: nothing changes
  EXPECT_EQ(pair.first->scale.to_vector<double>(), before);
  EXPECT_TRUE(throws_with([&] { pair.to(DType::i32); }, {"Pair.to(i32)", "floating dtype"}));
}

TEST(Module, ZeroGradSetsGradsToNone) {
  Pair pair(2);
  sum(pair(random_tensor({3, 2}))).backward();
  for (const Tensor& p : pair.parameters()) ASSERT_TRUE(p.grad().defined());
  pair.zero_grad();
  for (const Tensor& p : pair.parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(Module, ApplyVisitsDescendantsBeforeTheModule) {
  Pair pair(2);
  std::vector<const Module*> order;
  pair.apply([&](Module& m) { order.push_back(&m); });
  EXPECT_EQ(order, (std::vector<const Module*>{pair.first.get(), pair.second.get(), &pair}));
}

TEST(Module, HooksRunInOrderAndMayReplaceInputAndOutput) {
  Affine affine(3);
  std::vector<std::string> calls;
  const Tensor x = random_tensor({2, 3}, DType::f32, 5), replacement = random_tensor({2, 3}, DType::f32, 6);
  affine.register_forward_pre_hook([&](Module& m, const Tensor&) {
    calls.push_back("pre1:" + m.name());
    return replacement;
  });
  affine.register_forward_pre_hook([&](Module&, const Tensor& input) {
    calls.push_back("pre2");
    EXPECT_TRUE(input.is_same(replacement)) << "the second pre-hook sees the first one's replacement";
    return Tensor();  // keep
  });
  const size_t doubling =
      affine.register_forward_hook([&](Module&, const Tensor& input, const Tensor& output) {
        calls.push_back("post1");
        EXPECT_TRUE(input.is_same(replacement)) << "forward hooks see the input forward() used";
        return output * 2.0;
      });
  affine.register_forward_hook([&](Module&, const Tensor&, const Tensor&) {
    calls.push_back("post2");
    return Tensor();
  });

  const Tensor y = affine(x);
  EXPECT_EQ(calls, (std::vector<std::string>{"pre1:Affine", "pre2", "post1", "post2"}));
  // Reference: 2·(replacement·scale + shift), element by element in double.
  const auto r = replacement.to_vector<double>(), s = affine.scale.to_vector<double>(),
             b = affine.shift.to_vector<double>();
  std::vector<double> expected(6);
  for (int i = 0; i < 6; ++i) expected[i] = 2 * (r[i] * s[i % 3] + b[i % 3]);
  EXPECT_TRUE(octet::testing::all_close(y, expected, 1e-6, 1e-6));

  affine.remove_hook(doubling);
  calls.clear();
  affine(x);
  EXPECT_EQ(calls, (std::vector<std::string>{"pre1:Affine", "pre2", "post2"}));
  EXPECT_TRUE(throws_with([&] { affine.remove_hook(doubling); }, {"remove_hook", "removed already"}));
}

TEST(Module, AHookMayRemoveItselfWhileRunning) {
  Affine affine(2);
  int calls = 0;
  size_t handle = 0;
  handle = affine.register_forward_pre_hook([&](Module& m, const Tensor&) {
    ++calls;
    m.remove_hook(handle);  // a one-shot hook, as FSDP uses
    return Tensor();
  });
  affine(ones({2}));
  affine(ones({2}));
  EXPECT_EQ(calls, 1);
}

TEST(Module, StateDictHoldsParametersAndPersistentBuffersDetached) {
  Pair pair(2);
  const StateDict state = pair.state_dict();
  std::vector<std::string> keys;
  for (const auto& [k, t] : state) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"first.scale", "first.shift", "first.steps", "gain",
                                            "second.scale", "second.shift", "second.steps"}));
  EXPECT_FALSE(state.at("gain").requires_grad());
  EXPECT_EQ(state.at("gain").storage(), pair.gain.storage()) << "a view, not a copy";
}

TEST(Module, LoadStateDictRoundTripsIntoAFreshModule) {
  Pair a(3), b(3);
  b.first->scale.fill_(0.0);  // make sure b starts different
  a.first->steps.fill_(7.0);
  const Tensor x = random_tensor({4, 3}, DType::f32, 9);
  const Module::LoadResult result = b.load_state_dict(a.state_dict());
  EXPECT_TRUE(result.missing.empty() && result.unexpected.empty());
  EXPECT_EQ(b(x).to_vector<float>(), a(x).to_vector<float>());
  EXPECT_EQ(b.first->steps.to_vector<int64_t>(), std::vector<int64_t>{7});
  EXPECT_FALSE(b.first->scale.storage() == a.first->scale.storage()) << "values are copied in";
  EXPECT_TRUE(b.first->scale.requires_grad());
}

TEST(Module, LoadStateDictErrorsNameKeysShapesAndTheFix) {
  Pair model(3);
  const std::vector<double> untouched = model.first->scale.to_vector<double>();

  StateDict wrong_shape = Pair(4).state_dict();
  EXPECT_TRUE(throws_with([&] { model.load_state_dict(wrong_shape); },
                          {"'first.scale'", "[4]", "[3]", "different configuration"}));

  StateDict wrong_dtype = Pair(3).state_dict();
  wrong_dtype["second.shift"] = wrong_dtype["second.shift"].to(DType::f64);
  EXPECT_TRUE(throws_with([&] { model.load_state_dict(wrong_dtype); },
                          {"'second.shift'", "f64", "f32", "model.to(f64)"}));

  StateDict missing_and_extra = Pair(3).state_dict();
  missing_and_extra.erase("gain");
  missing_and_extra.erase("first.steps");
  missing_and_extra["third.scale"] = ones({3});
  EXPECT_TRUE(
      throws_with([&] { model.load_state_dict(missing_and_extra); },
                  {"missing keys [first.steps, gain]", "unexpected keys [third.scale]", "strict = false"}));
  EXPECT_EQ(model.first->scale.to_vector<double>(), untouched) << "a failed load writes nothing";

  // Not strict: the matching keys load and the rest are reported.
  const Module::LoadResult result = model.load_state_dict(missing_and_extra, /*strict=*/false);
  EXPECT_EQ(result.missing, (std::vector<std::string>{"first.steps", "gain"}));
  EXPECT_EQ(result.unexpected, (std::vector<std::string>{"third.scale"}));
  EXPECT_EQ(model.first->scale.to_vector<double>(), missing_and_extra.at("first.scale").to_vector<double>());
  // A shape mismatch throws even when not strict.
  EXPECT_TRUE(throws_with([&] { model.load_state_dict(wrong_shape, false); }, {"'first.scale'"}));
}

TEST(ModuleList, NamesChildrenByIndex) {
  ModuleList list;
  list.push_back(std::make_shared<Affine>(2, 1));
  list.push_back(std::make_shared<Affine>(2, 3));
  EXPECT_EQ(list.size(), 2u);
  EXPECT_EQ(names_of(list.named_parameters()),
            (std::vector<std::string>{"0.scale", "0.shift", "1.scale", "1.shift"}));
  EXPECT_EQ(list[1]->name(), "Affine");
  int count = 0;
  for (const auto& m : list) count += m != nullptr;
  EXPECT_EQ(count, 2);
  EXPECT_TRUE(throws_with([&] { list[2]; }, {"ModuleList", "index 2", "2 modules"}));
}

TEST(Module, NamedModulesWorksForSharedAndStackModules) {
  auto owned = std::make_shared<Pair>(2);
  EXPECT_EQ(owned->named_modules()[0].second.get(), owned.get());
  const auto modules = owned->named_modules();
  EXPECT_EQ(owned.use_count(), 2) << "the list shares ownership of the root";
  Pair on_stack(2);
  EXPECT_EQ(on_stack.named_modules()[0].second.get(), &on_stack);
}

}  // namespace
}  // namespace octet::nn
