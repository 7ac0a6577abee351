// FP8 training on the CPU emulation: the recipes, when scales are updated, the FP8 Linear against an
// f64 reference of what it computes and against bf16, overflow, the weight cache, amax reduction and
// saving. The kernels' own rules (rounding, each scale edge case, the roll) are in
// tests/kernels/test_fp8_kernels.cpp.
//
// Gradients. An FP8 Linear quantises its operands, so as a function of x it is piecewise constant
// and finite differences say nothing about it. What its backward must equal is the gradient of the
// product of the quantised operands (the "straight-through" rule every FP8 recipe uses), and that is
// checked exactly, in f64, from the same quantised values; then the gradients are compared with the
// bf16 layer's within the error the formats allow.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/float_formats.h"
#include "core/grad_mode.h"
#include "core/op_ledger.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "nn/fp8.h"
#include "nn/fp8_linear.h"
#include "nn/layers.h"
#include "optim/sgd.h"
#include "tests/nn/fp8_steps.h"
#include "tests/testing.h"

namespace octet::nn {
namespace {

using octet::testing::all_close;
using octet::testing::random_tensor;
using octet::testing::relative_error_to_reference;
using octet::testing::same_bits;
using octet::testing::throws_with;
using Vec = std::vector<double>;
using namespace fp8_testing;

bool all_finite(const Tensor& t) {
  for (double v : t.detach().to_vector<double>()) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

// Every value of t, cast to FP8 at `scale` and decoded (scaled back): what the FP8 GEMM multiplies.
Vec quantised(const Tensor& t, DType fp8, double scale) {
  Vec out = t.detach().to_vector<double>();
  for (double& v : out) {
    const float s = static_cast<float>(v) * static_cast<float>(scale);
    const float q = fp8 == DType::e4m3 ? e4m3_to_float(float_to_e4m3(s, true)) : e5m2_to_float(float_to_e5m2(s, true));
    v = static_cast<double>(q) / scale;
  }
  return out;
}

// C[m, n] = Σ_k A[m, k]·B(k, n), B read as [k, n] (b_kn) or [n, k].
Vec matmul(const Vec& a, const Vec& b, int64_t m, int64_t k, int64_t n, bool b_kn, bool a_km = false) {
  Vec c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        acc += (a_km ? a[p * m + i] : a[i * k + p]) * (b_kn ? b[p * n + j] : b[j * k + p]);
      }
      c[static_cast<size_t>(i * n + j)] = acc;
    }
  }
  return c;
}

TEST(Fp8Recipe, DefaultsMatchTransformerEngineAndBadValuesAreRefused) {
  const Fp8Recipe recipe;
  EXPECT_TRUE(recipe.is_delayed());
  EXPECT_EQ(recipe.describe(), "delayed(margin=0, amax_history_len=1024, amax_compute_algo=max, fp8_format=HYBRID)");
  EXPECT_EQ(recipe.backward_dtype(), DType::e5m2);
  EXPECT_EQ(Fp8Recipe(CurrentScaling{.margin = 1, .fp8_format = Fp8Format::E4M3}).describe(),
            "current(margin=1, fp8_format=E4M3)");
  EXPECT_EQ(Fp8Recipe(DelayedScaling{.fp8_format = Fp8Format::E4M3}).backward_dtype(), DType::e4m3);
  EXPECT_TRUE(throws_with([] { Fp8Recipe r(DelayedScaling{.amax_history_len = 0}); }, {"amax_history_len"}));
  EXPECT_TRUE(throws_with([] { Fp8Recipe r(CurrentScaling{.margin = -1}); }, {"margin -1", "0 to 64"}));
  EXPECT_TRUE(throws_with([] { (void)Fp8Recipe(CurrentScaling{}).delayed(); }, {"not a delayed-scaling recipe"}));
}

TEST(Fp8Autocast, ScopesNestAndTheInnermostDecides) {
  EXPECT_FALSE(fp8_enabled());
  {
    Fp8Autocast outer(true, CurrentScaling{});
    EXPECT_TRUE(fp8_enabled());
    EXPECT_FALSE(fp8_config()->recipe.is_delayed());
    {
      Fp8Autocast off(false);
      EXPECT_FALSE(fp8_enabled());
      auto inner = fp8_autocast(true, DelayedScaling{.amax_history_len = 7});
      EXPECT_EQ(fp8_config()->recipe.amax_history_len(), 7);
    }
    EXPECT_FALSE(fp8_config()->recipe.is_delayed());
  }
  EXPECT_FALSE(fp8_enabled());
}

// With x and W f32, the FP8 layer's outputs and gradients equal, to f32 accumulation, the f64
// products of the values the casts produce. The first step runs at scale 1 (a new state), and the
// backward's dy is cast to E5M2 at scale 1 too.
TEST(Fp8Linear, ForwardAndGradientsAreExactlyTheProductsOfTheQuantisedOperands) {
  const int64_t rows = 6, in = 32, out = 48;
  auto layer = make_linear(in, out, DType::f32, 10);
  Tensor x = random_tensor({2, 3, in}, DType::f32, 11).requires_grad_();
  const Tensor r = random_tensor({2, 3, out}, DType::f32, 12);
  const Tensor y = step(*layer, x, r, DelayedScaling{});

  const Vec xq = quantised(x, DType::e4m3, 1), wq = quantised(layer->weight, DType::e4m3, 1);
  const Vec dyq = quantised(r, DType::e5m2, 1), b = layer->bias.to_vector<double>();
  Vec y_ref = matmul(xq, wq, rows, in, out, /*b_kn=*/false);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < out; ++j) y_ref[i * out + j] += b[j];
  }
  EXPECT_TRUE(all_close(y, y_ref, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(x.grad(), matmul(dyq, wq, rows, out, in, /*b_kn=*/true), 1e-5, 1e-5));
  EXPECT_TRUE(all_close(layer->weight.grad(), matmul(dyq, xq, out, rows, in, true, /*a_km=*/true), 1e-5, 1e-5));
  // db comes from the unquantised dy.
  Vec db(out, 0.0);
  const Vec rv = r.to_vector<double>();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < out; ++j) db[j] += rv[i * out + j];
  }
  EXPECT_TRUE(all_close(layer->bias.grad(), db, 1e-5, 1e-5));
}

// The same layer in bf16 with and without FP8: outputs and gradients agree within what 3 (E4M3) and
// 2 (E5M2) mantissa bits allow. Rounding to nearest with u = 2^-4 (E4M3) leaves a relative error per
// element of at most u and about u/√3 on average; a dot product of two rounded operands has about
// √2·u/√3 ≈ 0.05 norm-wise, and the gradients with an E5M2 operand (u = 2^-3) about 0.08. The bounds
// are those with headroom; the floors show that quantisation did happen. The second step runs with
// the scales the first step's amaxes gave, as training does.
TEST(Fp8Linear, OutputsAndGradientsAreCloseToTheBf16Layer) {
  const int64_t in = 64, out = 96;
  auto fp8_layer = make_linear(in, out, DType::bf16, 20);
  auto bf16_layer = make_linear(in, out, DType::bf16, 20);
  for (int s = 0; s < 2; ++s) {
    Tensor x8 = random_tensor({4, 25, in}, DType::bf16, 21 + s).requires_grad_();
    Tensor x16 = x8.detach().clone().requires_grad_();
    const Tensor r = random_tensor({4, 25, out}, DType::bf16, 30 + s);
    fp8_layer->zero_grad();
    bf16_layer->zero_grad();
    const Tensor y8 = step(*fp8_layer, x8, r, DelayedScaling{});
    const Tensor y16 = (*bf16_layer)(x16);
    sum(mul(y16, r)).backward();
    EXPECT_EQ(y8.dtype(), DType::bf16);
    const double ey = relative_error_to_reference(y8, y16);
    const double ex = relative_error_to_reference(x8.grad(), x16.grad());
    const double ew = relative_error_to_reference(fp8_layer->weight.grad(), bf16_layer->weight.grad());
    EXPECT_LT(ey, 0.06) << "step " << s;
    EXPECT_GT(ey, 0.005) << "step " << s;
    EXPECT_LT(ex, 0.1) << "step " << s;
    EXPECT_GT(ex, 0.005) << "step " << s;
    EXPECT_LT(ew, 0.1) << "step " << s;
    EXPECT_GT(ew, 0.005) << "step " << s;
    EXPECT_TRUE(all_close(fp8_layer->bias.grad(), bf16_layer->bias.grad(), 0, 0));  // same dy, same sum
  }
}

// ---- the bias gradient from dy's cast -------------------------------------------------------------------------

// Sets whether the backward sums the bias gradient in dy's cast (set_fp8_fused_bias_grad) for one
// scope, then restores the default (fused).
class FusedBiasGrad {
 public:
  explicit FusedBiasGrad(bool fused) { set_fp8_fused_bias_grad(fused); }
  ~FusedBiasGrad() { set_fp8_fused_bias_grad(true); }
};

// Two steps of one Linear (33 rows: not a multiple of 16), the second with the scales the first gave.
Fp8Steps linear_steps(DType dtype, const Fp8Recipe& recipe, bool fused) {
  const FusedBiasGrad mode(fused);
  OpLedger ledger;
  auto layer = make_linear(64, 48, dtype, 300);
  Fp8Steps out;
  for (int s = 0; s < 2; ++s) {
    Tensor x = random_tensor({3, 11, 64}, dtype, 301 + s, 2.0).requires_grad_();
    layer->zero_grad();
    const std::string at = "step" + std::to_string(s) + ".";
    out.tensors[at + "y"] = step(*layer, x, random_tensor({3, 11, 48}, dtype, 310 + s, 1e-2), recipe);
    out.tensors[at + "x.grad"] = x.grad();
    keep_grads(out, *layer, at);
    keep_fp8_state(out, *layer, at);
  }
  out.fused_casts = ledger.op("fp8_cast_dbias").calls;
  return out;
}

// Casting dy and summing the bias gradient in one pass changes no bit of a training step on the CPU:
// outputs, all three gradients and the FP8 state after each of two steps, under both formats of
// delayed scaling (where it is one pass over dy) and under current scaling (two), in bf16 and f32.
TEST(Fp8Linear, TheBiasGradientFromDysCastIsTheUnfusedSumBitForBit) {
  const std::vector<std::pair<std::string, Fp8Recipe>> recipes = {
      {"delayed HYBRID", DelayedScaling{.amax_history_len = 4}},
      {"delayed E4M3", DelayedScaling{.amax_history_len = 4, .fp8_format = Fp8Format::E4M3}},
      {"current HYBRID", CurrentScaling{}}};
  for (const auto& [name, recipe] : recipes) {
    for (DType dtype : {DType::bf16, DType::f32}) {
      SCOPED_TRACE(name + " " + dtype_name(dtype));
      const Fp8Steps fused = linear_steps(dtype, recipe, true), unfused = linear_steps(dtype, recipe, false);
      expect_same_steps(fused, unfused);
      EXPECT_EQ(fused.fused_casts, 2);
    }
  }
  EXPECT_TRUE(fp8_fused_bias_grad()) << "fused is the default";
}

// The same for two steps of a bf16 TransformerBlock whose four Linears run in FP8, with an SGD step in
// between: the second step's casts use updated weights and scales.
TEST(Fp8Linear, ABlockTrainsTheSameBitsWithTheBiasGradientFromDysCast) {
  for (Fp8Format format : {Fp8Format::HYBRID, Fp8Format::E4M3}) {
    SCOPED_TRACE(format == Fp8Format::HYBRID ? "HYBRID" : "E4M3");
    auto run = [&](bool fused) {
      const FusedBiasGrad mode(fused);
      OpLedger ledger;
      TransformerBlock block(32, 2);
      uint64_t seed = 400;
      for (const Tensor& p : block.parameters()) p.detach().copy_(random_tensor(p.shape(), DType::f32, seed++, 0.2));
      block.to(DType::bf16);
      optim::SGD sgd(block.parameters(), 0.1);
      Fp8Steps out;
      for (int s = 0; s < 2; ++s) {
        Tensor x = random_tensor({2, 17, 32}, DType::bf16, 420 + s, 1.0).requires_grad_();
        sgd.zero_grad();
        const std::string at = "step" + std::to_string(s) + ".";
        out.tensors[at + "y"] =
            step(block, x, random_tensor({2, 17, 32}, DType::bf16, 430 + s), DelayedScaling{.fp8_format = format});
        out.tensors[at + "x.grad"] = x.grad();
        keep_grads(out, block, at);
        keep_fp8_state(out, block, at);
        sgd.step();
      }
      // fc1's dy is GELU's input gradient, cast (with fc1's bias gradient) by dGELU's own pass.
      out.fused_casts = ledger.op("fp8_cast_dbias").calls + ledger.op("dgelu_fp8_cast_dbias").calls;
      return out;
    };
    const Fp8Steps fused = run(true), unfused = run(false);
    expect_same_steps(fused, unfused);
    EXPECT_EQ(fused.fused_casts, 2 * 4) << "qkv, proj, fc1 and fc2, twice";
  }
}

TEST(Fp8Linear, DelayedScalingUpdatesForwardScalesAtScopeExitAndGradientScalesAfterBackward) {
  const int64_t in = 16, out = 32, history = 4;
  auto layer = make_linear(in, out, DType::f32, 40);
  Tensor x = random_tensor({5, in}, DType::f32, 41, 3.0).requires_grad_();
  const Tensor r = random_tensor({5, out}, DType::f32, 42, 0.01);
  const double amax_x = kernels::amax(x.detach()).item(), amax_w = kernels::amax(layer->weight.detach()).item();
  const double amax_dy = kernels::amax(r).item();
  Tensor y;
  {
    Fp8Autocast fp8(true, DelayedScaling{.amax_history_len = history});
    OpLedger ledger;
    y = (*layer)(x);
    // Both amaxes recorded by the casts themselves: no amax pass of its own (the weight's had one
    // until the 2026-11-28 GPU run showed its 256 small launches a step).
    EXPECT_EQ(ledger.op("fp8_amax_").calls, 0);
    const Fp8LinearState& st = *layer->fp8_state;
    EXPECT_EQ(st.forward.amax_history.select(0).to_vector<double>(), (Vec{amax_x, amax_w}));  // recorded
    EXPECT_EQ(st.forward.scale.to_vector<double>(), (Vec{1, 1}));  // not yet updated
  }
  const Fp8LinearState& st = *layer->fp8_state;
  const Vec scale = st.forward.scale.to_vector<double>();
  EXPECT_EQ(scale[0], static_cast<double>(448.0f / static_cast<float>(amax_x)));
  EXPECT_EQ(scale[1], static_cast<double>(448.0f / static_cast<float>(amax_w)));
  EXPECT_EQ(st.forward.scale_inv.to_vector<double>()[0], static_cast<double>(1.0f / static_cast<float>(scale[0])));
  const Vec h = st.forward.amax_history.to_vector<double>();
  EXPECT_EQ(h, (Vec{0, 0, 0, 0, 0, 0, amax_x, amax_w}));  // rolled: the step's amaxes are the newest row
  EXPECT_EQ(st.backward.scale.item(), 1.0);
  sum(mul(y, r)).backward();
  EXPECT_EQ(st.backward.scale.item(), static_cast<double>(57344.0f / static_cast<float>(amax_dy)));
  EXPECT_EQ(st.backward.amax_history.to_vector<double>(), (Vec{0, 0, 0, amax_dy}));
  const Fp8LinearState::Snapshot snap = st.snapshot();
  EXPECT_EQ(snap.input_amax, amax_x);
  EXPECT_EQ(snap.grad_output_amax, amax_dy);
  EXPECT_EQ(snap.weight_scale, scale[1]);
}

TEST(Fp8Linear, ALayerThatDidNotRunKeepsItsHistory) {
  auto a = make_linear(16, 16, DType::f32, 50), b = make_linear(16, 16, DType::f32, 51);
  const Tensor x = random_tensor({3, 16}, DType::f32, 52);
  {
    Fp8Autocast fp8(true, DelayedScaling{.amax_history_len = 3});
    (void)(*a)(x);
    (void)(*b)(x);
  }
  const Vec b_history = b->fp8_state->forward.amax_history.to_vector<double>();
  const Vec a_history = a->fp8_state->forward.amax_history.to_vector<double>();
  {
    Fp8Autocast fp8(true, DelayedScaling{.amax_history_len = 3});
    (void)(*a)(x);
    (void)(*a)(x);  // twice in one step: one update
  }
  EXPECT_EQ(b->fp8_state->forward.amax_history.to_vector<double>(), b_history);
  const Vec rolled = a->fp8_state->forward.amax_history.to_vector<double>();
  EXPECT_EQ(rolled[2], a_history[4]);  // row 1 <- old row 2
  EXPECT_EQ(rolled[4], a_history[4]);  // row 2 <- this step's amax (the same x)
  EXPECT_EQ(rolled[0], 0.0);
}

TEST(Fp8Linear, CurrentScalingScalesEachTensorByItsOwnAmax) {
  auto layer = make_linear(32, 16, DType::f32, 60);
  Tensor x = random_tensor({7, 32}, DType::f32, 61, 5.0).requires_grad_();
  const Tensor r = random_tensor({7, 16}, DType::f32, 62, 1e-3);
  OpLedger ledger;
  (void)step(*layer, x, r, CurrentScaling{.margin = 1});
  // Each tensor measured before its cast: x, dy, and the weight, whose [1] amax then goes into its
  // slot with one more (record_weight_amax, shared with FSDP's FP8 all-gather).
  EXPECT_EQ(ledger.op("fp8_amax_").calls, 4);
  const Fp8LinearState& st = *layer->fp8_state;
  EXPECT_EQ(st.forward.amax_history.size(0), 1);
  const float ax = static_cast<float>(kernels::amax(x.detach()).item());
  const float ady = static_cast<float>(kernels::amax(r).item());
  EXPECT_EQ(st.forward.scale.to_vector<double>()[0], static_cast<double>(448.0f / ax / 2.0f));
  EXPECT_EQ(st.backward.scale.item(), static_cast<double>(57344.0f / ady / 2.0f));
  EXPECT_EQ(st.snapshot().grad_output_amax, static_cast<double>(ady));
}

// A 1e4× activation spike under delayed scaling: the step it happens in saturates (±448, no inf or
// NaN anywhere), the next step's scale has backed off by about 1e4, and once the spike has left the
// amax history the scale returns.
TEST(Fp8Linear, ASpikeSaturatesWithoutInfAndTheScaleBacksOff) {
  const int64_t history = 3;
  auto layer = make_linear(32, 32, DType::bf16, 70);
  const DelayedScaling recipe{.amax_history_len = history};
  auto run = [&](double scale, uint64_t seed) {
    Tensor x = random_tensor({8, 32}, DType::bf16, seed, scale).requires_grad_();
    layer->zero_grad();
    const Tensor y = step(*layer, x, random_tensor({8, 32}, DType::bf16, seed + 100), recipe);
    EXPECT_TRUE(all_finite(y) && all_finite(x.grad()) && all_finite(layer->weight.grad())) << "scale " << scale;
    return layer->fp8_state->forward.scale.to_vector<double>()[0];
  };
  const double calm = run(1.0, 71);
  run(1.0, 72);
  const double after_spike = run(1e4, 73);
  EXPECT_LT(after_spike, calm / 3e3);
  EXPECT_GT(after_spike, calm / 3e4);
  run(1.0, 74);
  run(1.0, 75);
  EXPECT_LT(run(1.0, 76) / calm, 2.0) << "the spike should have left a history of " << history;
  EXPECT_GT(run(1.0, 77) / calm, 0.5);
}

TEST(Fp8Linear, TheWeightIsCastOncePerChangeOfTheWeight) {
  auto layer = make_linear(16, 32, DType::f32, 80);
  optim::SGD sgd(layer->parameters(), 0.1);
  const Tensor r = random_tensor({4, 32}, DType::f32, 81);
  auto cached = [&] { return layer->fp8_state->weight_cache.cast().data; };
  (void)step(*layer, random_tensor({4, 16}, DType::f32, 82).requires_grad_(), r, DelayedScaling{});
  const Tensor first = cached();
  (void)step(*layer, random_tensor({4, 16}, DType::f32, 83).requires_grad_(), r, DelayedScaling{});  // micro-batch 2
  EXPECT_TRUE(cached().is_same(first));
  // Freed and filled again in the same storage with the version carried over (what FSDP's gather
  // does between micro-batches when the shards are unchanged): still cached.
  const Tensor values = layer->weight.detach().clone();
  const uint64_t version = layer->weight.version();
  layer->weight.storage()->release();
  layer->weight.storage()->reallocate();
  layer->weight.detach().copy_(values);
  EXPECT_GT(layer->weight.version(), version);
  layer->weight.storage()->restore_version(version);
  (void)step(*layer, random_tensor({4, 16}, DType::f32, 87).requires_grad_(), r, DelayedScaling{});
  EXPECT_TRUE(cached().is_same(first));
  // Any in-place write makes it stale, even of the same values: cast again.
  layer->weight.detach().copy_(values);
  (void)step(*layer, random_tensor({4, 16}, DType::f32, 89).requires_grad_(), r, DelayedScaling{});
  EXPECT_FALSE(cached().is_same(first));
  const Tensor rewritten = cached();
  // Pointed at other storage without a write (param.data = ...): cast again.
  layer->weight.set_data(values.clone());
  (void)step(*layer, random_tensor({4, 16}, DType::f32, 88).requires_grad_(), r, DelayedScaling{});
  EXPECT_FALSE(cached().is_same(rewritten));
  const Tensor second = cached();
  sgd.step();
  (void)step(*layer, random_tensor({4, 16}, DType::f32, 84).requires_grad_(), r, DelayedScaling{});
  EXPECT_FALSE(cached().is_same(second));
}

// The cast a cache keeps belongs to one weight's bytes: another view of the same storage (another
// offset) or a write to it misses; the transposed copy is asked for separately; clear() forgets.
TEST(Fp8WeightCache, AHitNeedsTheSameStorageOffsetAndVersion) {
  const Tensor flat = random_tensor({2 * 16 * 16}, DType::f32, 95);
  const Tensor a = flat.narrow(0, 256).reshape({16, 16}), b = flat.narrow(256, 256).reshape({16, 16});
  const Tensor scale = ones({1}, DType::f32);
  Fp8WeightCache cache;
  EXPECT_EQ(cache.find(a, false), nullptr);
  cache.store(a, kernels::fp8_cast(a, scale, Tensor(), DType::e4m3, /*rowwise=*/true, /*transposed=*/false));
  ASSERT_NE(cache.find(a, false), nullptr);
  EXPECT_EQ(cache.find(a, true), nullptr) << "no transposed copy was made";
  EXPECT_EQ(cache.find(b, false), nullptr) << "same storage, another offset";
  EXPECT_EQ(cache.find(a.clone(), false), nullptr) << "same values, another storage";
  b.fill_(0.5);  // a write anywhere in the storage moves its version
  EXPECT_EQ(cache.find(a, false), nullptr);
  cache.store(a, kernels::fp8_cast(a, scale, Tensor(), DType::e4m3, true, true));
  EXPECT_NE(cache.find(a, true), nullptr);
  kernels::mul_scalar_(a, 2.0);
  EXPECT_EQ(cache.find(a, true), nullptr);
  cache.store(a, kernels::fp8_cast(a, scale, Tensor(), DType::e4m3, true, false));
  cache.clear();
  EXPECT_EQ(cache.find(a, false), nullptr);
  EXPECT_FALSE(cache.cast().data.defined());
  // A supplied cast is never found by find(): the Linear takes it as it is, while its source lasts.
  cache.supply(kernels::fp8_cast(a, scale, Tensor(), DType::e4m3, true, false), b);
  EXPECT_TRUE(cache.supplied() && cache.supplied_is_current());
  EXPECT_EQ(cache.find(a, false), nullptr);
  kernels::add_(b, b);
  EXPECT_FALSE(cache.supplied_is_current());
}

// Every in-place write through Octet moves the version of the storage it writes, and it is shared by
// every view of that storage; reading does not move it.
TEST(StorageVersion, InPlaceWritesBumpItAndReadsDoNot) {
  const Tensor t = random_tensor({4, 8}, DType::f32, 96);
  const Tensor view = t.narrow(0, 2);
  uint64_t last = t.version();
  auto moved = [&] {
    const bool bumped = t.version() > last && view.version() == t.version();
    last = t.version();
    return bumped;
  };
  (void)t.clone();
  (void)t.to(DType::bf16);
  (void)sum(t);
  EXPECT_EQ(t.version(), last);
  view.copy_(random_tensor({2, 8}, DType::f32, 97));
  EXPECT_TRUE(moved()) << "copy_";
  t.fill_(1.0);
  EXPECT_TRUE(moved()) << "fill_";
  kernels::add_(view, view);
  EXPECT_TRUE(moved()) << "add_";
  kernels::mul_scalar_(t, 3.0);
  EXPECT_TRUE(moved()) << "mul_scalar_";
  Tensor w = t.detach().requires_grad_();
  w.set_grad(random_tensor({4, 8}, DType::f32, 98));
  optim::SGD(std::vector<Tensor>{w}, 0.1).step();
  EXPECT_TRUE(moved()) << "an optimizer step";
  t.storage()->release();
  t.storage()->reallocate();
  EXPECT_TRUE(moved()) << "reallocate: new, undefined bytes";
}

// A weight cast supplied from outside (FSDP's FP8 all-gather) is used as it is: the layer never reads
// its own weight, whose bytes may be gone. A stale one, or one without the transposed copy a gradient
// needs, is an error, and so is a layer that cannot run in FP8 while its weight is supplied.
TEST(Fp8Linear, ASuppliedWeightCastIsUsedAsItIsAndAStaleOneIsAnError) {
  auto layer = make_linear(16, 32, DType::f32, 85);
  const Tensor x = random_tensor({4, 16}, DType::f32, 86).requires_grad_();
  Fp8Autocast fp8(true, CurrentScaling{});  // the second backward scales dy as the first did
  const Tensor want = (*layer)(x);
  sum(want).backward();
  const Tensor want_dx = x.grad().clone();
  Tensor(x).set_grad(Tensor());
  const kernels::Fp8Cast own = layer->fp8_state->weight_cache.cast();
  layer->fp8_state->weight_cache.supply(own, layer->weight);  // its own cast, handed back as if from outside
  layer->weight.storage()->release();
  const Tensor got = (*layer)(x);
  sum(got).backward();
  EXPECT_TRUE(all_close(got, want, 0, 0));
  EXPECT_TRUE(all_close(x.grad(), want_dx, 0, 0));
  layer->fp8_state->weight_cache.supply({own.data, Tensor(), own.scale_inv}, layer->weight);
  EXPECT_TRUE(throws_with([&] { (void)(*layer)(x); }, {"supplied from outside", "transposed"}));
  {
    NoGradGuard no_grad;  // no gradient, no transposed copy needed
    EXPECT_TRUE(all_close((*layer)(x), want, 0, 0));
  }
  layer->weight.bump_version();  // its source written (an optimizer step, a load)
  EXPECT_TRUE(throws_with([&] { (void)(*layer)(x); }, {"supplied from outside", "before the weights last changed"}));
  EXPECT_TRUE(throws_with([&] { (void)(*layer)(x.detach().to(DType::f16)); },
                          {"Linear(16 -> 32)", "FP8 all-gather", "f16"}));
}

TEST(Fp8Linear, TheAmaxReducerSeesEveryLayersAmaxesAndItsResultSetsTheScales) {
  auto a = make_linear(16, 16, DType::f32, 90), b = make_linear(16, 32, DType::f32, 91);
  const Tensor x = random_tensor({3, 16}, DType::f32, 92);
  int64_t calls = 0, seen = 0;
  // Stands in for an all-reduce where another rank saw twice the amaxes.
  AmaxReducer doubling = [&](const Tensor& amaxes) {
    ++calls;
    seen += amaxes.numel();
    kernels::mul_scalar_(amaxes, 2.0);
  };
  {
    Fp8Autocast fp8(true, DelayedScaling{.amax_history_len = 2}, doubling);
    (void)(*b)((*a)(x));
  }
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, 4);  // input and weight of each layer, in one call
  const float amax_x = static_cast<float>(kernels::amax(x).item());
  EXPECT_EQ(a->fp8_state->forward.scale.to_vector<double>()[0], static_cast<double>(448.0f / (2.0f * amax_x)));
}

TEST(Fp8Linear, UnsuitableLayersRunAsUsual) {
  auto odd = make_linear(10, 3, DType::f32, 100);
  auto head = make_linear(16, 16, DType::f32, 101);
  head->fp8_allowed = false;
  const Tensor x10 = random_tensor({4, 10}, DType::f32, 102), x16 = random_tensor({4, 16}, DType::f32, 103);
  const Tensor want10 = (*odd)(x10), want16 = (*head)(x16);
  Fp8Autocast fp8(true, DelayedScaling{});
  EXPECT_TRUE(all_close((*odd)(x10), want10, 0, 0));
  EXPECT_TRUE(all_close((*head)(x16), want16, 0, 0));
  EXPECT_EQ(odd->fp8_state, nullptr);
  EXPECT_EQ(head->fp8_state, nullptr);
  EXPECT_NE(fp8_linear_unsupported_reason(10, 3, DType::f32, DType::f32).find("multiples of 16"), std::string::npos);
  EXPECT_NE(fp8_linear_unsupported_reason(16, 16, DType::f16, DType::f32).find("f16"), std::string::npos);
  std::shared_ptr<Fp8LinearState> state;
  EXPECT_TRUE(throws_with([&] { (void)fp8_linear(x10, odd->weight, odd->bias, state, fp8_config()); },
                          {"Linear(10 -> 3)", "multiples of 16"}));
}

TEST(Fp8Linear, AScopeLeftByAnExceptionAppliesNothing) {
  auto layer = make_linear(16, 16, DType::f32, 110);
  try {
    Fp8Autocast fp8(true, DelayedScaling{.amax_history_len = 2});
    (void)(*layer)(random_tensor({2, 16}, DType::f32, 111));
    throw std::runtime_error("the step failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(layer->fp8_state->forward.scale.to_vector<double>(), (Vec{1, 1}));
  // The next scope starts clean: only its own amaxes are applied.
  {
    Fp8Autocast fp8(true, DelayedScaling{.amax_history_len = 2});
    (void)(*layer)(random_tensor({2, 16}, DType::f32, 112));
  }
  EXPECT_NE(layer->fp8_state->forward.scale.to_vector<double>()[0], 1.0);
}

// A model holding one Linear as "fc".
struct OneLayer : Module {
  explicit OneLayer(uint64_t seed) : Module("OneLayer") { fc = register_module("fc", make_linear(16, 32, DType::f32, seed)); }
  std::shared_ptr<Linear> fc;
};

TEST(Fp8StateDict, RoundTripsAndNamesWhatDoesNotFit) {
  OneLayer model(120);
  const std::shared_ptr<Linear>& fc = model.fc;
  Tensor x = random_tensor({3, 16}, DType::f32, 121).requires_grad_();
  (void)step(*fc, x, random_tensor({3, 32}, DType::f32, 122), DelayedScaling{.amax_history_len = 5});
  const std::map<std::string, Tensor> saved = fp8_state_dict(model);
  EXPECT_EQ(saved.size(), 8u);
  ASSERT_TRUE(saved.count("fc.fp8.forward.amax_history"));
  const Vec scales = fc->fp8_state->forward.scale.to_vector<double>();

  OneLayer other(123);
  const std::shared_ptr<Linear>& fc2 = other.fc;
  load_fp8_state_dict(other, saved);
  ASSERT_NE(fc2->fp8_state, nullptr);
  EXPECT_EQ(fc2->fp8_state->forward.scale.to_vector<double>(), scales);
  EXPECT_EQ(fc2->fp8_state->backward.fp8_dtype, DType::e5m2);
  EXPECT_FALSE(fc2->fp8_state->forward.scale.is_same(fc->fp8_state->forward.scale));  // a copy

  std::map<std::string, Tensor> stray = saved;
  stray["head.fp8.forward.scale"] = ones({2});
  EXPECT_TRUE(throws_with([&] { load_fp8_state_dict(other, stray); }, {"head.fp8.forward.scale", "belongs to no Linear"}));
  std::map<std::string, Tensor> short_history = saved;
  short_history["fc.fp8.backward.amax_history"] = zeros({5});
  EXPECT_TRUE(throws_with([&] { load_fp8_state_dict(other, short_history); }, {"fc.fp8.backward.amax_history"}));
}

}  // namespace
}  // namespace octet::nn
