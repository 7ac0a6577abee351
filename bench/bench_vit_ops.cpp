// One CPU training step of a small Vision Transformer, built straight from the differentiable
// functions in autograd/ops.h (no nn/ modules), timed next to OpenBLAS's sgemm on the model's
// main GEMM shape in the same run, with a per-op-kind breakdown of where the step's time goes.
//
//   build/bin/bench_vit_ops [--batch 128] [--patch 4] [--dim 128] [--depth 6] [--heads 4] [--mlp-ratio 4]
//                           [--image 28] [--channels 1] [--qkv packed|select|split] [--residual-ln fused|unfused]
//                           [--iters 10] [--json FILE]
//   build/bin/bench_vit_ops --ledger [...]    what one step moves, per op, per image and per block
//
// --qkv picks how attention gets q, k and v: `packed` (what nn::MultiheadAttention runs: attention
// reads them in place from the qkv projection's output), or the permute-based formulations it
// replaced, `select` (three selects, the old nn path) and `split`. --residual-ln unfused runs the
// block's first residual add and norm2 as two ops instead of one fused pass (what nn::TransformerBlock
// runs where drop path is on; without it, nn adds the residual in proj's GEMM). Both are kept so that
// before and after can be measured in one binary.
//
// --ledger counts instead of timing: it runs one step under the op ledger (core/op_ledger.h) at
// depth 1 and at depth 2 and prints the ledger per image, and per block (depth 2 minus depth 1).
// Counting moves no time, so ViT-Huge's dimensions fit on the CPU at a small batch:
//   build/bin/bench_vit_ops --ledger --image 224 --channels 3 --patch 16 --dim 1280 --heads 16 --batch 2
//
// The step is forward + backward on a fixed random batch (the optimizer update is left out: it
// touches each parameter once and is small next to the activations). Model FLOPs are 3 x the
// forward's GEMM and attention-matmul FLOPs, the usual convention (backward = 2 x forward).
//
// Breakdown: forward ops are timed one by one. Backward is timed with a gradient hook on every op's
// output; the engine runs those hooks just before it runs that op's backward, so the time from one
// hook to the next is that op's backward plus the engine's bookkeeping around it (summing
// gradients that meet, checking shapes). Profiled steps run separately from the timed ones.
#include <cblas.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "autograd/ops.h"
#include "core/grad_mode.h"
#include "core/op_ledger.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/threads.h"

using namespace octet;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// CPU seconds used by the whole process (all threads, user + system). On a machine shared with other
// work, one thread's CPU time per step says what the kernels cost when wall time cannot.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Config {
  int64_t batch = 128, patch = 4, dim = 128, depth = 6, heads = 4;
  double mlp_ratio = 4;
  int64_t image = 28, channels = 1, classes = 10;
  std::string qkv = "packed";  // packed, select or split
  bool fuse_residual = true;   // norm2 with the residual add before it in one pass
  int64_t grid() const { return image / patch; }
  int64_t patches() const { return grid() * grid(); }
  int64_t tokens() const { return patches() + 1; }
  int64_t patch_features() const { return channels * patch * patch; }
  int64_t hidden() const { return static_cast<int64_t>(std::llround(mlp_ratio * static_cast<double>(dim))); }
  int64_t head_dim() const { return dim / heads; }
};

// Multiply-adds x 2 of every GEMM and attention matmul in one image's forward.
double forward_flops_per_image(const Config& c) {
  const double t = static_cast<double>(c.tokens()), d = static_cast<double>(c.dim);
  const double h = static_cast<double>(c.hidden());
  const double embed = 2.0 * static_cast<double>(c.patches()) * static_cast<double>(c.patch_features()) * d;
  const double block = 2.0 * t * d * 3 * d   // qkv
                       + 2.0 * 2.0 * t * t * d  // q·kᵀ and p·v over all heads
                       + 2.0 * t * d * d        // proj
                       + 2.0 * 2.0 * t * d * h;  // fc1 and fc2
  return embed + static_cast<double>(c.depth) * block + 2.0 * d * static_cast<double>(c.classes);
}

// Per-kind forward and backward seconds, kinds listed in the order they first appear.
class Profile {
 public:
  bool on = false;

  // Runs one op, times it, and tags its outputs so backward time can be charged to `kind`.
  template <class F>
  Tensor op(const char* kind, F&& f) {
    if (!on) return f();
    const auto t0 = Clock::now();
    Tensor y = f();
    entry(kind).forward += seconds_since(t0);
    tag(kind, y);
    return y;
  }
  template <class F>
  std::pair<Tensor, Tensor> op2(const char* kind, F&& f) {
    if (!on) return f();
    const auto t0 = Clock::now();
    std::pair<Tensor, Tensor> ys = f();
    entry(kind).forward += seconds_since(t0);
    tag(kind, ys.first);
    tag(kind, ys.second);
    return ys;
  }
  template <class F>
  std::vector<Tensor> ops(const char* kind, F&& f) {
    if (!on) return f();
    const auto t0 = Clock::now();
    std::vector<Tensor> ys = f();
    entry(kind).forward += seconds_since(t0);
    for (Tensor& y : ys) tag(kind, y);
    return ys;
  }
  void tag(const char* kind, Tensor& y) {
    if (!on || !y.requires_grad()) return;
    y.register_hook([this, kind](const Tensor&) {
      mark(kind);
      return Tensor();
    });
  }

  void begin_backward() {
    last_kind_ = "engine setup";
    last_ = Clock::now();
  }
  void end_backward() { mark(nullptr); }

  struct Entry {
    double forward = 0, backward = 0;
  };
  std::vector<std::pair<std::string, Entry>> entries;

 private:
  Entry& entry(const std::string& kind) {
    for (auto& [name, e] : entries) {
      if (name == kind) return e;
    }
    entries.emplace_back(kind, Entry{});
    return entries.back().second;
  }
  void mark(const char* next) {
    const auto now = Clock::now();
    entry(last_kind_).backward += std::chrono::duration<double>(now - last_).count();
    if (next) last_kind_ = next;
    last_ = now;
  }
  std::string last_kind_;
  Clock::time_point last_;
};

struct Block {
  Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
};

struct Model {
  Config c;
  Tensor embed_w, embed_b, cls, pos, norm_w, norm_b, head_w, head_b;
  std::vector<Block> blocks;
  std::vector<Tensor> params;
  bool params_tagged_ = false;

  Model(const Config& cfg, Generator& gen) : c(cfg) {
    auto param = [&](Shape shape, double std) {
      Tensor t = randn(shape, gen);
      scale_in_place(t, std);
      t.requires_grad_();
      params.push_back(t);
      return t;
    };
    auto constant = [&](Shape shape, double v) {
      Tensor t = full(shape, v);
      t.requires_grad_();
      params.push_back(t);
      return t;
    };
    const int64_t d = c.dim, h = c.hidden();
    embed_w = param({d, c.patch_features()}, 1.0 / std::sqrt(static_cast<double>(c.patch_features())));
    embed_b = constant({d}, 0.0);
    cls = param({1, 1, d}, 0.02);
    pos = param({1, c.tokens(), d}, 0.02);
    for (int64_t i = 0; i < c.depth; ++i) {
      Block b;
      b.ln1_w = constant({d}, 1.0);
      b.ln1_b = constant({d}, 0.0);
      b.qkv_w = param({3 * d, d}, 0.02);
      b.qkv_b = constant({3 * d}, 0.0);
      b.proj_w = param({d, d}, 0.02);
      b.proj_b = constant({d}, 0.0);
      b.ln2_w = constant({d}, 1.0);
      b.ln2_b = constant({d}, 0.0);
      b.fc1_w = param({h, d}, 0.02);
      b.fc1_b = constant({h}, 0.0);
      b.fc2_w = param({d, h}, 0.02);
      b.fc2_b = constant({d}, 0.0);
      blocks.push_back(b);
    }
    norm_w = constant({d}, 1.0);
    norm_b = constant({d}, 0.0);
    head_w = param({c.classes, d}, 0.02);
    head_b = constant({c.classes}, 0.0);
  }

  static void scale_in_place(Tensor& t, double s) {
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(p[i] * s);
  }

  int64_t num_parameters() const {
    int64_t n = 0;
    for (const Tensor& p : params) n += p.numel();
    return n;
  }

  Tensor loss(const Tensor& images, const Tensor& labels, Profile& prof) const {
    const int64_t b = images.size(0), t = c.tokens(), d = c.dim, nh = c.heads, hd = c.head_dim();
    Tensor x = prof.op("patchify", [&] { return patchify(images, c.patch); });
    x = prof.op("gemm patch embed", [&] { return linear(x, embed_w, embed_b); });
    x = prof.op("cls concat", [&] { return concat({broadcast_to(cls, {b, 1, d}), x}, 1); });
    x = prof.op("pos add", [&] { return add(x, pos); });
    for (const Block& blk : blocks) {
      Tensor h = prof.op("layer_norm", [&] { return layer_norm(x, blk.ln1_w, blk.ln1_b); });
      Tensor qkv = prof.op("gemm qkv", [&] { return linear(h, blk.qkv_w, blk.qkv_b); });
      Tensor a;
      if (c.qkv == "packed") {
        a = prof.op("attention", [&] { return packed_qkv_attention(qkv, nh); });
      } else {
        qkv = prof.op("reshape/permute/split", [&] { return reshape(qkv, {b, t, 3, nh, hd}); });
        qkv = prof.op("reshape/permute/split", [&] { return permute(qkv, {2, 0, 3, 1, 4}); });
        // q, k and v: three selects along dim 0 (the old nn::MultiheadAttention), or one split.
        std::vector<Tensor> parts;
        if (c.qkv == "split") {
          parts = prof.ops("reshape/permute/split", [&] { return split(qkv, {1, 1, 1}, 0); });
          for (Tensor& p : parts) p = prof.op("reshape/permute/split", [&] { return reshape(p, {b, nh, t, hd}); });
        } else {
          for (int64_t i = 0; i < 3; ++i) {
            parts.push_back(prof.op("reshape/permute/split", [&] { return select(qkv, 0, i); }));
          }
        }
        a = prof.op("attention", [&] { return scaled_dot_product_attention(parts[0], parts[1], parts[2]); });
        a = prof.op("reshape/permute/split", [&] { return permute(a, {0, 2, 1, 3}); });
        a = prof.op("reshape/permute/split", [&] { return reshape(a, {b, t, d}); });
      }
      a = prof.op("gemm proj", [&] { return linear(a, blk.proj_w, blk.proj_b); });
      if (c.fuse_residual) {  // h = x + a and norm2(h) in one pass, as nn's block with drop path runs it
        auto [sum, normed] = prof.op2("residual add + layer_norm", [&] {
          return add_layer_norm(x, a, blk.ln2_w, blk.ln2_b);
        });
        x = sum;
        h = normed;
      } else {
        x = prof.op("residual add", [&] { return add(x, a); });
        h = prof.op("layer_norm", [&] { return layer_norm(x, blk.ln2_w, blk.ln2_b); });
      }
      h = prof.op("gemm fc1", [&] { return linear(h, blk.fc1_w, blk.fc1_b); });
      h = prof.op("gelu", [&] { return gelu(h); });
      h = prof.op("gemm fc2", [&] { return linear(h, blk.fc2_w, blk.fc2_b); });
      x = prof.op("residual add", [&] { return add(x, h); });
    }
    x = prof.op("layer_norm", [&] { return layer_norm(x, norm_w, norm_b); });
    x = prof.op("select cls", [&] { return select(x, 1, 0); });
    x = prof.op("gemm head", [&] { return linear(x, head_w, head_b); });
    return prof.op("cross_entropy", [&] { return cross_entropy(x, labels); });
  }

  // One forward + backward; gradients are dropped first (set_to_none), as zero_grad does.
  double step(const Tensor& images, const Tensor& labels, Profile& prof) {
    for (Tensor& p : params) p.set_grad(Tensor());
    if (prof.on && !params_tagged_) {
      for (Tensor& p : params) prof.tag("grad accumulate", p);
      params_tagged_ = true;
    }
    Tensor l = loss(images, labels, prof);
    prof.begin_backward();
    l.backward();
    prof.end_backward();
    return l.item();
  }
};

// Bitwise fingerprint of every gradient: equal fingerprints on two steps mean identical results.
std::vector<uint32_t> grad_bits(const Model& m) {
  std::vector<uint32_t> bits;
  for (const Tensor& p : m.params) {
    const float* g = p.grad().data<float>();
    uint32_t h = 2166136261u;
    for (int64_t i = 0; i < p.numel(); ++i) {
      uint32_t u;
      std::memcpy(&u, &g[i], 4);
      h = (h ^ u) * 16777619u;
    }
    bits.push_back(h);
  }
  return bits;
}

// One batch of random images and fixed labels, made once: the step is timed, not the data.
std::pair<Tensor, Tensor> fixed_batch(const Config& c, Generator& gen) {
  const Tensor images = randn({c.batch, c.channels, c.image, c.image}, gen);
  std::vector<int64_t> label_values(static_cast<size_t>(c.batch));
  for (int64_t i = 0; i < c.batch; ++i) label_values[i] = (i * 7 + 3) % c.classes;
  return {images, from_vector(label_values, {c.batch})};
}

// The ledger of one forward + backward of a model with c's dimensions and `depth` blocks.
OpTallies ledger_of_step(Config c, int64_t depth) {
  c.depth = depth;
  Generator gen(7);
  Model model(c, gen);
  const auto [images, labels] = fixed_batch(c, gen);
  Profile off;
  OpLedger ledger;
  model.step(images, labels, off);
  return ledger.ops();
}

// One step's ledger per image, and one block's per image (depth 2 minus depth 1: the same stem,
// head and loss, one block more).
int print_ledger(const Config& c) {
  const OpTallies one = ledger_of_step(c, 1), two = ledger_of_step(c, 2);
  const OpTallies block = ledger_difference(two, one);
  const double b = static_cast<double>(c.batch);
  std::printf("op ledger: image %ld, %ld channel(s), patch %ld (%ld tokens), dim %ld, heads %ld, mlp %g, f32, batch "
              "%ld; q, k, v: %s; residual + norm2: %s\n",
              long(c.image), long(c.channels), long(c.patch), long(c.tokens()), long(c.dim), long(c.heads),
              c.mlp_ratio, long(c.batch), c.qkv.c_str(), c.fuse_residual ? "fused" : "unfused");
  std::printf("\none block, forward + backward (calls per step; bytes and FLOPs per image):\n");
  std::printf("%s", ledger_table(block, b).c_str());
  std::printf("\na whole step at depth 2 (stem, 2 blocks, head, loss; no optimizer; calls per step; bytes and "
              "FLOPs per image):\n");
  std::printf("%s", ledger_table(two, b).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU ViT training step built from autograd ops, against OpenBLAS sgemm"};
  Config c;
  int iters = 10, warmup = 2, profiled = 3;
  std::string json_path;
  bool ledger = false;
  app.add_option("--batch", c.batch, "images per step")->check(CLI::PositiveNumber);
  app.add_option("--image", c.image, "image height and width")->check(CLI::PositiveNumber);
  app.add_option("--channels", c.channels, "image channels")->check(CLI::PositiveNumber);
  app.add_option("--patch", c.patch, "patch size (must divide --image)")->check(CLI::PositiveNumber);
  app.add_option("--dim", c.dim, "embedding width")->check(CLI::PositiveNumber);
  app.add_option("--depth", c.depth, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--heads", c.heads, "attention heads (must divide dim)")->check(CLI::PositiveNumber);
  app.add_option("--mlp-ratio", c.mlp_ratio, "MLP hidden width / dim")->check(CLI::PositiveNumber);
  app.add_option("--iters", iters, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--profiled", profiled, "extra steps that collect the per-op breakdown")->check(CLI::PositiveNumber);
  app.add_option("--json", json_path, "also write the results as JSON");
  app.add_option("--qkv", c.qkv, "how attention takes q, k, v: packed (nn's), select or split (the permute paths)")
      ->check(CLI::IsMember({"packed", "select", "split"}));
  std::string residual = "fused";
  app.add_option("--residual-ln", residual, "norm2 and the residual add before it: fused (as nn's block with drop path) or unfused")
      ->check(CLI::IsMember({"fused", "unfused"}));
  app.add_flag("--ledger", ledger, "count what one step moves (op ledger) instead of timing it");
  CLI11_PARSE(app, argc, argv);
  if (c.image % c.patch != 0 || c.dim % c.heads != 0) {
    std::fprintf(stderr, "bench_vit_ops: the patch must divide the image and the heads must divide dim\n");
    return 2;
  }
  c.fuse_residual = residual == "fused";
  if (ledger) return print_ledger(c);

  Generator gen(7);
  Model model(c, gen);
  const auto [images, labels] = fixed_batch(c, gen);

  // The reference: sgemm on fc1's forward shape, x [B·T, dim] · W[hidden, dim]ᵀ.
  const int64_t gm = c.batch * c.tokens(), gn = c.hidden(), gk = c.dim;
  const Tensor ga = randn({gm, gk}, gen), gb = randn({gn, gk}, gen);
  Tensor gc = zeros({gm, gn});
  auto sgemm = [&] {
    const kernels::OpenBlasThreads blas_threads(kernels::num_threads());  // OpenBLAS as it runs on its own
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(gm), static_cast<int>(gn),
                static_cast<int>(gk), 1.0f, ga.data<float>(), static_cast<int>(gk), gb.data<float>(),
                static_cast<int>(gk), 0.0f, gc.data<float>(), static_cast<int>(gn));
  };
  // Enough sgemm calls per sample that each sample lasts a few milliseconds.
  const int gemm_calls = std::max(1, static_cast<int>(3e-3 / (2.0 * gm * gn * gk / 100e9)));

  Profile off;
  for (int i = 0; i < warmup; ++i) model.step(images, labels, off);
  // Steps and sgemm samples alternate in blocks, so drift and the other core's load hit both alike.
  // Each switch waits 200 ms first: after a parallel region OpenMP's workers spin (GOMP_SPINCOUNT),
  // and after a call OpenBLAS's do, before they sleep; either would steal a core from the other side.
  const auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); };
  std::vector<double> step_s, step_cpu_s, gemm_s;
  double loss = 0;
  std::vector<uint32_t> first_bits;
  bool deterministic = true;
  const int blocks = std::min(iters, 3);
  for (int i = 0; i < iters; ++i) {
    auto t0 = Clock::now();
    const double c0 = process_cpu_seconds();
    loss = model.step(images, labels, off);
    step_cpu_s.push_back(process_cpu_seconds() - c0);
    step_s.push_back(seconds_since(t0));
    if (i == 0) first_bits = grad_bits(model);
    else deterministic = deterministic && grad_bits(model) == first_bits;
    if ((i + 1) % ((iters + blocks - 1) / blocks) != 0 && i + 1 != iters) continue;
    settle();
    for (int s = 0; s < 5; ++s) {
      t0 = Clock::now();
      for (int k = 0; k < gemm_calls; ++k) sgemm();
      gemm_s.push_back(seconds_since(t0) / gemm_calls);
    }
    settle();
  }

  Profile prof;
  prof.on = true;
  std::vector<double> profiled_s;
  for (int i = 0; i < profiled; ++i) {
    const auto t0 = Clock::now();
    model.step(images, labels, prof);
    profiled_s.push_back(seconds_since(t0));
  }

  const double step = median(step_s);
  const double flops = 3.0 * forward_flops_per_image(c) * static_cast<double>(c.batch);
  const double gflops = flops / step / 1e9;
  // The reference is sgemm at its best (the fastest sample): a ratio against it errs on the low side.
  const double gemm_gflops = 2.0 * gm * gn * gk / *std::min_element(gemm_s.begin(), gemm_s.end()) / 1e9;
  const double gemm_median_gflops = 2.0 * gm * gn * gk / median(gemm_s) / 1e9;
  int threads = 1;
#ifdef _OPENMP
  threads = omp_get_max_threads();
#endif
  std::printf("config: patch %ld (%ld tokens), dim %ld, depth %ld, heads %ld, mlp %g, batch %ld; %ld parameters; "
              "%d OpenMP threads; q, k, v: %s; residual + norm2: %s\n",
              long(c.patch), long(c.tokens()), long(c.dim), long(c.depth), long(c.heads), c.mlp_ratio,
              long(c.batch), long(model.num_parameters()), threads, c.qkv.c_str(), c.fuse_residual ? "fused" : "unfused");
  std::printf("step %.2f ms (median of %d, min %.2f; CPU time %.2f ms)   %.0f images/s   epoch of 60000: %.0f s\n",
              step * 1e3, iters, *std::min_element(step_s.begin(), step_s.end()) * 1e3, median(step_cpu_s) * 1e3,
              c.batch / step, 60000.0 / c.batch * step);
  std::printf("model %.2f GFLOP/step  achieved %.1f GFLOP/s   sgemm %ldx%ldx%ld (fc1 fprop) best %.1f GFLOP/s "
              "(median %.1f)   ratio %.3f\n",
              flops / 1e9, gflops, long(gm), long(gn), long(gk), gemm_gflops, gemm_median_gflops, gflops / gemm_gflops);
  std::printf("loss %.6f   gradients bitwise identical across timed steps: %s\n", loss, deterministic ? "yes" : "NO");

  double total_f = 0, total_b = 0;
  for (const auto& [kind, e] : prof.entries) total_f += e.forward, total_b += e.backward;
  const double n = profiled;
  std::printf("\nbreakdown, mean of %d profiled steps (profiled step %.2f ms):\n", profiled,
              median(profiled_s) * 1e3);
  std::printf("  %-24s %10s %10s %10s %7s\n", "op kind", "fwd ms", "bwd ms", "total ms", "share");
  nlohmann::json breakdown = nlohmann::json::array();
  for (const auto& [kind, e] : prof.entries) {
    const double tot = (e.forward + e.backward) / n;
    std::printf("  %-24s %10.3f %10.3f %10.3f %6.1f%%\n", kind.c_str(), e.forward / n * 1e3, e.backward / n * 1e3,
                tot * 1e3, 100.0 * (e.forward + e.backward) / (total_f + total_b));
    breakdown.push_back({{"kind", kind}, {"forward_ms", e.forward / n * 1e3}, {"backward_ms", e.backward / n * 1e3}});
  }
  std::printf("  %-24s %10.3f %10.3f %10.3f\n", "sum", total_f / n * 1e3, total_b / n * 1e3,
              (total_f + total_b) / n * 1e3);

  if (!json_path.empty()) {
    nlohmann::json j = {{"patch", c.patch}, {"tokens", c.tokens()}, {"dim", c.dim}, {"depth", c.depth},
                        {"heads", c.heads}, {"mlp_ratio", c.mlp_ratio}, {"batch", c.batch},
                        {"parameters", model.num_parameters()}, {"step_ms", step * 1e3},
                        {"step_min_ms", *std::min_element(step_s.begin(), step_s.end()) * 1e3},
                        {"step_cpu_ms", median(step_cpu_s) * 1e3},
                        {"images_per_s", c.batch / step}, {"epoch_s", 60000.0 / c.batch * step},
                        {"gflops", gflops}, {"sgemm_gflops", gemm_gflops},
                        {"sgemm_median_gflops", gemm_median_gflops}, {"ratio", gflops / gemm_gflops},
                        {"deterministic", deterministic}, {"breakdown", breakdown}};
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  return deterministic ? 0 : 1;
}
