// bench_kernels: every memory-bound kernel of a ViT-H/16 training step at batch 64, timed against a
// device-to-device copy of the same bytes in the same run (issue 30).
//
//   build/bin/bench_kernels                     the whole table on the first GPU (well under a minute)
//   build/bin/bench_kernels --filter fp8_cast   only the rows whose kernel, variant or shape contain the text
//   build/bin/bench_kernels --list              the rows and their byte budgets, timing nothing (any machine)
//   build/bin/bench_kernels --json-only         one JSON line per kernel and the summary line, no table
//   build/bin/bench_kernels --profile --filter A --filter B
//                                               each row of A or B run once between cudaProfilerStart
//                                               and cudaProfilerStop, for a profiler started with
//                                               profiling off (ncu --profile-from-start off), untimed
//
// Without a CUDA device, or in a CPU-only build, it says it skipped and exits 0.
//
// The shapes and dtypes are the step's (train_vit --precision bf16 or fp8, apps/train_step.cpp):
// 64 images × 197 tokens = 12,608 rows of width 1280 (MLP 5120, qkv 3840); bf16 activations, bf16
// parameters (LayerNorm's weight and bias too) with f32 master weights and f32 optimizer state; FP8 as
// nn/fp8_linear.cpp casts under the delayed recipe: E4M3 for activations and weights, E5M2 for output
// gradients, each activation or gradient cast writing the row-major copy and the transposed one, a
// gradient cast with its Linear's bias gradient in bf16, a weight cast without amax (the weight's amax is
// its own fp8_amax_ pass). Each row calls the public entry point the step calls (kernels::layernorm_forward,
// kernels::fp8_cast, kernels::sgd_step_multi_, Tensor::to, ...), with its checks, its allocations and
// every launch it makes, so its time is the step's. Nothing is verified here: the tests do that.
//
// How a row is timed:
//   - inputs are random, never zeros; the FP8 scales are fp8_max / 8, so inputs of about unit scale
//     stay in range, and amax slots start at +0, as the step's do;
//   - a row keeps `sets` copies of its inputs and of its latest outputs, with sets × (the row's bytes)
//     at least 4 × the L2 cache, and run i reads copy i mod sets: no run finds in L2 what an earlier run
//     left there (the optimizers, far larger than L2, keep one);
//   - warm-up runs first, untimed and waited for; then the timed runs are queued behind a host gate
//     (cudaLaunchHostFunc holds the stream until they are all queued) with a CUDA event between
//     consecutive runs, so they execute back to back, the host's share (checks, allocation, launch)
//     stays out of them, and a run's time is the interval between its two events. Rows report the median;
//   - the reference is cudaMemcpyAsync device-to-device of bytes/2, which reads bytes/2 and writes
//     bytes/2: it moves the row's bytes, and its GB/s counts both directions as the row's does. It is
//     timed the same way, right after the row, from two 512 MiB regions at rotating offsets (larger
//     copies go as 512 MiB pieces back to back). ratio = copy µs / kernel µs = kernel GB/s ÷ copy
//     GB/s; issue 30's target is 0.75 for every kernel.
//
// The byte budget of each row, in the comment beside it, is what the kernel must move: each input read
// once and each output written once at its dtype (weights, biases, statistics and the FP8 scalars
// included; scratch such as per-tile partial sums not).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/elementwise.h"
#include "kernels/fp8.h"
#include "kernels/linear.h"
#include "kernels/nn_ops.h"
#include "kernels/optimizers.h"
#include "models/vit.h"
#include "optim/param_groups.h"

#if OCTET_HAS_CUDA
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include "core/cuda_stream.h"
#endif

using namespace octet;

namespace {

// ---- the step's shapes --------------------------------------------------------------------------------

constexpr int64_t kRows = 64 * 197;      // tokens of a batch-64 step: 12,608
constexpr int64_t kWidth = 1280;         // ViT-H's embed_dim
constexpr int64_t kHidden = 4 * kWidth;  // the MLP's hidden width, 5120
constexpr int64_t kQkv = 3 * kWidth;     // the qkv projection's output, 3840
constexpr int64_t kNC = kRows * kWidth, kNH = kRows * kHidden;
constexpr double kEps = 1e-6;  // timm's ViT LayerNorm
constexpr int64_t kBf16 = 2, kF32 = 4, kFp8 = 1;
// An activation's or gradient's FP8 cast also reads its scale, updates its amax and writes a scale_inv.
constexpr int64_t kCastScalars = 3 * kF32;
constexpr double kTarget = 0.75;           // issue 30: every kernel at ≥ 0.75 of the copy
constexpr int64_t kLaunchBound = 1 << 20;  // rows under 1 MB measure launches, not bandwidth

std::string dims(int64_t a, int64_t b) { return std::to_string(a) + "x" + std::to_string(b); }

// ---- rows -------------------------------------------------------------------------------------------------

// One timed call: run(i) calls the entry point on input copy i mod sets.
using Run = std::function<void(int64_t i)>;

struct Case {
  std::string kernel;   // the public entry point
  std::string variant;  // what it is asked for
  std::string shape;
  int64_t bytes = 0;  // the byte budget
  // Makes `sets` copies of the inputs on the device and returns the run.
  std::function<Run(int64_t sets)> prepare;
  int launches = 2;      // kernel launches per run, at most (how many runs may be queued at once)
  bool one_set = false;  // far larger than L2: one copy of the inputs
  // A GEMM with what rides along, set against the GEMM and kernels it replaces: compute-bound, so its
  // ratio to a copy says nothing and it is not counted against the target.
  bool gemm = false;
  std::string label() const { return kernel + " " + variant + " " + shape; }
};

// Runs LayerNorm's backward in one design for the life of the scope (the design is read at launch).
struct DesignScope {
  explicit DesignScope(kernels::LayerNormBackwardDesign design) : saved(kernels::layernorm_backward_design()) {
    kernels::set_layernorm_backward_design(design);
  }
  ~DesignScope() { kernels::set_layernorm_backward_design(saved); }
  DesignScope(const DesignScope&) = delete;
  DesignScope& operator=(const DesignScope&) = delete;
  kernels::LayerNormBackwardDesign saved;
};

// run(i) = f(i mod sets), whose result stays alive until run i + sets replaces it: each run writes
// memory that none of the last `sets` runs wrote.
template <class Out, class F>
Run keeping(int64_t sets, F f) {
  auto ring = std::make_shared<std::vector<Out>>(static_cast<size_t>(sets));
  return [ring, sets, f](int64_t i) { (*ring)[static_cast<size_t>(i % sets)] = f(i % sets); };
}

// Random device tensors, copied out of a pool of 16 M standard normals drawn once on the host
// (drawing every tensor on the host would take longer than the whole benchmark).
class Random {
 public:
  explicit Random(Device device) : device_(device) {
    Generator gen(30);
    normal_ = randn({kPool}, gen).to(device);
    magnitude_ = kernels::abs(normal_);
  }
  Tensor normal(const Shape& shape, DType dtype) { return from_pool(normal_, shape, dtype); }
  Tensor positive(const Shape& shape, DType dtype) { return from_pool(magnitude_, shape, dtype); }  // |N(0, 1)|
  // A LayerNorm's weight, 1 + 0.1·N(0, 1), and bias, 0.1·N(0, 1), in bf16 as the bf16 model holds them.
  Tensor ln_weight() {
    return kernels::add_scalar(kernels::mul_scalar(normal({kWidth}, DType::f32), 0.1), 1.0).to(DType::bf16);
  }
  Tensor ln_bias() { return kernels::mul_scalar(normal({kWidth}, DType::f32), 0.1).to(DType::bf16); }
  std::vector<Tensor> normals(int64_t sets, const Shape& shape, DType dtype = DType::bf16) {
    std::vector<Tensor> out;
    for (int64_t s = 0; s < sets; ++s) out.push_back(normal(shape, dtype));
    return out;
  }

 private:
  static constexpr int64_t kPool = int64_t{1} << 24;
  Tensor from_pool(const Tensor& pool, const Shape& shape, DType dtype) {
    Tensor t = empty(shape, dtype, device_);
    const Tensor flat = t.reshape({-1});
    for (int64_t done = 0; done < t.numel();) {
      const int64_t n = std::min(t.numel() - done, kPool - next_);
      flat.narrow(done, n).copy_(pool.narrow(next_, n));  // converted to dtype on the device
      done += n;
      next_ = (next_ + n) % kPool;
    }
    next_ = (next_ + 4099) % kPool;  // the next tensor starts elsewhere in the pool
    return t;
  }
  Device device_;
  Tensor normal_, magnitude_;
  int64_t next_ = 0;
};

// ViT-H/16's parameters in the model's order (timm's names): one block's shapes from a depth-1 model
// stand for all 32 (a full-depth model would allocate 2.5 GB on the host just to be listed).
std::vector<std::pair<std::string, Shape>> vit_h_parameter_shapes() {
  models::ViTConfig config = models::vit_config("vit_huge_patch16_224");
  const int64_t depth = config.depth;
  config.depth = 1;
  const models::VisionTransformer one_block(config, /*initialize=*/false);
  std::vector<std::pair<std::string, Shape>> before, block, after;
  const std::string prefix = "blocks.0.";
  for (const auto& [name, t] : one_block.named_parameters()) {
    if (name.rfind(prefix, 0) == 0) {
      block.emplace_back(name.substr(prefix.size()), t.shape());
    } else {
      (block.empty() ? before : after).emplace_back(name, t.shape());
    }
  }
  std::vector<std::pair<std::string, Shape>> out = before;
  for (int64_t i = 0; i < depth; ++i) {
    for (const auto& [name, shape] : block) out.emplace_back("blocks." + std::to_string(i) + "." + name, shape);
  }
  out.insert(out.end(), after.begin(), after.end());
  return out;
}

// What a bf16 step's optimizer holds for every parameter: the bf16 parameter and its bf16 gradient,
// the f32 master, and f32 state (SGD's momentum buffer, which is also AdamW's exp_avg, and AdamW's
// exp_avg_sq): 16 bytes × 632 M = 10.1 GB on the device.
struct Parameters {
  std::vector<std::string> names;
  std::vector<Tensor> param, grad, master, exp_avg, exp_avg_sq;
  Parameters(const std::vector<std::pair<std::string, Shape>>& shapes, Random& random) {
    for (const auto& [name, shape] : shapes) {
      names.push_back(name);
      master.push_back(random.normal(shape, DType::f32));
      param.push_back(master.back().to(DType::bf16));
      grad.push_back(random.normal(shape, DType::bf16));
      exp_avg.push_back(random.normal(shape, DType::f32));
      exp_avg_sq.push_back(random.positive(shape, DType::f32));
    }
  }
};

// What the rows share, made on first use: the random pool and the parameters.
struct Workspace {
  Device device = Device::cuda(0);
  std::vector<std::pair<std::string, Shape>> shapes = vit_h_parameter_shapes();
  int64_t parameter_count() const {
    int64_t n = 0;
    for (const auto& [name, shape] : shapes) n += shape.numel();
    return n;
  }
  Random& random() {
    if (!random_) random_ = std::make_unique<Random>(device);
    return *random_;
  }
  Parameters& parameters() {
    if (!parameters_) parameters_ = std::make_unique<Parameters>(shapes, random());
    return *parameters_;
  }

 private:
  std::unique_ptr<Random> random_;
  std::unique_ptr<Parameters> parameters_;
};

// An FP8 tensor's slots as the step's state holds them: scale = fp8_max / 8 and an amax from +0.
struct Fp8Slots {
  Tensor scale, amax;
};
Fp8Slots fp8_slots(DType fp8_dtype, Device device) {
  return {full({1}, kernels::fp8_max(fp8_dtype) / 8.0, DType::f32, device), zeros({1}, DType::f32, device)};
}

const char* fp8_name(DType d) { return d == DType::e4m3 ? "e4m3" : "e5m2"; }

// kernels::fp8_cast (or fp8_cast_dbias) of bf16 x [rows, cols], as nn/fp8_linear.cpp calls it.
// Bytes: reads x (2 per element) and writes 1 per element per copy (rows are multiples of 16: the
// transposed copy has no padding); an activation's or gradient's cast also reads its scale, updates its
// amax and writes scale_inv (12), a weight's reads the scale and writes scale_inv (8); dbias writes
// cols bf16 column sums.
Case cast_case(const std::shared_ptr<Workspace>& ws, DType fp8_dtype, int64_t rows, int64_t cols, bool transposed,
               bool dbias, bool weight) {
  const int64_t copies = transposed ? 2 : 1;
  std::string variant = std::string(fp8_name(fp8_dtype)) + (transposed ? " row+T" : " row");
  if (weight) variant += ", weight";
  if (dbias) variant += ", dbias bf16";
  const int64_t bytes = kBf16 * rows * cols + copies * kFp8 * rows * cols + (weight ? 2 * kF32 : kCastScalars) +
                        (dbias ? kBf16 * cols : 0);
  return {dbias ? "fp8_cast_dbias" : "fp8_cast", variant, dims(rows, cols), bytes, [=](int64_t sets) -> Run {
            const std::vector<Tensor> x = ws->random().normals(sets, {rows, cols});
            const Fp8Slots slots = fp8_slots(fp8_dtype, ws->device);
            const Tensor amax = weight ? Tensor() : slots.amax;
            if (dbias) {
              return keeping<kernels::Fp8CastWithBiasGrad>(sets, [=](int64_t s) {
                return kernels::fp8_cast_dbias(x[s], slots.scale, amax, fp8_dtype, /*rowwise=*/true, transposed,
                                               DType::bf16);
              });
            }
            return keeping<kernels::Fp8Cast>(sets, [=](int64_t s) {
              return kernels::fp8_cast(x[s], slots.scale, amax, fp8_dtype, /*rowwise=*/true, transposed);
            });
          }};
}

// kernels::fp8_amax_ of bf16 x [rows, cols]. Bytes: reads x, updates the amax slot (4).
Case amax_case(const std::shared_ptr<Workspace>& ws, int64_t rows, int64_t cols, const std::string& variant) {
  return {"fp8_amax_", variant, dims(rows, cols), kBf16 * rows * cols + kF32, [=](int64_t sets) -> Run {
            const std::vector<Tensor> x = ws->random().normals(sets, {rows, cols});
            const Tensor amax = zeros({1}, DType::f32, ws->device);
            return [=](int64_t i) { kernels::fp8_amax_(x[static_cast<size_t>(i % sets)], amax); };
          }};
}

std::vector<Case> step_cases(const std::shared_ptr<Workspace>& ws) {
  std::vector<Case> cases;
  const std::string nc = dims(kRows, kWidth), nh = dims(kRows, kHidden);
  const int64_t stats = 2 * kF32 * kRows;     // LayerNorm's f32 mean and rstd per row
  const int64_t affine = 2 * kBf16 * kWidth;  // LayerNorm's bf16 weight and bias
  // timm's GELU, the erf form.
  const kernels::GeluApproximation gelu = kernels::GeluApproximation::None;
  // The four weights of a block, [out, in]: qkv, proj, fc1, fc2.
  const std::vector<std::pair<int64_t, int64_t>> weights = {
      {kQkv, kWidth}, {kWidth, kWidth}, {kHidden, kWidth}, {kWidth, kHidden}};

  // ---- LayerNorm and the residual add ----
  // layernorm_forward: reads x, weight, bias; writes y, mean, rstd.
  cases.push_back({"layernorm_forward", "bf16", nc, 2 * kBf16 * kNC + affine + stats, [=](int64_t sets) -> Run {
                     Random& r = ws->random();
                     const std::vector<Tensor> x = r.normals(sets, {kRows, kWidth});
                     const Tensor w = r.ln_weight(), b = r.ln_bias();
                     return keeping<kernels::LayerNormOutput>(
                         sets, [=](int64_t s) { return kernels::layernorm_forward(x[s], w, b, kEps); });
                   }});
  // add_layernorm_forward: reads x, y, weight, bias; writes h = x + y, its LayerNorm, mean, rstd.
  cases.push_back(
      {"add_layernorm_forward", "bf16", nc, 4 * kBf16 * kNC + affine + stats, [=](int64_t sets) -> Run {
         Random& r = ws->random();
         const std::vector<Tensor> x = r.normals(sets, {kRows, kWidth}), y = r.normals(sets, {kRows, kWidth});
         const Tensor w = r.ln_weight(), b = r.ln_bias();
         return keeping<kernels::AddLayerNormOutput>(
             sets, [=](int64_t s) { return kernels::add_layernorm_forward(x[s], y[s], w, b, kEps); });
       }});
  // LayerNorm's backward in both designs of its register kernel (kernels/nn_ops.h
  // LayerNormBackwardDesign), until a GPU run decides between them.
  using kernels::LayerNormBackwardDesign;
  for (const auto design : {LayerNormBackwardDesign::kRound, LayerNormBackwardDesign::kPipelined}) {
    const std::string design_text = design == LayerNormBackwardDesign::kRound ? "" : ", pipelined";
    // layernorm_backward, its row kernel and the dweight/dbias column sums: reads dy, x, weight, mean,
    // rstd; writes dx, dweight, dbias.
    cases.push_back(
        {"layernorm_backward", "bf16, dweight+dbias" + design_text, nc,
         3 * kBf16 * kNC + 3 * kBf16 * kWidth + stats, [=](int64_t sets) -> Run {
           Random& r = ws->random();
           const std::vector<Tensor> x = r.normals(sets, {kRows, kWidth}), dy = r.normals(sets, {kRows, kWidth});
           const Tensor w = r.ln_weight(), b = r.ln_bias();
           std::vector<kernels::LayerNormOutput> fwd;
           for (const Tensor& xs : x) {
             fwd.push_back(kernels::layernorm_forward(xs, w, b, kEps));
             fwd.back().y = Tensor();  // only mean and rstd are backward's
           }
           return keeping<kernels::LayerNormGrads>(sets, [=](int64_t s) {
             const DesignScope scope(design);
             return kernels::layernorm_backward(dy[s], x[s], w, fwd[s].mean, fwd[s].rstd);
           });
         }});
    // add_layernorm_backward: reads dy_ln, dh_residual, h, weight, mean, rstd; writes dh, dweight, dbias.
    cases.push_back(
        {"add_layernorm_backward", "bf16, dweight+dbias" + design_text, nc,
         4 * kBf16 * kNC + 3 * kBf16 * kWidth + stats, [=](int64_t sets) -> Run {
           Random& r = ws->random();
           const std::vector<Tensor> dy = r.normals(sets, {kRows, kWidth}), dres = r.normals(sets, {kRows, kWidth});
           const Tensor w = r.ln_weight(), b = r.ln_bias();
           std::vector<kernels::AddLayerNormOutput> fwd;
           for (int64_t s = 0; s < sets; ++s) {
             fwd.push_back(kernels::add_layernorm_forward(r.normal({kRows, kWidth}, DType::bf16),
                                                          r.normal({kRows, kWidth}, DType::bf16), w, b, kEps));
             fwd.back().y = Tensor();  // only h, mean and rstd are backward's
           }
           return keeping<kernels::AddLayerNormGrads>(sets, [=](int64_t s) {
             const DesignScope scope(design);
             return kernels::add_layernorm_backward(dy[s], dres[s], fwd[s].h, w, fwd[s].mean, fwd[s].rstd);
           });
         }});
  }
  // add (the residual add that is not fused): reads a, b; writes a + b.
  cases.push_back(
      {"add", "bf16 (residual)", nc, 3 * kBf16 * kNC, [=](int64_t sets) -> Run {
         Random& r = ws->random();
         const std::vector<Tensor> a = r.normals(sets, {kRows, kWidth}), b = r.normals(sets, {kRows, kWidth});
         return keeping<Tensor>(sets, [=](int64_t s) { return kernels::add(a[s], b[s]); });
       }});

  // ---- GELU ----
  // gelu_forward: reads x, writes y.
  cases.push_back({"gelu_forward", "bf16, erf", nh, 2 * kBf16 * kNH, [=](int64_t sets) -> Run {
                     const std::vector<Tensor> x = ws->random().normals(sets, {kRows, kHidden});
                     return keeping<Tensor>(sets, [=](int64_t s) { return kernels::gelu_forward(x[s], gelu); });
                   }});
  // gelu_backward: reads dy, x; writes dx.
  cases.push_back(
      {"gelu_backward", "bf16, erf", nh, 3 * kBf16 * kNH, [=](int64_t sets) -> Run {
         Random& r = ws->random();
         const std::vector<Tensor> dy = r.normals(sets, {kRows, kHidden}), x = r.normals(sets, {kRows, kHidden});
         return keeping<Tensor>(sets, [=](int64_t s) { return kernels::gelu_backward(dy[s], x[s], gelu); });
       }});

  // ---- the tanh GELU in cuBLASLt's epilogues (--gelu tanh), each beside what it replaces ----
  // fc1 forward: reads x, the weight and the bias; writes pre and the GELU's output. The composition
  // (BIAS epilogue, then gelu_forward) also reads pre back.
  const auto tanh = kernels::GeluApproximation::Tanh;
  const int64_t fc1_bytes = kBf16 * (kNC + kHidden * kWidth + kHidden + 2 * kNH);
  const std::string fc1_shape = nc + " -> " + std::to_string(kHidden);
  cases.push_back({"linear+gelu_forward", "bf16, tanh, BIAS then GELU", fc1_shape, fc1_bytes + kBf16 * kNH,
                   [=](int64_t sets) -> Run {
                     Random& r = ws->random();
                     const std::vector<Tensor> x = r.normals(sets, {kRows, kWidth});
                     const Tensor w = kernels::mul_scalar(r.normal({kHidden, kWidth}, DType::bf16), 0.03),
                                  b = r.normal({kHidden}, DType::bf16);
                     return keeping<Tensor>(sets, [=](int64_t s) {
                       return kernels::gelu_forward(kernels::linear_forward(x[s], w, b), tanh);
                     });
                   },
                   3, false, true});
  cases.push_back({"linear_gelu_forward", "bf16, tanh, GELU_AUX_BIAS", fc1_shape, fc1_bytes,
                   [=](int64_t sets) -> Run {
                     Random& r = ws->random();
                     const std::vector<Tensor> x = r.normals(sets, {kRows, kWidth});
                     const Tensor w = kernels::mul_scalar(r.normal({kHidden, kWidth}, DType::bf16), 0.03),
                                  b = r.normal({kHidden}, DType::bf16);
                     return keeping<kernels::LinearGeluOutput>(
                         sets, [=](int64_t s) { return kernels::linear_gelu_forward(x[s], w, b, tanh); });
                   },
                   2, false, true});
  // fc2 dgrad: reads dy, the weight and pre; writes dpre and fc1's bias gradient. The composition
  // writes dact, reads it back with pre (and fc1's wgrad sums the bias gradient in its BGRADB).
  const int64_t fc2_bytes = kBf16 * (kNC + kWidth * kHidden + 2 * kNH + kHidden);
  const std::string fc2_shape = nc + " -> " + std::to_string(kHidden);
  cases.push_back({"dgrad+gelu_backward", "bf16, tanh, dgrad then dGELU", fc2_shape,
                   fc2_bytes + 2 * kBf16 * kNH, [=](int64_t sets) -> Run {
                     Random& r = ws->random();
                     const std::vector<Tensor> dy = r.normals(sets, {kRows, kWidth}),
                                               pre = r.normals(sets, {kRows, kHidden});
                     const Tensor w = kernels::mul_scalar(r.normal({kWidth, kHidden}, DType::bf16), 0.03);
                     return keeping<Tensor>(sets, [=](int64_t s) {
                       const Tensor dact = kernels::linear_backward(dy[s], pre[s], w, true, false, false).dx;
                       return kernels::gelu_backward(dact, pre[s], tanh);
                     });
                   },
                   3, false, true});
  cases.push_back({"linear_dgelu_backward", "bf16, tanh, DGELU_BGRAD", fc2_shape, fc2_bytes,
                   [=](int64_t sets) -> Run {
                     Random& r = ws->random();
                     const std::vector<Tensor> dy = r.normals(sets, {kRows, kWidth}),
                                               pre = r.normals(sets, {kRows, kHidden});
                     const Tensor w = kernels::mul_scalar(r.normal({kWidth, kHidden}, DType::bf16), 0.03);
                     return keeping<kernels::LinearDgeluGrads>(
                         sets, [=](int64_t s) { return kernels::linear_dgelu_backward(dy[s], pre[s], w, tanh, true); });
                   },
                   2, false, true});

  // ---- FP8 casts (bytes: cast_case) ----
  // Forward activations, E4M3: a Linear's input (proj's, or qkv's and fc1's with the producers off) and
  // the GELU's output (fc2's input, producers off); row-only is a forward without gradients.
  for (const int64_t cols : {kWidth, kHidden}) {
    cases.push_back(cast_case(ws, DType::e4m3, kRows, cols, /*transposed=*/false, /*dbias=*/false, /*weight=*/false));
    cases.push_back(cast_case(ws, DType::e4m3, kRows, cols, /*transposed=*/true, /*dbias=*/false, /*weight=*/false));
  }
  // The weights, E4M3, recast after every optimizer step: qkv, proj, fc1, fc2.
  for (const auto& [out, in] : weights) {
    cases.push_back(cast_case(ws, DType::e4m3, out, in, /*transposed=*/true, /*dbias=*/false, /*weight=*/true));
  }
  // Output gradients, E5M2, with the bias gradient: fc2's and proj's (width 1280), qkv's (3840), and fc1's
  // (5120) with the producers off; without dbias as nn::set_fp8_fused_bias_grad(false) casts.
  cases.push_back(cast_case(ws, DType::e5m2, kRows, kWidth, /*transposed=*/true, /*dbias=*/false, /*weight=*/false));
  for (const int64_t cols : {kWidth, kQkv, kHidden}) {
    cases.push_back(cast_case(ws, DType::e5m2, kRows, cols, /*transposed=*/true, /*dbias=*/true, /*weight=*/false));
  }

  // ---- the fused FP8 producers (--fp8-fused-producers on) ----
  // layernorm_fp8_forward (qkv's input): reads x, weight, bias, scale; writes both FP8 copies, mean,
  // rstd, amax, scale_inv.
  cases.push_back({"layernorm_fp8_forward", "e4m3 row+T", nc,
                   kBf16 * kNC + 2 * kFp8 * kNC + affine + stats + kCastScalars, [=](int64_t sets) -> Run {
                     Random& r = ws->random();
                     const std::vector<Tensor> x = r.normals(sets, {kRows, kWidth});
                     const Tensor w = r.ln_weight(), b = r.ln_bias();
                     const Fp8Slots f = fp8_slots(DType::e4m3, ws->device);
                     return keeping<kernels::LayerNormFp8>(sets, [=](int64_t s) {
                       return kernels::layernorm_fp8_forward(x[s], w, b, kEps, f.scale, f.amax, DType::e4m3, true,
                                                             true);
                     });
                   }});
  // add_layernorm_fp8_forward (fc1's input): reads x, y, weight, bias, scale; writes h, both FP8
  // copies, mean, rstd, amax, scale_inv.
  cases.push_back(
      {"add_layernorm_fp8_forward", "e4m3 row+T", nc, 3 * kBf16 * kNC + 2 * kFp8 * kNC + affine + stats + kCastScalars,
       [=](int64_t sets) -> Run {
         Random& r = ws->random();
         const std::vector<Tensor> x = r.normals(sets, {kRows, kWidth}), y = r.normals(sets, {kRows, kWidth});
         const Tensor w = r.ln_weight(), b = r.ln_bias();
         const Fp8Slots f = fp8_slots(DType::e4m3, ws->device);
         return keeping<kernels::LayerNormFp8>(sets, [=](int64_t s) {
           return kernels::add_layernorm_fp8_forward(x[s], y[s], w, b, kEps, f.scale, f.amax, DType::e4m3, true, true);
         });
       }});
  // gelu_fp8_forward (fc2's input): reads x, scale; writes both FP8 copies, amax, scale_inv.
  cases.push_back({"gelu_fp8_forward", "e4m3 row+T, erf", nh, kBf16 * kNH + 2 * kFp8 * kNH + kCastScalars,
                   [=](int64_t sets) -> Run {
                     const std::vector<Tensor> x = ws->random().normals(sets, {kRows, kHidden});
                     const Fp8Slots f = fp8_slots(DType::e4m3, ws->device);
                     return keeping<kernels::Fp8Cast>(sets, [=](int64_t s) {
                       return kernels::gelu_fp8_forward(x[s], gelu, f.scale, f.amax, DType::e4m3, true, true);
                     });
                   }});
  // dgelu_fp8_cast_dbias (fc1's output gradient): reads dact, x, scale; writes both FP8 copies, fc1's
  // bf16 bias gradient, amax, scale_inv.
  cases.push_back(
      {"dgelu_fp8_cast_dbias", "e5m2 row+T, dbias bf16", nh,
       2 * kBf16 * kNH + 2 * kFp8 * kNH + kBf16 * kHidden + kCastScalars, [=](int64_t sets) -> Run {
         Random& r = ws->random();
         const std::vector<Tensor> dact = r.normals(sets, {kRows, kHidden}), x = r.normals(sets, {kRows, kHidden});
         const Fp8Slots f = fp8_slots(DType::e5m2, ws->device);
         return keeping<kernels::Fp8CastWithBiasGrad>(sets, [=](int64_t s) {
           return kernels::dgelu_fp8_cast_dbias(dact[s], x[s], gelu, f.scale, f.amax, DType::e5m2, true, true,
                                                DType::bf16);
         });
       }});

  // ---- amax alone: every weight's before its cast, and an activation's under current scaling ----
  for (const auto& [out, in] : weights) {
    cases.push_back(amax_case(ws, out, in, "bf16 weight"));
  }
  cases.push_back(amax_case(ws, kRows, kWidth, "bf16"));
  cases.push_back(amax_case(ws, kRows, kHidden, "bf16"));

  // ---- the optimizers over ViT-H's 392 parameters, one multi-tensor call per list as optim/ makes it ----
  const int64_t params = ws->parameter_count();
  const std::string all = std::to_string(ws->shapes.size()) + " tensors, " + std::to_string(params) + " params";
  // sgd_step_multi_ (optim::SGD(params, 1e-3, momentum 0.9) after its first step: one list): per
  // parameter reads g (bf16), master, momentum; writes master, momentum and the bf16 parameter: 20 bytes.
  cases.push_back({"sgd_step_multi_", "momentum, bf16 + f32 master", all, 20 * params,
                   [=](int64_t) -> Run {
                     Parameters& p = ws->parameters();
                     std::vector<kernels::SgdTensors> list;
                     for (size_t i = 0; i < p.param.size(); ++i) {
                       list.push_back({p.param[i], p.grad[i], p.exp_avg[i], p.master[i]});
                     }
                     return [list](int64_t) {
                       kernels::sgd_step_multi_(list, 1e-3, 0.9, 0.0, /*nesterov=*/false, 0.0, /*first_step=*/false);
                     };
                   },
                   64, /*one_set=*/true});
  // adamw_step_multi_ (optim::AdamW over optim::weight_decay_groups, weight decay 0.05: two lists, two
  // calls): per parameter reads g (bf16), master, exp_avg, exp_avg_sq; writes master, exp_avg,
  // exp_avg_sq and the bf16 parameter: 28 bytes.
  cases.push_back({"adamw_step_multi_", "bf16 + f32 master, 2 groups", all, 28 * params,
                   [=](int64_t) -> Run {
                     Parameters& p = ws->parameters();
                     std::vector<kernels::AdamWTensors> no_decay, decay;
                     for (size_t i = 0; i < p.param.size(); ++i) {
                       (optim::is_weight_decayed(p.names[i], p.param[i]) ? decay : no_decay)
                           .push_back({p.param[i], p.grad[i], p.exp_avg[i], p.exp_avg_sq[i], p.master[i]});
                     }
                     return [no_decay, decay](int64_t) {
                       kernels::adamw_step_multi_(no_decay, 1e-3, 0.9, 0.999, 1e-8, 0.0, /*step=*/10);
                       kernels::adamw_step_multi_(decay, 1e-3, 0.9, 0.999, 1e-8, 0.05, /*step=*/10);
                     };
                   },
                   96, /*one_set=*/true});

  // ---- converts and fills ----
  // Tensor::to between bf16 and f32: reads 2 and writes 4 bytes per element, or the reverse.
  cases.push_back({"Tensor::to", "bf16->f32", nc, (kBf16 + kF32) * kNC, [=](int64_t sets) -> Run {
                     const std::vector<Tensor> x = ws->random().normals(sets, {kRows, kWidth}, DType::bf16);
                     return keeping<Tensor>(sets, [=](int64_t s) { return x[s].to(DType::f32); });
                   }});
  cases.push_back({"Tensor::to", "f32->bf16", nc, (kBf16 + kF32) * kNC, [=](int64_t sets) -> Run {
                     const std::vector<Tensor> x = ws->random().normals(sets, {kRows, kWidth}, DType::f32);
                     return keeping<Tensor>(sets, [=](int64_t s) { return x[s].to(DType::bf16); });
                   }});
  // The first optimizer step's f32 masters (optim/optimizer.cpp): every bf16 parameter widened into
  // its master, allocated beforehand as the optimizer allocates them, by one multi-tensor call (one
  // launch; it was 392 Tensor::to launches, one per parameter, which the second GPU run still timed
  // here: 2125 µs, 0.43 of the copy). 2.5 GB of masters, far beyond L2.
  cases.push_back({"widen_to_f32_multi_", "bf16->f32, every parameter", all, (kBf16 + kF32) * params,
                   [=](int64_t) -> Run {
                     const std::vector<Tensor> param = ws->parameters().param;
                     std::vector<Tensor> masters;
                     for (const Tensor& p : param) masters.push_back(empty(p.shape(), DType::f32, p.device()));
                     return [param, masters](int64_t) { kernels::widen_to_f32_multi_(param, masters); };
                   },
                   1, /*one_set=*/true});
  // Tensor::fill_ of f32 with 1.0 (not a byte pattern, so fill_words rather than a memset): writes 4
  // bytes per element. The step's are the FP8 scales' ones, 2 elements (launch-bound), here also at an
  // activation's size for the kernel's bandwidth.
  cases.push_back({"Tensor::fill_", "f32 1.0 (fill_words)", "2", 2 * kF32,
                   [=](int64_t) -> Run {
                     const Tensor t = empty({2}, DType::f32, ws->device);
                     return [t](int64_t) { t.fill_(1.0); };
                   },
                   1, /*one_set=*/true});
  cases.push_back({"Tensor::fill_", "f32 1.0 (fill_words)", nc, kF32 * kNC, [=](int64_t sets) -> Run {
                     std::vector<Tensor> t;
                     for (int64_t s = 0; s < sets; ++s) t.push_back(empty({kRows, kWidth}, DType::f32, ws->device));
                     return [t, sets](int64_t i) { t[static_cast<size_t>(i % sets)].fill_(1.0); };
                   }});
  return cases;
}

// ---- timing (CUDA builds) ---------------------------------------------------------------------------------

#if OCTET_HAS_CUDA

// Holds the stream until the host has queued a batch of runs. Gives up after 2 s, so that an entry point
// that waits for the device (a host sync), or a launch queue too full to take the batch, cannot hang the
// benchmark; the timer then queues every later run without a gate, and those times may include the host's.
struct Gate {
  std::atomic<bool> open{false}, gave_up{false};
};
void CUDART_CB hold_until_open(void* arg) {
  auto* gate = static_cast<Gate*>(arg);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!gate->open.load(std::memory_order_acquire)) {
    if (std::chrono::steady_clock::now() > deadline) {
      gate->gave_up.store(true);
      return;
    }
    std::this_thread::yield();
  }
}

class Timer {
 public:
  Timer(int device, int warmup, int reps) : stream_(octet::cuda::launch_stream(device)), warmup_(warmup), reps_(reps) {
    for (int i = 0; i <= kMaxBatch; ++i) events_.push_back(std::make_unique<octet::cuda::Event>(/*timing=*/true));
  }
  // Microseconds of each timed run of `run`, which makes at most `launches` launches.
  std::vector<double> time(const Run& run, int launches) {
    for (int i = 0; i < warmup_; ++i) run(i);
    octet::cuda::check(cudaStreamSynchronize(stream_), "bench_kernels: warm-up");
    // At most ~256 launches queued behind the gate: a full launch queue would block the host.
    const int batch = std::clamp(kQueuedLaunches / std::max(launches, 1), 1, kMaxBatch);
    std::vector<double> us;
    for (int done = 0; done < reps_;) {
      const int n = std::min(batch, reps_ - done);
      Gate gate;
      if (gated_) {
        octet::cuda::check(cudaLaunchHostFunc(stream_, hold_until_open, &gate), "cudaLaunchHostFunc");
      } else {
        host_paced_ = true;
      }
      try {
        events_[0]->record(stream_);
        for (int k = 0; k < n; ++k) {
          run(warmup_ + done + k);
          events_[static_cast<size_t>(k + 1)]->record(stream_);
        }
      } catch (...) {
        gate.open.store(true, std::memory_order_release);
        cudaStreamSynchronize(stream_);
        throw;
      }
      gate.open.store(true, std::memory_order_release);
      events_[static_cast<size_t>(n)]->synchronize();
      if (gate.gave_up.load()) {
        gated_ = false;
        host_paced_ = true;
        logging::warn(
            "bench_kernels: the stream waited 2 s for the host to queue {} run(s) of {} launch(es); the "
            "remaining runs are queued without a gate, and their times may include the host's",
            n, launches);
      }
      for (int k = 0; k < n; ++k) {
        us.push_back(1e3 * events_[static_cast<size_t>(k + 1)]->elapsed_ms(*events_[static_cast<size_t>(k)]));
      }
      done += n;
    }
    return us;
  }
  // Whether some run since the last call was queued without a gate, or behind one that gave up.
  bool take_host_paced() { return std::exchange(host_paced_, false); }

 private:
  static constexpr int kMaxBatch = 32, kQueuedLaunches = 256;
  cudaStream_t stream_;
  int warmup_, reps_;
  std::vector<std::unique_ptr<octet::cuda::Event>> events_;
  bool gated_ = true, host_paced_ = false;
};

// cudaMemcpyAsync device to device between two 512 MiB regions: a copy of bytes/2 moves `bytes`.
class CopyReference {
 public:
  static constexpr int64_t kRegion = int64_t{512} << 20;
  explicit CopyReference(Device device)
      : src_(empty({kRegion}, DType::u8, device)),
        dst_(empty({kRegion}, DType::u8, device)),
        stream_(octet::cuda::current_stream(device.index)) {
    src_.fill_(1.0);
    dst_.zero_();
  }
  // Copies bytes/2 (rounded down to 16, at least 16) per run, from an offset that moves on by the copy's size every
  // run (wrapping around the region), in pieces of at most the region.
  Run copying(int64_t bytes) const {
    const int64_t half = std::max<int64_t>(16, bytes / 2 / 16 * 16);
    auto* src = static_cast<const char*>(src_.data_ptr());
    auto* dst = static_cast<char*>(dst_.data_ptr());
    cudaStream_t stream = stream_;
    return [=](int64_t i) {
      for (int64_t left = half; left > 0;) {
        const int64_t piece = std::min(left, kRegion);
        const int64_t stride = (piece + 4095) / 4096 * 4096;
        const int64_t offset = piece == kRegion ? 0 : (i * stride) % (kRegion - piece) / 256 * 256;
        octet::cuda::check(
            cudaMemcpyAsync(dst + offset, src + offset, static_cast<size_t>(piece), cudaMemcpyDeviceToDevice, stream),
            "bench_kernels: the reference copy");
        left -= piece;
      }
    };
  }
  static int launches(int64_t bytes) { return static_cast<int>(bytes / 2 / kRegion + 1); }

 private:
  Tensor src_, dst_;
  cudaStream_t stream_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Options {
  int reps = 30, warmup = 3;
  bool json_only = false;
};

// --profile: each row prepared, run once to warm up (its first launch may load the module), then run
// once more with the profiler on. Nothing is timed here: the profiler measures the launches it sees.
int profile_cases(const std::vector<Case>& cases, const std::shared_ptr<Workspace>& ws) {
  for (const Case& c : cases) {
    const Run run = c.prepare(2);
    run(0);
    octet::cuda::synchronize(ws->device.index);
    octet::cuda::check(cudaProfilerStart(), "cudaProfilerStart");
    run(1);
    octet::cuda::synchronize(ws->device.index);
    octet::cuda::check(cudaProfilerStop(), "cudaProfilerStop");
    std::printf("profiled: %s (%lld bytes in its budget)\n", c.label().c_str(), static_cast<long long>(c.bytes));
    std::fflush(stdout);
  }
  return 0;
}

int time_cases(const std::vector<Case>& cases, const std::shared_ptr<Workspace>& ws, const Options& o) {
  const int device = ws->device.index;
  cudaDeviceProp props{};
  octet::cuda::check(cudaGetDeviceProperties(&props, device), "cudaGetDeviceProperties");
  const int64_t l2 = props.l2CacheSize;
  Timer timer(device, o.warmup, o.reps);
  const CopyReference copy(ws->device);

  // The copy's own rate, the ceiling the rows are held to.
  const double peak_copy_us = median(timer.time(copy.copying(CopyReference::kRegion), 1));
  timer.take_host_paced();
  const bool text = !o.json_only;
  if (text) {
    std::printf(
        "bench_kernels: the memory-bound kernels of a ViT-H/16 training step at batch 64: %lld tokens of width "
        "%lld (MLP %lld, qkv %lld), bf16 activations\n",
        static_cast<long long>(kRows), static_cast<long long>(kWidth), static_cast<long long>(kHidden),
        static_cast<long long>(kQkv));
    std::printf(
        "device: %s, %d SMs, L2 %.1f MB, %.1f GiB; a %lld MiB device-to-device copy moves %.0f GB/s "
        "(read + written)\n",
        props.name, props.multiProcessorCount, static_cast<double>(l2) / 1e6,
        static_cast<double>(props.totalGlobalMem) / (1 << 30), static_cast<long long>(CopyReference::kRegion >> 21),
        static_cast<double>(CopyReference::kRegion) / peak_copy_us / 1e3);
    std::printf(
        "µs: the median of %d runs after %d warm-ups, CUDA events between runs that execute back to back; a "
        "row's inputs rotate over `sets` copies (sets x bytes >= 4 x L2): no run reads from L2 what an earlier "
        "run left there\n",
        o.reps, o.warmup);
    std::printf(
        "MB: the byte budget, each input read once and each output written once (1 MB = 1e6 bytes); GB/s = "
        "bytes / time\n");
    std::printf(
        "copy: cudaMemcpyAsync device-to-device of bytes/2 in the same run, which reads bytes/2 and writes "
        "bytes/2: the same bytes moved, its GB/s counted the same way; ratio = copy µs / kernel µs = kernel "
        "GB/s / copy GB/s (target %.2f)\n\n",
        kTarget);
    // "µs" is one column wide and two bytes long: its fields are one wider.
    std::printf("%-26s %-32s %-26s %10s %9s %7s %10s %7s %6s %4s\n", "kernel", "variant", "shape", "µs", "MB", "GB/s",
                "copy µs", "copy", "ratio", "sets");
  }

  std::vector<nlohmann::json> rows;
  double worst = 1e300;
  std::string worst_label;
  int counted = 0, under = 0, launch_bound = 0, gemms = 0;
  for (const Case& c : cases) {
    const int64_t sets = c.one_set ? 1 : std::clamp<int64_t>((4 * l2 + c.bytes - 1) / c.bytes, 2, 64);
    std::vector<double> us, copy_us;
    {
      const Run run = c.prepare(sets);
      us = timer.time(run, c.launches);
    }  // the row's inputs and outputs go back to the pool before the next row
    copy_us = timer.time(copy.copying(c.bytes), CopyReference::launches(c.bytes));
    const bool host_paced = timer.take_host_paced();
    const double t = median(us), tc = median(copy_us);
    const double gbps = static_cast<double>(c.bytes) / t / 1e3, copy_gbps = static_cast<double>(c.bytes) / tc / 1e3;
    const double ratio = tc / t;
    const bool tiny = c.bytes < kLaunchBound;
    if (tiny) {
      ++launch_bound;
    } else if (c.gemm) {
      ++gemms;
    } else {
      ++counted;
      if (ratio < kTarget) ++under;
      if (ratio < worst) worst = ratio, worst_label = c.label();
    }
    if (text) {
      std::printf("%-26s %-32s %-26s %9.1f %9.2f %7.0f %9.1f %7.0f %6.2f %4lld%s%s\n", c.kernel.c_str(),
                  c.variant.c_str(), c.shape.c_str(), t, static_cast<double>(c.bytes) / 1e6, gbps, tc, copy_gbps, ratio,
                  static_cast<long long>(sets),
                  tiny ? "  (launch-bound: not counted)" : c.gemm ? "  (GEMM: compute-bound, not counted)" : "",
                  host_paced ? "  (host-paced: may include host time)" : "");
      std::fflush(stdout);
    }
    rows.push_back({{"bench", "bench_kernels"},
                    {"kernel", c.kernel},
                    {"variant", c.variant},
                    {"shape", c.shape},
                    {"us", t},
                    {"us_min", *std::min_element(us.begin(), us.end())},
                    {"bytes", c.bytes},
                    {"gbps", gbps},
                    {"copy_us", tc},
                    {"copy_gbps", copy_gbps},
                    {"ratio", ratio},
                    {"runs", us.size()},
                    {"sets", sets},
                    {"launch_bound", tiny},
                    {"gemm", c.gemm},
                    {"host_paced", host_paced}});
  }
  if (text) std::printf("\n");
  for (const nlohmann::json& row : rows) std::printf("%s\n", row.dump().c_str());
  if (text && counted > 0) {
    std::printf("worst ratio %.2f (%s); %d of %d kernels under the %.2f target (%d launch-bound row%s and %d GEMM "
                "row%s not counted)\n",
                worst, worst_label.c_str(), under, counted, kTarget, launch_bound, launch_bound == 1 ? "" : "s", gemms,
                gemms == 1 ? "" : "s");
  }
  const nlohmann::json summary = {{"bench", "bench_kernels"},
                                  {"summary", true},
                                  {"device", props.name},
                                  {"kernels", counted},
                                  {"under_target", under},
                                  {"target", kTarget},
                                  {"worst_ratio", counted > 0 ? nlohmann::json(worst) : nlohmann::json(nullptr)},
                                  {"worst", worst_label},
                                  {"copy_gbps", static_cast<double>(CopyReference::kRegion) / peak_copy_us / 1e3}};
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}

#endif  // OCTET_HAS_CUDA

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "bench_kernels: the memory-bound kernels of a ViT-H/16 training step (batch 64) against a "
      "device-to-device copy of the same bytes"};
  std::vector<std::string> filters;
  int reps = 30, warmup = 3;
  bool json_only = false, list = false, profile = false;
  app.add_option("--filter", filters,
                 "only the rows whose label (kernel, variant and shape, as --list shows them) contains this text; "
                 "repeat it for the rows that match any");
  app.add_option("--reps", reps, "timed runs per row (the median is reported)")
      ->check(CLI::Range(20, 1000))
      ->capture_default_str();
  app.add_option("--warmup", warmup, "untimed runs first")->check(CLI::Range(1, 100))->capture_default_str();
  app.add_flag("--json-only", json_only, "print only the JSON lines (one per row, then the summary)");
  app.add_flag("--list", list, "list the rows and their byte budgets without timing anything (no GPU needed)");
  app.add_flag("--profile", profile,
               "run each row once more between cudaProfilerStart and cudaProfilerStop, untimed, for a profiler "
               "started with profiling off (ncu --profile-from-start off)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // Without a device there is nothing to time (--list needs none).
#if OCTET_HAS_CUDA
  const char* no_device = cuda::is_available() ? nullptr : "this CUDA build sees no GPU";
#else
  const char* no_device = "this is a CPU-only build";
#endif
  if (no_device != nullptr && !list) {
    std::printf("bench_kernels: skipped: no CUDA device/build (%s)\n", no_device);
    return 0;
  }
  try {
    const auto ws = std::make_shared<Workspace>();
    std::vector<Case> cases;
    for (Case& c : step_cases(ws)) {
      const bool match = filters.empty() || std::any_of(filters.begin(), filters.end(), [&](const std::string& f) {
                           return c.label().find(f) != std::string::npos;
                         });
      if (match) cases.push_back(std::move(c));
    }
    if (cases.empty()) {
      std::string given;
      for (const std::string& f : filters) given += " '" + f + "'";
      logging::error("bench_kernels: no row matches --filter{}; --list shows them", given);
      return 2;
    }
    if (list) {
      std::printf("%-26s %-32s %-26s %14s\n", "kernel", "variant", "shape", "bytes");
      for (const Case& c : cases) {
        std::printf("%-26s %-32s %-26s %14lld\n", c.kernel.c_str(), c.variant.c_str(), c.shape.c_str(),
                    static_cast<long long>(c.bytes));
      }
      return 0;
    }
#if OCTET_HAS_CUDA
    if (profile) return profile_cases(cases, ws);
    return time_cases(cases, ws, {.reps = reps, .warmup = warmup, .json_only = json_only});
#else
    return 0;  // not reached: a CPU-only build skipped above
#endif
  } catch (const std::exception& e) {
    logging::error("{}", e.what());
    return 1;
  }
}
