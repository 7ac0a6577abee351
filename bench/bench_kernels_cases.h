#pragma once
// The rows of bench_kernels (bench/bench_kernels.cpp): every memory-bound kernel of a ViT-H/16 training
// step at batch 64, each as the entry point the step calls, with its byte budget and its inputs. The
// timing, the copy reference and the table are bench_kernels.cpp's; the rows are in
// bench_kernels_cases.cpp, each byte budget in the comment beside it.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"

namespace octet::bench {

// ---- the step's shapes --------------------------------------------------------------------------------

inline constexpr int64_t kRows = 64 * 197;      // tokens of a batch-64 step: 12,608
inline constexpr int64_t kWidth = 1280;         // ViT-H's embed_dim
inline constexpr int64_t kHidden = 4 * kWidth;  // the MLP's hidden width, 5120
inline constexpr int64_t kQkv = 3 * kWidth;     // the qkv projection's output, 3840
inline constexpr int64_t kNC = kRows * kWidth, kNH = kRows * kHidden;
inline constexpr double kEps = 1e-6;  // timm's ViT LayerNorm
inline constexpr int64_t kBf16 = 2, kF32 = 4, kFp8 = 1;
// An activation's or gradient's FP8 cast also reads its scale, updates its amax and writes a scale_inv.
inline constexpr int64_t kCastScalars = 3 * kF32;


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

// What the rows share, made on first use (the random pool, the parameters): bench_kernels_cases.cpp.
struct Workspace;
std::shared_ptr<Workspace> make_workspace(Device device);

// Every row, in the table's order; each row's prepare() allocates on the workspace's device.
std::vector<Case> step_cases(const std::shared_ptr<Workspace>& ws);

}  // namespace octet::bench
