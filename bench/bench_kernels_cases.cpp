// The rows of bench_kernels (bench/bench_kernels_cases.h): the step's memory-bound kernels at ViT-H/16's
// batch-64 shapes, each with its byte budget in the comment beside it. bench/bench_kernels.cpp says
// how a row is timed and what its byte budget counts.
#include "bench/bench_kernels_cases.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"
#include "kernels/elementwise.h"
#include "kernels/fp8.h"
#include "kernels/autotune.h"
#include "kernels/linear.h"
#include "kernels/nn_ops.h"
#include "kernels/optimizers.h"
#include "kernels/reduce.h"
#include "models/vit.h"
#include "optim/param_groups.h"

namespace octet::bench {
namespace {

std::string dims(int64_t a, int64_t b) { return std::to_string(a) + "x" + std::to_string(b); }


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

}  // namespace

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

namespace {

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
// amax and writes scale_inv (12), a weight's too (under delayed scaling, the default, the cast records
// the weight's amax; current scaling measures it first, the amax rows below); dbias writes cols bf16
// column sums.
Case cast_case(const std::shared_ptr<Workspace>& ws, DType fp8_dtype, int64_t rows, int64_t cols, bool transposed,
               bool dbias, bool weight) {
  const int64_t copies = transposed ? 2 : 1;
  std::string variant = std::string(fp8_name(fp8_dtype)) + (transposed ? " row+T" : " row");
  if (weight) variant += ", weight";
  if (dbias) variant += ", dbias bf16";
  const int64_t bytes = kBf16 * rows * cols + copies * kFp8 * rows * cols + kCastScalars + (dbias ? kBf16 * cols : 0);
  return {dbias ? "fp8_cast_dbias" : "fp8_cast", variant, dims(rows, cols), bytes, [=](int64_t sets) -> Run {
            const std::vector<Tensor> x = ws->random().normals(sets, {rows, cols});
            const Fp8Slots slots = fp8_slots(fp8_dtype, ws->device);
            const Tensor amax = slots.amax;
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

}  // namespace

std::shared_ptr<Workspace> make_workspace(Device device) {
  auto ws = std::make_shared<Workspace>();
  ws->device = device;
  return ws;
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
  // layernorm_backward, its row kernel and the dweight/dbias column sums: reads dy, x, weight, mean,
  // rstd; writes dx, dweight, dbias.
  // Each again without the affine weight: dx alone, no dweight and dbias (no shared slots, partial
  // rows or column sums), so that the difference is what summing them costs in the pass.
  for (const bool with_weight : {true, false}) {
    const std::string variant = with_weight ? "bf16, dweight+dbias" : "bf16, dx alone (no weight)";
    cases.push_back(
        {"layernorm_backward", variant, nc,
         3 * kBf16 * kNC + (with_weight ? 3 * kBf16 * kWidth : 0) + stats, [=](int64_t sets) -> Run {
           Random& r = ws->random();
           const std::vector<Tensor> x = r.normals(sets, {kRows, kWidth}), dy = r.normals(sets, {kRows, kWidth});
           const Tensor w = r.ln_weight(), b = r.ln_bias();
           std::vector<kernels::LayerNormOutput> fwd;
           for (const Tensor& xs : x) {
             fwd.push_back(kernels::layernorm_forward(xs, w, b, kEps));
             fwd.back().y = Tensor();  // only mean and rstd are backward's
           }
           const Tensor weight = with_weight ? w : Tensor();
           return keeping<kernels::LayerNormGrads>(sets, [=](int64_t s) {
             return kernels::layernorm_backward(dy[s], x[s], weight, fwd[s].mean, fwd[s].rstd);
           });
         }});
  }
  // add_layernorm_backward: reads dy_ln, dh_residual, h, weight, mean, rstd; writes dh, dweight, dbias.
  for (const bool with_weight : {true, false}) {
    const std::string variant = with_weight ? "bf16, dweight+dbias" : "bf16, dx alone (no weight)";
    cases.push_back(
        {"add_layernorm_backward", variant, nc,
         4 * kBf16 * kNC + (with_weight ? 3 * kBf16 * kWidth : 0) + stats, [=](int64_t sets) -> Run {
           Random& r = ws->random();
           const std::vector<Tensor> dy = r.normals(sets, {kRows, kWidth}), dres = r.normals(sets, {kRows, kWidth});
           const Tensor w = r.ln_weight(), b = r.ln_bias();
           std::vector<kernels::AddLayerNormOutput> fwd;
           for (int64_t s = 0; s < sets; ++s) {
             fwd.push_back(kernels::add_layernorm_forward(r.normal({kRows, kWidth}, DType::bf16),
                                                          r.normal({kRows, kWidth}, DType::bf16), w, b, kEps));
             fwd.back().y = Tensor();  // only h, mean and rstd are backward's
           }
           const Tensor weight = with_weight ? w : Tensor();
           return keeping<kernels::AddLayerNormGrads>(sets, [=](int64_t s) {
             return kernels::add_layernorm_backward(dy[s], dres[s], fwd[s].h, weight, fwd[s].mean, fwd[s].rstd);
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
  // gelu_backward_and_forward, what the MLP's backward runs (autograd's gelu_linear: dpre and the GELU's
  // output again for fc2's weight gradient): reads dy, x; writes dx, y. It replaces the two rows above
  // (645.5 MB) with 516.4 MB. (Not over dy here: each run must leave its inputs as they were.)
  cases.push_back(
      {"gelu_backward_and_forward", "bf16, erf", nh, 4 * kBf16 * kNH, [=](int64_t sets) -> Run {
         Random& r = ws->random();
         const std::vector<Tensor> dy = r.normals(sets, {kRows, kHidden}), x = r.normals(sets, {kRows, kHidden});
         return keeping<kernels::GeluGradAndOutput>(
             sets, [=](int64_t s) { return kernels::gelu_backward_and_forward(dy[s], x[s], gelu); });
       }});

  // With fc1's bias gradient summed in the same pass (what linear_gelu_linear's backward runs): the row
  // above plus dbias written (the per-64-row partial sums, 4.0 MB written and read back, are scratch).
  cases.push_back(
      {"gelu_backward_and_forward", "bf16, erf, with dbias", nh, 4 * kBf16 * kNH + kBf16 * kHidden,
       [=](int64_t sets) -> Run {
         Random& r = ws->random();
         const std::vector<Tensor> dy = r.normals(sets, {kRows, kHidden}), x = r.normals(sets, {kRows, kHidden});
         return keeping<kernels::GeluGradAndOutput>(sets, [=](int64_t s) {
           return kernels::gelu_backward_and_forward(dy[s], x[s], gelu, false, DType::bf16);
         });
       }});
  // What that sum replaces: fc1's wgrad GEMM with cuBLASLt's BGRADB epilogue (its own kernel reads dpre
  // again) against the GEMM alone; then fc1's and fc2's wgrad GEMMs with cuBLASLt's heuristic algorithm
  // and with the fastest of its candidates (--autotune on, kernels/autotune.h; the first,
  // untimed run tunes). Then the other bias gradients, qkv's (3840 wide) and proj's (1280, as fc2's),
  // in both designs of kernels/linear.h (LinearBiasGradDesign: BGRADB, or the GEMM then Octet's column
  // sum) beside the GEMM alone; the "sum" rows below time that column sum by itself. Each reads dy and
  // x and writes the weight gradient (and the bias's).
  enum class Dbias { kNone, kEpilogue, kColumnSum };
  struct Wgrad {
    const char* linear;
    int64_t out, in;
    Dbias dbias;
    bool autotune;
  };
  for (const Wgrad g : {Wgrad{"fc1", kHidden, kWidth, Dbias::kEpilogue, false},
                        Wgrad{"fc1", kHidden, kWidth, Dbias::kNone, false}, Wgrad{"fc1", kHidden, kWidth, Dbias::kNone, true},
                        Wgrad{"fc2", kWidth, kHidden, Dbias::kNone, false}, Wgrad{"fc2", kWidth, kHidden, Dbias::kNone, true},
                        Wgrad{"qkv", kQkv, kWidth, Dbias::kEpilogue, false},
                        Wgrad{"qkv", kQkv, kWidth, Dbias::kColumnSum, false}, Wgrad{"qkv", kQkv, kWidth, Dbias::kNone, false},
                        Wgrad{"proj", kWidth, kWidth, Dbias::kEpilogue, false},
                        Wgrad{"proj", kWidth, kWidth, Dbias::kColumnSum, false},
                        Wgrad{"proj", kWidth, kWidth, Dbias::kNone, false}}) {
    const std::string variant = std::string(g.dbias == Dbias::kEpilogue    ? "bf16, BGRADB epilogue"
                                            : g.dbias == Dbias::kColumnSum ? "bf16, GEMM then column sum"
                                                                           : "bf16, no bias gradient") +
                                (g.autotune ? ", autotune" : "");
    const std::string shape =
        std::to_string(g.out) + " x " + std::to_string(g.in) + " over " + std::to_string(kRows) + " rows";
    const bool need_dbias = g.dbias != Dbias::kNone;
    const int64_t bytes = kBf16 * (kRows * (g.out + g.in) + g.out * g.in + (need_dbias ? g.out : 0));
    const kernels::LinearBiasGradDesign design = g.dbias == Dbias::kColumnSum
                                                     ? kernels::LinearBiasGradDesign::kColumnSum
                                                     : kernels::LinearBiasGradDesign::kEpilogue;
    cases.push_back({"linear_backward (" + std::string(g.linear) + " wgrad)", variant, shape, bytes,
                     [=](int64_t sets) -> Run {
                       Random& r = ws->random();
                       const std::vector<Tensor> dy = r.normals(sets, {kRows, g.out}), x = r.normals(sets, {kRows, g.in});
                       const Tensor w = r.normal({g.out, g.in}, DType::bf16);
                       return keeping<kernels::LinearGrads>(sets, [=](int64_t s) {
                         // Autotuning and the bias gradient's design are the process's switches: set for
                         // this row's calls only.
                         const kernels::LinearBiasGradDesign before = kernels::linear_bias_grad_design();
                         kernels::set_autotune(g.autotune);
                         kernels::set_linear_bias_grad_design(design);
                         kernels::LinearGrads grads = kernels::linear_backward(dy[s], x[s], w, false, true, need_dbias);
                         kernels::set_linear_bias_grad_design(before);
                         kernels::set_autotune(false);
                         return grads;
                       });
                     },
                     3, false, true});
  }
  // kernels::sum over dy's rows, the column sum of LinearBiasGradDesign::kColumnSum (kernels/cuda/reduce.cu,
  // its band partials then their sum: two launches): reads dy, writes the bf16 column sums (the f32
  // partials, 4 bytes per column per band, are scratch).
  for (const int64_t width : {kWidth, kQkv, kHidden}) {
    cases.push_back({"sum", "bf16, over the rows (dbias)", dims(kRows, width),
                     kBf16 * (kRows * width + width), [=](int64_t sets) -> Run {
                       const std::vector<Tensor> dy = ws->random().normals(sets, {kRows, width});
                       return keeping<Tensor>(sets, [=](int64_t s) { return kernels::sum(dy[s], 0); });
                     }});
  }

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
  // fc2 dgrad then the GELU backward (kernels::linear_dgelu_backward, what the tanh MLP's backward
  // runs): reads dy, the weight and pre, writes dpre, and writes dact and reads it back in between.
  // (A row for cuBLASLt's DGELU_BGRAD, which does it in one GEMM, stood beside it until an H200 timed
  // it at 697 µs against this row's 336: kernels/cuda/gemm_cuda.h.)
  const int64_t fc2_bytes = kBf16 * (kNC + kWidth * kHidden + 2 * kNH);
  const std::string fc2_shape = nc + " -> " + std::to_string(kHidden);
  cases.push_back({"dgrad+gelu_backward", "bf16, tanh, dgrad then dGELU", fc2_shape,
                   fc2_bytes + 2 * kBf16 * kNH, [=](int64_t sets) -> Run {
                     Random& r = ws->random();
                     const std::vector<Tensor> dy = r.normals(sets, {kRows, kWidth}),
                                               pre = r.normals(sets, {kRows, kHidden});
                     const Tensor w = kernels::mul_scalar(r.normal({kWidth, kHidden}, DType::bf16), 0.03);
                     return keeping<Tensor>(
                         sets, [=](int64_t s) { return kernels::linear_dgelu_backward(dy[s], pre[s], w, tanh); });
                   },
                   3, false, true});

  // ---- the block's first residual add, h = x + proj(heads), and norm2 on h ----
  // In norm2 (what the block runs where drop path is on): proj's GEMM reads heads, the weight and the
  // bias and writes y; add_layernorm_forward reads x and y and writes h and LN(h). In proj's GEMM (the
  // block's path since the third GPU run): the GEMM also reads x as C and writes h; layernorm_forward
  // reads h and writes LN(h). 32.3 MB less; the rows say what the C read costs the GEMM. Up to 3
  // launches a run: a split-K GEMM, or the add apart where cuBLASLt refuses C.
  const int64_t proj_gemm = kBf16 * (2 * kNC + kWidth * kWidth + kWidth);
  const std::string proj_shape = nc + " -> " + std::to_string(kWidth);
  struct ProjInputs {
    std::vector<Tensor> heads, x;  // proj's input and the residual, `sets` of each
    Tensor w, b, lw, lb;           // proj's weight and bias, norm2's
  };
  const auto proj_inputs = [ws](int64_t sets) {
    Random& r = ws->random();
    return ProjInputs{r.normals(sets, {kRows, kWidth}), r.normals(sets, {kRows, kWidth}),
                      kernels::mul_scalar(r.normal({kWidth, kWidth}, DType::bf16), 0.03),
                      r.normal({kWidth}, DType::bf16), r.ln_weight(), r.ln_bias()};
  };
  cases.push_back({"linear+add_layernorm_forward", "bf16, the add in norm2", proj_shape,
                   proj_gemm + 4 * kBf16 * kNC + affine + stats,
                   [=](int64_t sets) -> Run {
                     const ProjInputs in = proj_inputs(sets);
                     return keeping<kernels::AddLayerNormOutput>(sets, [=](int64_t s) {
                       return kernels::add_layernorm_forward(in.x[s], kernels::linear_forward(in.heads[s], in.w, in.b),
                                                             in.lw, in.lb, kEps);
                     });
                   },
                   3, false, true});
  cases.push_back({"linear+layernorm_forward", "bf16, the add in proj's GEMM", proj_shape,
                   proj_gemm + kBf16 * kNC + 2 * kBf16 * kNC + affine + stats,
                   [=](int64_t sets) -> Run {
                     const ProjInputs in = proj_inputs(sets);
                     return keeping<std::pair<Tensor, kernels::LayerNormOutput>>(sets, [=](int64_t s) {
                       Tensor h = kernels::linear_forward(in.heads[s], in.w, in.b, in.x[s]);
                       kernels::LayerNormOutput normed = kernels::layernorm_forward(h, in.lw, in.lb, kEps);
                       return std::pair<Tensor, kernels::LayerNormOutput>{std::move(h), std::move(normed)};
                     });
                   },
                   3, false, true});

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

  // ---- amax alone, as current scaling measures each tensor before its cast: the weights, activations ----
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

}  // namespace octet::bench
