// LoRA: the wrapped layer's gradients against finite differences, its start equal to the base, that
// training moves the adapters and never the frozen weights, the adapter-only state dict, and the
// errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "models/vit.h"
#include "nn/lora.h"
#include "nn/safetensors.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "tests/testing.h"

namespace octet::nn {
namespace {

using octet::testing::random_tensor;
using octet::testing::throws_with;

// Bytes of a tensor, for bit-for-bit comparisons (f32 on the host).
std::vector<float> values(const Tensor& t) { return t.detach().to_vector<float>(); }

std::vector<std::string> keys_of(const StateDict& state) {
  std::vector<std::string> out;
  for (const auto& [key, t] : state) out.push_back(key);
  return out;
}

std::vector<Tensor> trainable(const Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

double mse(const Tensor& prediction, const Tensor& target) {
  const Tensor diff = prediction - target;
  return mean(diff * diff).item();
}

TEST(LoRALinear, NamesShapesInitAndFreezing) {
  Generator gen(5);
  auto base = std::make_shared<Linear>(12, 7);
  LoRALinear lora(base, {.rank = 3, .alpha = 6, .generator = &gen});
  std::vector<std::pair<std::string, Shape>> named;
  for (const auto& [name, p] : lora.named_parameters()) named.emplace_back(name, p.shape());
  EXPECT_EQ(named, (std::vector<std::pair<std::string, Shape>>{{"base_layer.weight", Shape{7, 12}},
                                                               {"base_layer.bias", Shape{7}},
                                                               {"lora_A.weight", Shape{3, 12}},
                                                               {"lora_B.weight", Shape{7, 3}}}));
  EXPECT_EQ(lora.rank, 3);
  EXPECT_DOUBLE_EQ(lora.scaling, 2.0);
  EXPECT_TRUE(lora.base_layer.get() == base.get()) << "the Linear itself is wrapped, not a copy";
  EXPECT_FALSE(base->weight.requires_grad());
  EXPECT_FALSE(base->bias.requires_grad());
  EXPECT_TRUE(lora.lora_A->weight.requires_grad());
  EXPECT_TRUE(lora.lora_B->weight.requires_grad());
  EXPECT_FALSE(lora.lora_A->fp8_allowed || lora.lora_B->fp8_allowed);

  // A: uniform in ±1/sqrt(in), and spread over that range (not, say, left at zero or a constant).
  const double bound = 1.0 / std::sqrt(12.0);
  double lo = 1, hi = -1;
  for (float a : values(lora.lora_A->weight)) {
    EXPECT_LE(std::abs(a), bound);
    lo = std::min(lo, static_cast<double>(a));
    hi = std::max(hi, static_cast<double>(a));
  }
  EXPECT_LT(lo, -0.5 * bound);
  EXPECT_GT(hi, 0.5 * bound);
  for (float b : values(lora.lora_B->weight)) EXPECT_EQ(b, 0.0f);

  // The same generator state gives the same A.
  Generator again(5);
  LoRALinear twin(std::make_shared<Linear>(12, 7), {.rank = 3, .alpha = 6, .generator = &again});
  EXPECT_EQ(values(twin.lora_A->weight), values(lora.lora_A->weight));
}

TEST(LoRALinear, StartsEqualToTheBaseExactly) {
  auto base = std::make_shared<Linear>(9, 5);
  const Tensor x = random_tensor({4, 3, 9}, DType::f32, 7);
  const std::vector<float> expected = values((*base)(x));
  LoRALinear lora(base, {.rank = 2, .alpha = 16});
  EXPECT_EQ(values(lora(x)), expected) << "B = 0: the update is exactly zero";
}

TEST(LoRALinear, GradcheckInputAndAdapters) {
  auto base = std::make_shared<Linear>(5, 4);
  LoRALinear lora(base, {.rank = 2, .alpha = 3});
  lora.to(DType::f64);
  base->weight.copy_(random_tensor({4, 5}, DType::f64, 1, 0.5));
  base->bias.copy_(random_tensor({4}, DType::f64, 2, 0.5));
  lora.lora_A->weight.copy_(random_tensor({2, 5}, DType::f64, 3, 0.5));
  lora.lora_B->weight.copy_(random_tensor({4, 2}, DType::f64, 4, 0.5));  // non-zero, or A's gradient is zero
  Tensor x = random_tensor({3, 2, 5}, DType::f64, 5);
  x.requires_grad_();
  const auto result = autograd::gradcheck([&lora](const std::vector<Tensor>& in) { return lora(in[0]); },
                                          {x, lora.lora_A->weight, lora.lora_B->weight});
  EXPECT_TRUE(result) << result.message;

  // And the forward against the formula: base(x) + (alpha / r)·(x·Aᵀ)·Bᵀ.
  const Tensor expected = linear(x, base->weight, base->bias) +
                          matmul(matmul(x.detach(), lora.lora_A->weight.detach(), false, true),
                                 lora.lora_B->weight.detach(), false, true) * 1.5;
  EXPECT_TRUE(octet::testing::all_close(lora(x), expected, 1e-12, 1e-12));
}

TEST(LoRALinear, DropoutTouchesOnlyTheAdapterPath) {
  Generator gen(11);
  auto base = std::make_shared<Linear>(16, 16);
  LoRALinear lora(base, {.rank = 4, .alpha = 4, .dropout = 0.5, .generator = &gen});
  const Tensor x = random_tensor({8, 16}, DType::f32, 12);
  EXPECT_EQ(values(lora(x)), values((*base)(x))) << "B = 0: dropout on the adapter leaves the base output";

  lora.lora_B->weight.copy_(random_tensor({16, 4}, DType::f32, 13));
  lora.eval();
  const std::vector<float> eval_out = values(lora(x));
  EXPECT_EQ(values(lora(x)), eval_out) << "no dropout in eval mode";
  lora.train();
  const std::vector<float> train_out = values(lora(x));
  EXPECT_NE(train_out, eval_out) << "dropout is active on the adapter's input in training";
}

TEST(LoRALinear, TrainingMovesTheAdaptersAndNeverTheBase) {
  for (const bool use_adamw : {false, true}) {
    SCOPED_TRACE(use_adamw ? "AdamW" : "SGD");
    Generator gen(21);
    auto base = std::make_shared<Linear>(8, 6);
    LoRALinear lora(base, {.rank = 2, .alpha = 4, .generator = &gen});
    const std::vector<float> base_weight = values(base->weight), base_bias = values(base->bias);
    const std::vector<float> a0 = values(lora.lora_A->weight), b0 = values(lora.lora_B->weight);
    // The target is the base plus a rank-1 change, which a rank-2 adapter can fit.
    const Tensor x = random_tensor({32, 8}, DType::f32, 22);
    const Tensor u = random_tensor({6, 1}, DType::f32, 23, 0.5), v = random_tensor({1, 8}, DType::f32, 24, 0.5);
    const Tensor target = ((*base)(x) + matmul(x, matmul(u, v), false, true)).detach();

    const std::vector<Tensor> params = trainable(lora);
    ASSERT_EQ(params.size(), 2u) << "only A and B train";
    std::unique_ptr<optim::Optimizer> optimizer;
    if (use_adamw) {
      optimizer = std::make_unique<optim::AdamW>(params, 0.02);
    } else {
      optimizer = std::make_unique<optim::SGD>(params, 0.2, /*momentum=*/0.9);
    }
    const double initial = mse(lora(x), target);
    for (int step = 0; step < 40; ++step) {
      optimizer->zero_grad();
      const Tensor diff = lora(x) - target;
      mean(diff * diff).backward();
      optimizer->step();
    }
    const double final_loss = mse(lora(x), target);
    EXPECT_LT(final_loss, 0.1 * initial) << "initial " << initial << ", final " << final_loss;
    EXPECT_EQ(values(base->weight), base_weight) << "the frozen weight is bit-for-bit unchanged";
    EXPECT_EQ(values(base->bias), base_bias);
    EXPECT_FALSE(base->weight.grad().defined()) << "frozen parameters get no gradient";
    EXPECT_NE(values(lora.lora_A->weight), a0);
    EXPECT_NE(values(lora.lora_B->weight), b0);
  }
}

TEST(LoRALinear, FollowsTheBaseDtype) {
  auto base = std::make_shared<Linear>(6, 6);
  base->to(DType::f64);
  LoRALinear lora(base, {.rank = 2});
  EXPECT_EQ(lora.lora_A->weight.dtype(), DType::f64);
  EXPECT_EQ(lora.lora_B->weight.dtype(), DType::f64);
  EXPECT_EQ(lora(random_tensor({2, 6}, DType::f64, 3)).dtype(), DType::f64);
}

TEST(LoRALinear, ErrorsNameTheProblem) {
  auto base = std::make_shared<Linear>(10, 4);
  EXPECT_TRUE(throws_with([&] { LoRALinear(base, {.rank = 0}); }, {"rank 0", "at least 1", "min(in, out) = 4"}));
  EXPECT_TRUE(throws_with([&] { LoRALinear(base, {.rank = -2}); }, {"rank -2"}));
  EXPECT_TRUE(throws_with([&] { LoRALinear(base, {.rank = 5}); }, {"rank 5", "Linear(10 -> 4)", "min(in, out) = 4"}));
  EXPECT_TRUE(throws_with([&] { LoRALinear(base, {.rank = 2, .alpha = 0}); }, {"alpha", "positive", "got 0"}));
  EXPECT_TRUE(throws_with([&] { LoRALinear(base, {.rank = 2, .alpha = -1}); }, {"alpha", "got -1"}));
  EXPECT_TRUE(throws_with([&] { LoRALinear(base, {.rank = 2, .dropout = 1}); }, {"dropout", "[0, 1)"}));
  EXPECT_TRUE(throws_with([&] { LoRALinear(nullptr, {.rank = 2}); }, {"base Linear is null"}));
  EXPECT_TRUE(base->weight.requires_grad()) << "a rejected wrap leaves the base as it was";
  EXPECT_TRUE(throws_with([&] { lora_state_dict(*base); }, {"lora_state_dict", "no LoRA adapter", "adapt it first"}));
}

TEST(LoRAStateDict, HoldsOnlyTheAdaptersAndNamedExtras) {
  auto base = std::make_shared<Linear>(6, 5);
  LoRALinear lora(base, {.rank = 2});
  EXPECT_EQ(keys_of(lora_state_dict(lora)), (std::vector<std::string>{"lora_A.weight", "lora_B.weight"}));
  EXPECT_EQ(keys_of(lora_state_dict(lora, {"bias"})),
            (std::vector<std::string>{"base_layer.bias", "lora_A.weight", "lora_B.weight"}));
  EXPECT_TRUE(throws_with([&] { lora_state_dict(lora, {"ias"}); }, {"lora_state_dict", "'ias'", "base_layer.bias"}))
      << "suffixes match at a name boundary";

  EXPECT_TRUE(is_lora_parameter_name("lora_A.weight"));
  EXPECT_TRUE(is_lora_parameter_name("blocks.0.attn.qkv.lora_B.weight"));
  EXPECT_FALSE(is_lora_parameter_name("blocks.0.attn.qkv.weight"));
  EXPECT_FALSE(is_lora_parameter_name("xlora_A.weight"));
}

TEST(LoRAStateDict, RoundTripAndMismatches) {
  Generator gen(31);
  LoRALinear trained(std::make_shared<Linear>(6, 5), {.rank = 2, .generator = &gen});
  trained.lora_B->weight.copy_(random_tensor({5, 2}, DType::f32, 32));
  const StateDict saved = lora_state_dict(trained);

  // Same base weights, fresh adapters: loading the adapter file makes the outputs equal.
  auto base = std::make_shared<Linear>(6, 5);
  base->load_state_dict({{"weight", trained.base_layer->weight.clone()}, {"bias", trained.base_layer->bias.clone()}});
  LoRALinear restored(base, {.rank = 2});
  const Tensor x = random_tensor({3, 6}, DType::f32, 33);
  EXPECT_NE(values(restored(x)), values(trained(x)));
  load_lora_state_dict(restored, saved);
  EXPECT_EQ(values(restored(x)), values(trained(x)));
  EXPECT_EQ(values(restored.lora_A->weight), values(trained.lora_A->weight));

  StateDict missing = saved;
  missing.erase("lora_B.weight");
  EXPECT_TRUE(throws_with([&] { load_lora_state_dict(restored, missing); },
                          {"load_lora_state_dict", "missing keys [lora_B.weight]"}));
  StateDict unexpected = saved;
  unexpected.emplace("base_layer.weight", trained.base_layer->weight.clone());
  EXPECT_TRUE(throws_with([&] { load_lora_state_dict(restored, unexpected); },
                          {"unexpected keys [base_layer.weight]"}));
  LoRALinear other_rank(std::make_shared<Linear>(6, 5), {.rank = 3});
  const std::vector<float> before = values(other_rank.lora_A->weight);
  EXPECT_TRUE(throws_with([&] { load_lora_state_dict(other_rank, saved); }, {"lora_A.weight", "shape"}));
  EXPECT_EQ(values(other_rank.lora_A->weight), before) << "nothing is written when a check fails";
}

TEST(LoRA, MarkOnlyLoraAsTrainable) {
  LoRALinear lora(std::make_shared<Linear>(6, 5), {.rank = 2});
  lora.base_layer->bias.requires_grad_(true);
  mark_only_lora_as_trainable(lora);
  EXPECT_FALSE(lora.base_layer->bias.requires_grad());
  mark_only_lora_as_trainable(lora, {"base_layer.bias"});
  EXPECT_TRUE(lora.base_layer->bias.requires_grad());
  EXPECT_FALSE(lora.base_layer->weight.requires_grad());
  EXPECT_TRUE(lora.lora_A->weight.requires_grad() && lora.lora_B->weight.requires_grad());
  EXPECT_TRUE(throws_with([&] { mark_only_lora_as_trainable(lora, {"head.weight"}); },
                          {"mark_only_lora_as_trainable", "'head.weight'", "base_layer.weight"}));
}

// ---- apply_lora on a Vision Transformer ----------------------------------------------------------

// img 8, patch 4, 1 channel, 5 classes, dim 16, depth 2, heads 2, MLP hidden 32.
models::ViTConfig tiny_vit() {
  return {.name = "t", .img_size = 8, .patch_size = 4, .in_chans = 1, .num_classes = 5, .embed_dim = 16, .depth = 2,
          .num_heads = 2, .mlp_ratio = 2.0};
}
const std::vector<std::string> kBlockLinears = {"qkv", "proj", "fc1", "fc2"};
const std::vector<std::string> kHead = {"head.weight", "head.bias"};

int64_t trainable_count(const Module& m) {
  int64_t n = 0;
  for (const Tensor& p : trainable(m)) n += p.numel();
  return n;
}

TEST(ApplyLoRA, WrapsExactlyTheChosenLinearsOfAViT) {
  Generator gen(41), lora_gen(43);
  models::VisionTransformer vit(tiny_vit(), true, &gen);
  const Tensor images = random_tensor({3, 1, 8, 8}, DType::f32, 42);
  const std::vector<float> before = values(vit(images));
  const size_t base_parameters = vit.parameters().size();

  const std::vector<std::string> adapted =
      apply_lora(vit, {.rank = 2, .alpha = 4, .generator = &lora_gen}, lora_targets(kBlockLinears), kHead);
  EXPECT_EQ(adapted, (std::vector<std::string>{"blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.fc1",
                                                "blocks.0.mlp.fc2", "blocks.1.attn.qkv", "blocks.1.attn.proj",
                                                "blocks.1.mlp.fc1", "blocks.1.mlp.fc2"}));
  EXPECT_EQ(values(vit(images)), before) << "B = 0: the adapted model starts exactly where the base is";

  // The adapters sit under their Linears with PEFT's names; the base weights keep timm's.
  std::map<std::string, Shape> shapes;
  for (const auto& [name, p] : vit.named_parameters()) shapes[name] = p.shape();
  EXPECT_EQ(vit.parameters().size(), base_parameters + 2 * adapted.size());
  EXPECT_EQ(shapes.at("blocks.0.attn.qkv.weight"), (Shape{48, 16}));
  EXPECT_EQ(shapes.at("blocks.0.attn.qkv.lora_A.weight"), (Shape{2, 16}));
  EXPECT_EQ(shapes.at("blocks.0.attn.qkv.lora_B.weight"), (Shape{48, 2}));
  EXPECT_EQ(shapes.at("blocks.1.mlp.fc1.lora_B.weight"), (Shape{32, 2}));
  EXPECT_EQ(shapes.at("blocks.1.mlp.fc2.lora_A.weight"), (Shape{2, 32}));
  EXPECT_FALSE(shapes.contains("head.lora_A.weight"));

  // Trainable: the adapters and the head, nothing else; r·(in + out) per adapted Linear.
  for (const auto& [name, p] : vit.named_parameters()) {
    const bool should_train = is_lora_parameter_name(name) || name == "head.weight" || name == "head.bias";
    EXPECT_EQ(p.requires_grad(), should_train) << name;
  }
  const int64_t D = 16, hidden = 32, r = 2, depth = 2, classes = 5;
  const int64_t per_block = r * ((D + 3 * D) + (D + D) + (D + hidden) + (hidden + D));
  EXPECT_EQ(trainable_count(vit), depth * per_block + classes * D + classes);
  EXPECT_EQ(trainable_count(vit), 853);

  // The adapters are part of the model: Module::to converts them with the rest.
  vit.to(DType::f64);
  EXPECT_EQ(vit(images).dtype(), DType::f64);
  for (const auto& [name, p] : vit.named_parameters()) EXPECT_EQ(p.dtype(), DType::f64) << name;
}

TEST(ApplyLoRA, OnlyTheChosenLinearsAndNoHead) {
  models::VisionTransformer vit(tiny_vit());
  EXPECT_EQ(apply_lora(vit, {.rank = 1}, lora_targets({"qkv"})),
            (std::vector<std::string>{"blocks.0.attn.qkv", "blocks.1.attn.qkv"}));
  EXPECT_EQ(trainable_count(vit), 2 * 1 * (16 + 48));
  EXPECT_FALSE(vit.head->weight.requires_grad());
  // A filter by full name and type, as PEFT's regex targets.
  models::VisionTransformer other(tiny_vit());
  EXPECT_EQ(apply_lora(other, {.rank = 4},
                       [](const std::string& name, const Linear& l) {
                         return name.starts_with("blocks.1.") && l.out_features == 32;
                       }),
            (std::vector<std::string>{"blocks.1.mlp.fc1"}));
}

TEST(ApplyLoRA, TrainingMovesOnlyTheAdaptersAndTheHead) {
  Generator gen(51), lora_gen(52);
  models::VisionTransformer vit(tiny_vit(), true, &gen);
  apply_lora(vit, {.rank = 2, .alpha = 4, .generator = &lora_gen}, lora_targets(kBlockLinears), kHead);
  std::map<std::string, std::vector<float>> start;
  for (const auto& [name, p] : vit.named_parameters()) start[name] = values(p);

  const Tensor images = random_tensor({8, 1, 8, 8}, DType::f32, 53);
  const Tensor labels = from_vector<int64_t>({0, 1, 2, 3, 4, 0, 1, 2}, {8}, DType::i64);
  optim::AdamW optimizer(trainable(vit), 1e-2);
  double first = 0, last = 0;
  for (int step = 0; step < 15; ++step) {
    optimizer.zero_grad();
    const Tensor loss = cross_entropy(vit(images), labels);
    (step == 0 ? first : last) = loss.item();
    loss.backward();
    optimizer.step();
  }
  EXPECT_LT(last, 0.5 * first) << "first " << first << ", last " << last;
  for (const auto& [name, p] : vit.named_parameters()) {
    if (p.requires_grad()) {
      EXPECT_NE(values(p), start[name]) << name << " trains";
    } else {
      EXPECT_EQ(values(p), start[name]) << name << " is frozen: bit-for-bit unchanged";
      EXPECT_FALSE(p.grad().defined()) << name << " gets no gradient";
    }
  }
}

TEST(ApplyLoRA, AdapterFileRoundTrip) {
  Generator gen(61), lora_gen(62);
  models::VisionTransformer trained(tiny_vit(), true, &gen);
  apply_lora(trained, {.rank = 2, .generator = &lora_gen}, lora_targets(kBlockLinears), kHead);
  uint64_t seed = 63;
  for (const Tensor& p : trainable(trained)) p.copy_(random_tensor(p.shape(), DType::f32, seed++, 0.1));

  const StateDict adapters = lora_state_dict(trained, kHead);
  EXPECT_EQ(adapters.size(), 8u * 2 + 2);
  EXPECT_TRUE(adapters.contains("blocks.1.mlp.fc2.lora_B.weight"));
  EXPECT_TRUE(adapters.contains("head.bias"));
  EXPECT_FALSE(adapters.contains("blocks.1.mlp.fc2.weight"));
  const std::string path = (std::filesystem::temp_directory_path() / "octet_test_lora_adapters.safetensors").string();
  save_safetensors(path, adapters);

  // The same base (same seed), adapted afresh, then the adapter file loaded: the same model.
  Generator gen_again(61);
  models::VisionTransformer restored(tiny_vit(), true, &gen_again);
  apply_lora(restored, {.rank = 2}, lora_targets(kBlockLinears), kHead);
  const Tensor images = random_tensor({2, 1, 8, 8}, DType::f32, 64);
  EXPECT_NE(values(restored(images)), values(trained(images)));
  load_lora_state_dict(restored, load_safetensors(path).tensors, kHead);
  std::filesystem::remove(path);
  EXPECT_EQ(values(restored(images)), values(trained(images)));

  EXPECT_TRUE(throws_with([&] { load_lora_state_dict(restored, adapters); },
                          {"unexpected keys [head.bias, head.weight]", "extra suffixes"}))
      << "saved with the head, loaded without naming it";
}

TEST(ApplyLoRA, ErrorsNameTheProblemAndChangeNothing) {
  models::VisionTransformer vit(tiny_vit());
  const size_t count = vit.parameters().size();
  EXPECT_TRUE(throws_with([&] { apply_lora(vit, {.rank = 17}, lora_targets(kBlockLinears)); },
                          {"apply_lora: 'blocks.0.attn.qkv'", "rank 17", "min(in, out) = 16"}));
  EXPECT_TRUE(throws_with([&] { apply_lora(vit, {.rank = 0}, lora_targets(kBlockLinears)); }, {"rank 0"}));
  EXPECT_TRUE(throws_with([&] { apply_lora(vit, {.rank = 2, .alpha = -2}, lora_targets(kBlockLinears)); },
                          {"alpha", "got -2"}));
  EXPECT_TRUE(throws_with([&] { apply_lora(vit, {.rank = 2}, lora_targets({"q_proj"})); },
                          {"picked no Linear", "blocks.0.attn.qkv", "head"}));
  EXPECT_TRUE(throws_with([&] { apply_lora(vit, {.rank = 2}, lora_targets(kBlockLinears), {"head.weights"}); },
                          {"'head.weights'", "head.weight"}));
  EXPECT_EQ(vit.parameters().size(), count) << "a rejected call adds nothing";
  for (const Tensor& p : vit.parameters()) EXPECT_TRUE(p.requires_grad()) << "and freezes nothing";

  apply_lora(vit, {.rank = 2}, lora_targets({"fc1"}));
  EXPECT_TRUE(throws_with([&] { apply_lora(vit, {.rank = 2}, lora_targets({"fc1"})); },
                          {"'blocks.0.mlp.fc1' has a LoRA adapter already"}));
}

}  // namespace
}  // namespace octet::nn
