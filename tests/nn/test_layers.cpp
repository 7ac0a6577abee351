// The layers' forward passes against loops written out in double, plus their modes and errors.
// The references index tensors by hand (q at row h·hd of the qkv weight, a patch's feature at
// (c, ky, kx)), so they check timm's layouts independently of the shape ops the layers use.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/ops.h"
#include "nn/layers.h"
#include "tests/testing.h"

namespace octet::nn {
namespace {

using octet::testing::all_close;
using octet::testing::random_tensor;
using octet::testing::throws_with;
using Vec = std::vector<double>;

Vec values(const Tensor& t) { return t.detach().to_vector<double>(); }

// ---- references, in double over row-major vectors ------------------------------------------------------

// x [rows, in] · Wᵀ [in, out] + b.
Vec ref_linear(const Vec& x, const Vec& w, const Vec& b, int64_t in, int64_t out) {
  const int64_t rows = static_cast<int64_t>(x.size()) / in;
  Vec y(rows * out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = b.empty() ? 0.0 : b[o];
      for (int64_t i = 0; i < in; ++i) acc += x[r * in + i] * w[o * in + i];
      y[r * out + o] = acc;
    }
  }
  return y;
}

Vec ref_layer_norm(const Vec& x, const Vec& w, const Vec& b, int64_t c, double eps = 1e-6) {
  Vec y(x.size());
  for (size_t r = 0; r < x.size() / c; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < c; ++i) mean += x[r * c + i] / c;
    for (int64_t i = 0; i < c; ++i) var += (x[r * c + i] - mean) * (x[r * c + i] - mean) / c;
    for (int64_t i = 0; i < c; ++i) y[r * c + i] = (x[r * c + i] - mean) / std::sqrt(var + eps) * w[i] + b[i];
  }
  return y;
}

Vec ref_gelu(Vec x) {
  for (double& v : x) v = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
  return x;
}

Vec add(Vec a, const Vec& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

// timm's Attention on x [B, N, D]: qkv row j of the weight feeds q (j < D), k (D <= j < 2D) or
// v, head h owning rows h·hd .. h·hd + hd - 1 of each block.
Vec ref_attention(const Vec& x, const MultiheadAttention& attn, int64_t B, int64_t N) {
  const int64_t D = attn.dim, H = attn.num_heads, hd = attn.head_dim;
  const Vec qkv = ref_linear(x, values(attn.qkv->weight), values(attn.qkv->bias), D, 3 * D);  // [B·N, 3D]
  auto at = [&](int64_t b, int64_t n, int64_t which, int64_t h, int64_t j) {
    return qkv[(b * N + n) * 3 * D + which * D + h * hd + j];
  };
  Vec merged(B * N * D);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < N; ++i) {
        Vec scores(N);
        double top = -1e300;
        for (int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (int64_t e = 0; e < hd; ++e) s += at(b, i, 0, h, e) * at(b, j, 1, h, e);
          scores[j] = s / std::sqrt(static_cast<double>(hd));
          top = std::max(top, scores[j]);
        }
        double total = 0;
        for (double& s : scores) total += (s = std::exp(s - top));
        for (int64_t e = 0; e < hd; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < N; ++j) acc += scores[j] / total * at(b, j, 2, h, e);
          merged[(b * N + i) * D + h * hd + e] = acc;
        }
      }
    }
  }
  return ref_linear(merged, values(attn.proj->weight), values(attn.proj->bias), D, D);
}

Vec ref_mlp(const Vec& x, const Mlp& mlp) {
  const Vec h = ref_gelu(ref_linear(x, values(mlp.fc1->weight), values(mlp.fc1->bias), mlp.fc1->in_features,
                                    mlp.fc1->out_features));
  return ref_linear(h, values(mlp.fc2->weight), values(mlp.fc2->bias), mlp.fc2->in_features,
                    mlp.fc2->out_features);
}

Vec ref_block(const Vec& x, const TransformerBlock& block, int64_t B, int64_t N) {
  const int64_t D = block.attn->dim;
  const Vec h =
      add(x, ref_attention(ref_layer_norm(x, values(block.norm1->weight), values(block.norm1->bias), D),
                           *block.attn, B, N));
  return add(
      h, ref_mlp(ref_layer_norm(h, values(block.norm2->weight), values(block.norm2->bias), D), *block.mlp));
}

// A stride-p, kernel-p convolution, output as tokens [B, (H/p)·(W/p), D] in row-major grid order.
Vec ref_patch_embed(const Vec& img, const PatchEmbed& pe, int64_t B) {
  const int64_t C = pe.in_chans, S = pe.img_size, p = pe.patch_size, D = pe.embed_dim, G = S / p;
  const Vec w = values(pe.proj->weight), bias = values(pe.proj->bias);
  Vec out(B * G * G * D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t gy = 0; gy < G; ++gy)
      for (int64_t gx = 0; gx < G; ++gx)
        for (int64_t d = 0; d < D; ++d) {
          double acc = bias[d];
          for (int64_t c = 0; c < C; ++c)
            for (int64_t ky = 0; ky < p; ++ky)
              for (int64_t kx = 0; kx < p; ++kx)
                acc += w[((d * C + c) * p + ky) * p + kx] *
                       img[((b * C + c) * S + gy * p + ky) * S + gx * p + kx];
          out[((b * G + gy) * G + gx) * D + d] = acc;
        }
  return out;
}

// Replaces every parameter with seeded normal values (zero biases and unit norms would hide
// layout mistakes) and moves the module to f64.
void randomise(Module& m, uint64_t seed) {
  m.to(DType::f64);
  for (const Tensor& p : m.parameters()) p.copy_(random_tensor(p.shape(), DType::f64, seed++, 0.5));
}

constexpr double kTol = 1e-12;

// ---- forward values ---------------------------------------------------------------------------------------

TEST(Layers, LinearMatchesTheReferenceWithAndWithoutBias) {
  Linear with_bias(5, 4), without_bias(5, 3, /*bias=*/false);
  randomise(with_bias, 1);
  randomise(without_bias, 2);
  EXPECT_FALSE(without_bias.bias.defined());
  EXPECT_EQ(without_bias.parameters().size(), 1u);
  const Tensor x = random_tensor({2, 3, 5}, DType::f64, 3);
  const Tensor y = with_bias(x);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 4}));
  EXPECT_TRUE(all_close(y, ref_linear(values(x), values(with_bias.weight), values(with_bias.bias), 5, 4),
                        kTol, kTol));
  EXPECT_TRUE(
      all_close(without_bias(x), ref_linear(values(x), values(without_bias.weight), {}, 5, 3), kTol, kTol));
  EXPECT_TRUE(throws_with(
      [&] {
        with_bias(random_tensor({2, 4}, DType::f64));
      },
      {"Linear(5 -> 4)", "f64[2, 4]", "5 features"}));
}

TEST(Layers, LayerNormAndGeluMatchTheReference) {
  LayerNorm norm(6);
  EXPECT_EQ(norm.eps, 1e-6);
  EXPECT_EQ(values(norm.weight), Vec(6, 1.0));
  EXPECT_EQ(values(norm.bias), Vec(6, 0.0));
  randomise(norm, 4);
  const Tensor x = random_tensor({3, 6}, DType::f64, 5, 3.0);
  EXPECT_TRUE(
      all_close(norm(x), ref_layer_norm(values(x), values(norm.weight), values(norm.bias), 6), 1e-11, 1e-11));
  GELU gelu_layer;
  EXPECT_TRUE(all_close(gelu_layer(x), ref_gelu(values(x)), kTol, kTol));
}

TEST(Layers, MlpAttentionAndBlockMatchTheReference) {
  const int64_t B = 2, N = 5, D = 12;
  const Tensor x = random_tensor({B, N, D}, DType::f64, 6);
  Mlp mlp(D, 20, D);
  randomise(mlp, 10);
  EXPECT_TRUE(all_close(mlp(x), ref_mlp(values(x), mlp), kTol, kTol));

  MultiheadAttention attn(D, 3);
  EXPECT_EQ(attn.head_dim, 4);
  EXPECT_EQ(attn.qkv->weight.shape(), (Shape{3 * D, D}));
  randomise(attn, 20);
  EXPECT_TRUE(all_close(attn(x), ref_attention(values(x), attn, B, N), 1e-11, 1e-11));

  TransformerBlock block(D, 4, /*mlp_ratio=*/2.5);
  EXPECT_EQ(block.mlp->fc1->out_features, 30) << "int(dim * mlp_ratio)";
  randomise(block, 30);
  EXPECT_TRUE(all_close(block(x), ref_block(values(x), block, B, N), 1e-10, 1e-10));
}

TEST(Layers, TimmNamesForTheBlock) {
  TransformerBlock block(8, 2);
  std::vector<std::string> names;
  for (const auto& [name, p] : block.named_parameters()) names.push_back(name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias",
                                      "attn.proj.weight", "attn.proj.bias", "norm2.weight", "norm2.bias",
                                      "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias"}));
  MultiheadAttention no_bias(8, 2, /*qkv_bias=*/false);
  EXPECT_FALSE(no_bias.qkv->bias.defined());
  EXPECT_TRUE(no_bias.proj->bias.defined()) << "timm's proj always has a bias";
}

TEST(Layers, PatchEmbedIsAStridedConvolution) {
  PatchEmbed pe(/*img_size=*/8, /*patch_size=*/4, /*in_chans=*/3, /*embed_dim=*/5);
  EXPECT_EQ(pe.num_patches, 4);
  EXPECT_EQ(pe.proj->weight.shape(), (Shape{5, 3, 4, 4}));
  std::vector<std::string> names;
  for (const auto& [name, p] : pe.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"proj.weight", "proj.bias"}));
  randomise(pe, 40);
  const Tensor img = random_tensor({2, 3, 8, 8}, DType::f64, 41);
  const Tensor tokens = pe(img);
  EXPECT_EQ(tokens.shape(), (Shape{2, 4, 5}));
  EXPECT_TRUE(all_close(tokens, ref_patch_embed(values(img), pe, 2), kTol, kTol));
  EXPECT_TRUE(throws_with(
      [&] {
        pe(random_tensor({2, 3, 12, 12}, DType::f64));
      },
      {"PatchEmbed", "[2, 3, 12, 12]", "[B, 3, 8, 8]"}));
  EXPECT_TRUE(throws_with([] { PatchEmbed(10, 4, 3, 5); }, {"img_size 10", "multiple of patch_size 4"}));
}

TEST(Layers, CrossEntropyLossWithLabelSmoothingMatchesTheReference) {
  const int64_t N = 4, C = 5;
  const Tensor logits = random_tensor({N, C}, DType::f64, 50, 2.0);
  const Tensor targets = from_vector<int64_t>({0, 4, 2, 2}, {N});
  const Vec l = values(logits);
  for (double s : {0.0, 0.1}) {
    double expected = 0;
    for (int64_t r = 0; r < N; ++r) {
      double lse = 0;
      for (int64_t c = 0; c < C; ++c) lse += std::exp(l[r * C + c]);
      lse = std::log(lse);
      for (int64_t c = 0; c < C; ++c) {
        const double q = (c == targets.to_vector<int64_t>()[r] ? 1 - s : 0) + s / C;
        expected += -q * (l[r * C + c] - lse) / N;
      }
    }
    EXPECT_NEAR(CrossEntropyLoss(s)(logits, targets).item(), expected, 1e-12) << "smoothing " << s;
  }
  EXPECT_TRUE(throws_with([] { CrossEntropyLoss(1.5); }, {"label_smoothing", "[0, 1]"}));
}

// ---- randomness and modes -------------------------------------------------------------------------------

TEST(Layers, DropoutZeroesAboutPAndScalesTheRestInTrainingOnly) {
  Generator gen(7);
  Dropout drop(0.25, &gen);
  const Tensor x = octet::testing::uniform_tensor({200, 100}, 1.0, 2.0, DType::f64, 8);
  const Vec in = values(x), out = values(drop(x));
  int64_t zeros = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    if (out[i] == 0) {
      ++zeros;
    } else {
      ASSERT_NEAR(out[i], in[i] / 0.75, 1e-12);
    }
  }
  // 20000 Bernoulli(0.25) draws: the std of the fraction is 0.003.
  EXPECT_NEAR(static_cast<double>(zeros) / 20000, 0.25, 0.015);

  gen.manual_seed(7);
  EXPECT_EQ(values(drop(x)), out) << "the same generator state gives the same mask";
  EXPECT_NE(values(drop(x)), out) << "the next call draws a new mask";

  drop.eval();
  EXPECT_TRUE(drop(x).is_same(x));
  Dropout none(0.0, &gen);
  EXPECT_TRUE(none(x).is_same(x));
  EXPECT_TRUE(throws_with([] { Dropout(1.0); }, {"Dropout", "[0, 1)", "got 1"}));
}

TEST(Layers, DropPathDropsWholeSamplesAndScalesKeptOnes) {
  Generator gen(11);
  const double p = 0.3;
  DropPath drop_path(p, &gen);
  const int64_t B = 400;
  const Tensor x = octet::testing::uniform_tensor({B, 3, 4}, 1.0, 2.0, DType::f64, 12);
  const Vec in = values(x), out = values(drop_path(x));
  int64_t dropped = 0;
  for (int64_t b = 0; b < B; ++b) {
    const bool sample_dropped = out[b * 12] == 0;
    dropped += sample_dropped;
    for (int64_t i = 0; i < 12; ++i) {
      ASSERT_NEAR(out[b * 12 + i], sample_dropped ? 0.0 : in[b * 12 + i] / (1 - p), 1e-12) << "sample " << b;
    }
  }
  // 400 Bernoulli(0.3) draws: the std of the fraction is 0.023.
  EXPECT_NEAR(static_cast<double>(dropped) / B, p, 0.08);
  EXPECT_GT(dropped, 0);

  // The gradient is the same per-sample mask.
  gen.manual_seed(11);
  Tensor leaf = x.clone();
  leaf.requires_grad_();
  sum(drop_path(leaf)).backward();
  const Vec grad = values(leaf.grad());
  for (int64_t i = 0; i < B * 12; ++i) ASSERT_NEAR(grad[i], out[i] == 0 ? 0.0 : 1 / (1 - p), 1e-12);

  drop_path.eval();
  EXPECT_TRUE(drop_path(x).is_same(x));
  EXPECT_TRUE(throws_with([] { DropPath(-0.1); }, {"DropPath", "[0, 1)"}));
}

TEST(Layers, BlockDropoutFollowsTrainAndEval) {
  Generator gen(3);
  TransformerBlock block(8, 2, 4.0, true, /*proj_drop=*/0.2, 0.0, /*drop_path=*/0.2, &gen);
  randomise(block, 60);
  const Tensor x = random_tensor({4, 3, 8}, DType::f64, 61);
  const Vec train_a = values(block(x)), train_b = values(block(x));
  EXPECT_NE(train_a, train_b);
  block.eval();
  const Vec eval_out = values(block(x));
  EXPECT_EQ(values(block(x)), eval_out);
  EXPECT_TRUE(all_close(block(x), ref_block(values(x), block, 4, 3), 1e-10, 1e-10))
      << "eval is the plain block";
}

TEST(Layers, ConstructorErrorsSayWhatToChange) {
  EXPECT_TRUE(throws_with([] { MultiheadAttention(8, 2, true, /*attn_drop=*/0.1); },
                          {"attn_drop = 0.1", "not supported", "attn_drop = 0"}));
  EXPECT_TRUE(throws_with([] { MultiheadAttention(10, 3); }, {"dim 10", "num_heads 3"}));
  EXPECT_TRUE(throws_with([] { Linear(0, 3); }, {"Linear", "positive"}));
  EXPECT_TRUE(throws_with([] { LayerNorm(0); }, {"LayerNorm", "positive"}));
  MultiheadAttention attn(8, 2);
  EXPECT_TRUE(throws_with(
      [&] {
        attn(random_tensor({2, 8}));
      },
      {"MultiheadAttention", "f32[2, 8]", "[B, N, 8]"}));
}

}  // namespace
}  // namespace octet::nn
