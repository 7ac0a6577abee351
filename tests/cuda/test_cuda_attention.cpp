// Attention on the GPU against the CPU attention run in float64 on the same (already rounded) inputs:
// the cuDNN fused path in bf16 (head dims 64, 80 and 128, odd sequence lengths, several heads), the
// unfused GPU kernels (f32 at 1e-5, bf16 when forced), the plan cache, and the dispatcher's choice.
// Errors are norm-wise relative, ||got − expected||₂ / ||expected||₂, except lse (max absolute).
//
// A shape that should run fused and finds no cuDNN plan fails its test, naming the cuDNN version: the
// direct calls assert that a plan was built, and the dispatcher's calls check
// kernels::attention_path_counts() (an unfused fallback would otherwise pass the comparisons).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops.h"
#include "core/log.h"
#include "kernels/attention.h"
#include "kernels/cuda/attention_cuda.h"
#include "tests/log_capture.h"
#include "tests/testing.h"
#include "tests/cuda/attention_paths.h"
#include "tests/cuda/cuda_testing.h"

namespace octet {
namespace {

using kernels::AttentionGrads;
using kernels::AttentionOutput;
using kernels::AttentionPathCounts;
using testing::cudnn_text;
using testing::expect_attention_fused;
using testing::expect_attention_unfused;
using testing::relative_error_to_reference;
using testing::same_bits;
using testing::throws_with;


struct Case {
  int64_t b, h, s, sk, d;
};
std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "B=" << c.b << " H=" << c.h << " S=" << c.s << " Sk=" << c.sk << " D=" << c.d;
}

double scale_for(const Case& c) { return 1.0 / std::sqrt(static_cast<double>(c.d)); }

double max_abs_error(const Tensor& got, const Tensor& expected) {
  EXPECT_EQ(got.shape(), expected.shape());
  const std::vector<double> a = got.to_vector<double>(), e = expected.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < e.size(); ++i) worst = std::max(worst, std::abs(a[i] - e[i]));
  return worst;
}

// Random q, k, v and dout in `dtype` on the GPU, and the float64 CPU forward and backward of exactly
// those (rounded) values.
struct Problem {
  Case c;
  Tensor q, k, v, dout;  // on the GPU
  AttentionOutput ref;   // f64, cpu
  AttentionGrads ref_grads;
};
Problem make_problem(const Case& c, DType dtype, uint64_t seed) {
  const Tensor q = testing::random_tensor({c.b, c.h, c.s, c.d}, dtype, seed);
  const Tensor k = testing::random_tensor({c.b, c.h, c.sk, c.d}, dtype, seed + 1);
  const Tensor v = testing::random_tensor({c.b, c.h, c.sk, c.d}, dtype, seed + 2);
  const Tensor dout = testing::random_tensor({c.b, c.h, c.s, c.d}, dtype, seed + 3);
  const Tensor q64 = q.to(DType::f64), k64 = k.to(DType::f64), v64 = v.to(DType::f64);
  const AttentionOutput ref = kernels::attention_forward(q64, k64, v64, scale_for(c));
  const AttentionGrads grads =
      kernels::attention_backward(dout.to(DType::f64), q64, k64, v64, ref.out, ref.lse, scale_for(c));
  const Device gpu = Device::cuda(0);
  return {c, q.to(gpu), k.to(gpu), v.to(gpu), dout.to(gpu), ref, grads};
}

// Sets (or, with nullptr, unsets) an environment variable for one scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) previous_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (previous_) {
      setenv(name_, previous_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> previous_;
};

// The fallback tests run the unfused path on purpose: whatever the environment says.
struct AllowUnfused {
  ScopedEnv require{"OCTET_REQUIRE_FUSED_ATTENTION", nullptr};
};

void expect_forward_close(const AttentionOutput& got, const Problem& p, double tolerance, const std::string& what) {
  EXPECT_EQ(got.lse.dtype(), DType::f32) << what;
  EXPECT_LE(relative_error_to_reference(got.out, p.ref.out), tolerance) << what << " " << p.c << ": out";
  EXPECT_LE(max_abs_error(got.lse, p.ref.lse), tolerance) << what << " " << p.c << ": lse";
}

void expect_backward_close(const AttentionGrads& got, const Problem& p, double tolerance, const std::string& what) {
  EXPECT_LE(relative_error_to_reference(got.dq, p.ref_grads.dq), tolerance) << what << " " << p.c << ": dq";
  EXPECT_LE(relative_error_to_reference(got.dk, p.ref_grads.dk), tolerance) << what << " " << p.c << ": dk";
  EXPECT_LE(relative_error_to_reference(got.dv, p.ref_grads.dv), tolerance) << what << " " << p.c << ": dv";
}

// ViT-B/ViT-L (64), ViT-H (80) and 128-wide heads; odd lengths, one with Sk != S.
const std::vector<Case> kFusedCases = {
    {2, 3, 197, 197, 64}, {1, 2, 50, 50, 80}, {2, 2, 17, 17, 128}, {2, 3, 197, 197, 80}, {1, 3, 17, 50, 64},
};

TEST(CudaAttention, CudnnForwardMatchesCpuInBf16) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : kFusedCases) {
    const Problem p = make_problem(c, DType::bf16, 11);
    std::string why_not;
    const std::optional<AttentionOutput> got =
        kernels::cuda::cudnn_attention_forward(p.q, p.k, p.v, scale_for(c), why_not);
    ASSERT_TRUE(got.has_value()) << c << ": " << cudnn_text() << " built no forward plan: " << why_not;
    EXPECT_EQ(got->out.dtype(), DType::bf16);
    expect_forward_close(*got, p, 1e-2, "cuDNN forward");
  }
}

TEST(CudaAttention, CudnnBackwardMatchesCpuInBf16) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : kFusedCases) {
    const Problem p = make_problem(c, DType::bf16, 21);
    std::string why_not;
    const std::optional<AttentionOutput> fwd =
        kernels::cuda::cudnn_attention_forward(p.q, p.k, p.v, scale_for(c), why_not);
    ASSERT_TRUE(fwd.has_value()) << c << ": " << cudnn_text() << " built no forward plan: " << why_not;
    const std::optional<AttentionGrads> got = kernels::cuda::cudnn_attention_backward(
        p.dout, p.q, p.k, p.v, fwd->out, fwd->lse, scale_for(c), why_not);
    ASSERT_TRUE(got.has_value()) << c << ": " << cudnn_text() << " built no backward plan: " << why_not;
    EXPECT_EQ(got->dq.dtype(), DType::bf16);
    expect_backward_close(*got, p, 1e-2, "cuDNN backward");
  }
}

TEST(CudaAttention, DispatcherSendsBf16HeadDim80ToCudnn) {
  SKIP_WITHOUT_GPU();
  const Case c{2, 4, 65, 65, 80};
  const Problem p = make_problem(c, DType::bf16, 31);
  const AttentionPathCounts before = kernels::attention_path_counts();
  const AttentionOutput fwd = kernels::attention_forward(p.q, p.k, p.v, scale_for(c));
  expect_attention_fused(before, 1, 0, "dispatched forward, B=2 H=4 S=65 D=80");
  const size_t plans = kernels::cuda::cudnn_attention_cached_plans();
  std::string why_not;
  const std::optional<AttentionOutput> direct =
      kernels::cuda::cudnn_attention_forward(p.q, p.k, p.v, scale_for(c), why_not);
  ASSERT_TRUE(direct.has_value()) << cudnn_text() << ": " << why_not;
  EXPECT_EQ(kernels::cuda::cudnn_attention_cached_plans(), plans) << "the dispatcher should have built this plan";
  EXPECT_TRUE(same_bits(fwd.out, direct->out));
  expect_forward_close(fwd, p, 1e-2, "dispatched forward");
  const AttentionGrads grads = kernels::attention_backward(p.dout, p.q, p.k, p.v, fwd.out, fwd.lse, scale_for(c));
  expect_attention_fused(before, 1, 1, "dispatched backward, B=2 H=4 S=65 D=80");
  expect_backward_close(grads, p, 1e-2, "dispatched backward");
}

// Every shape the direct tests above run fused, through the dispatcher as the model calls it: each
// forward and backward must be counted fused (an unfused fallback would pass the comparisons).
TEST(CudaAttention, DispatcherRunsEveryFusedCaseFused) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : kFusedCases) {
    const Problem p = make_problem(c, DType::bf16, 35);
    std::ostringstream what;
    what << "bf16 " << c;
    const AttentionPathCounts before = kernels::attention_path_counts();
    const AttentionOutput fwd = kernels::attention_forward(p.q, p.k, p.v, scale_for(c));
    const AttentionGrads grads = kernels::attention_backward(p.dout, p.q, p.k, p.v, fwd.out, fwd.lse, scale_for(c));
    expect_attention_fused(before, 1, 1, what.str());
    expect_forward_close(fwd, p, 1e-2, "dispatched forward");
    expect_backward_close(grads, p, 1e-2, "dispatched backward");
  }
}

TEST(CudaAttention, PlanCacheHitGivesIdenticalForwardBits) {
  SKIP_WITHOUT_GPU();
  const Case c{1, 2, 33, 33, 64};  // a shape no other test uses, so the first call builds
  const Problem p = make_problem(c, DType::bf16, 41);
  std::string why_not;
  const size_t before = kernels::cuda::cudnn_attention_cached_plans();
  const auto first = kernels::cuda::cudnn_attention_forward(p.q, p.k, p.v, scale_for(c), why_not);
  ASSERT_TRUE(first.has_value()) << cudnn_text() << ": " << why_not;
  const size_t after_first = kernels::cuda::cudnn_attention_cached_plans();
  EXPECT_EQ(after_first, before + 1);
  const auto second = kernels::cuda::cudnn_attention_forward(p.q, p.k, p.v, scale_for(c), why_not);
  ASSERT_TRUE(second.has_value()) << cudnn_text() << ": " << why_not;
  EXPECT_EQ(kernels::cuda::cudnn_attention_cached_plans(), after_first) << "the second call should reuse the plan";
  EXPECT_TRUE(same_bits(first->out, second->out));
  EXPECT_TRUE(same_bits(first->lse, second->lse));

  // The backward plan is reused too. Its dq may accumulate with atomics, so the bits need not
  // repeat; both calls must match the reference.
  const auto grads1 =
      kernels::cuda::cudnn_attention_backward(p.dout, p.q, p.k, p.v, first->out, first->lse, scale_for(c), why_not);
  ASSERT_TRUE(grads1.has_value()) << cudnn_text() << ": " << why_not;
  const size_t with_backward = kernels::cuda::cudnn_attention_cached_plans();
  const auto grads2 =
      kernels::cuda::cudnn_attention_backward(p.dout, p.q, p.k, p.v, first->out, first->lse, scale_for(c), why_not);
  ASSERT_TRUE(grads2.has_value()) << cudnn_text() << ": " << why_not;
  EXPECT_EQ(kernels::cuda::cudnn_attention_cached_plans(), with_backward);
  expect_backward_close(*grads1, p, 1e-2, "first backward");
  expect_backward_close(*grads2, p, 1e-2, "second backward");
}

// f32 has no fused path: the dispatcher sends it to the unfused GPU kernels.
TEST(CudaAttention, UnfusedPathMatchesCpuInF32) {
  SKIP_WITHOUT_GPU();
  const AllowUnfused allow;
  for (const Case& c : {Case{2, 3, 197, 197, 32}, Case{1, 2, 50, 17, 96}, Case{2, 1, 17, 50, 96}}) {
    const Problem p = make_problem(c, DType::f32, 51);
    const AttentionPathCounts before = kernels::attention_path_counts();
    const AttentionOutput fwd = kernels::attention_forward(p.q, p.k, p.v, scale_for(c));
    EXPECT_EQ(fwd.out.dtype(), DType::f32);
    expect_forward_close(fwd, p, 1e-5, "unfused f32 forward");
    const AttentionGrads grads = kernels::attention_backward(p.dout, p.q, p.k, p.v, fwd.out, fwd.lse, scale_for(c));
    expect_backward_close(grads, p, 1e-5, "unfused f32 backward");
    expect_attention_unfused(before, 1, 1, "f32 through the dispatcher");
  }
}

// The unfused kernels themselves, called directly.
TEST(CudaAttention, UnfusedPathTakesRowsLargerThanSharedMemory) {
  SKIP_WITHOUT_GPU();
  // Rows of more than 46 KiB of f32 go to global scratch: Sk = 12301 for the forward's and dq's
  // score rows, S = 6151 for dk/dv's (two rows of S floats).
  for (const Case& c : {Case{1, 1, 7, 12301, 32}, Case{1, 1, 6151, 5, 32}}) {
    const Problem p = make_problem(c, DType::f32, 61);
    const AttentionOutput fwd = kernels::cuda::unfused_attention_forward(p.q, p.k, p.v, scale_for(c));
    expect_forward_close(fwd, p, 1e-5, "unfused f32 forward, long rows");
    const AttentionGrads grads =
        kernels::cuda::unfused_attention_backward(p.dout, p.q, p.k, p.v, fwd.out, fwd.lse, scale_for(c));
    expect_backward_close(grads, p, 1e-5, "unfused f32 backward, long rows");
  }
}

TEST(CudaAttention, DisablingCudnnRunsTheUnfusedPathInBf16) {
  SKIP_WITHOUT_GPU();
  const AllowUnfused allow;
  const ScopedEnv disable("OCTET_DISABLE_CUDNN_ATTENTION", "1");
  const Case c{2, 2, 50, 50, 80};  // a shape only this test uses: no cuDNN plan may appear for it
  const Problem p = make_problem(c, DType::bf16, 71);
  const size_t plans = kernels::cuda::cudnn_attention_cached_plans();
  const AttentionPathCounts before = kernels::attention_path_counts();
  const AttentionOutput fwd = kernels::attention_forward(p.q, p.k, p.v, scale_for(c));
  const AttentionGrads grads = kernels::attention_backward(p.dout, p.q, p.k, p.v, fwd.out, fwd.lse, scale_for(c));
  EXPECT_EQ(kernels::cuda::cudnn_attention_cached_plans(), plans);
  expect_attention_unfused(before, 1, 1, "OCTET_DISABLE_CUDNN_ATTENTION=1");
  expect_forward_close(fwd, p, 1e-2, "unfused bf16 forward");
  expect_backward_close(grads, p, 1e-2, "unfused bf16 backward");
}

TEST(CudaAttention, HeadDimsCudnnCannotTakeFallBack) {
  SKIP_WITHOUT_GPU();
  const AllowUnfused allow;
  const Case c{1, 3, 17, 17, 20};  // not a multiple of 8
  const Problem p = make_problem(c, DType::bf16, 81);
  EXPECT_NE(kernels::cuda::cudnn_attention_unsupported_reason(p.q, p.k, p.v), "");
  const AttentionPathCounts before = kernels::attention_path_counts();
  const AttentionOutput fwd = kernels::attention_forward(p.q, p.k, p.v, scale_for(c));
  expect_forward_close(fwd, p, 1e-2, "unfused bf16 forward, D=20");
  const AttentionGrads grads = kernels::attention_backward(p.dout, p.q, p.k, p.v, fwd.out, fwd.lse, scale_for(c));
  expect_backward_close(grads, p, 1e-2, "unfused bf16 backward, D=20");
  expect_attention_unfused(before, 1, 1, "head dim 20");
}

// OCTET_REQUIRE_FUSED_ATTENTION=1 turns every fallback into an error that says what ran into it and
// why, and leaves fused calls alone.
TEST(CudaAttention, RequiringFusedAttentionMakesTheFallbackAnError) {
  SKIP_WITHOUT_GPU();
  const ScopedEnv require("OCTET_REQUIRE_FUSED_ATTENTION", "1");
  const std::string version = std::to_string(kernels::cuda::cudnn_version());
  {
    const Case c{1, 3, 17, 17, 20};  // head dim 20: no fused kernel takes it
    const Problem p = make_problem(c, DType::bf16, 85);
    const AttentionPathCounts before = kernels::attention_path_counts();
    EXPECT_TRUE(throws_with([&] { kernels::attention_forward(p.q, p.k, p.v, scale_for(c)); },
                            {"attention: no fused cuDNN plan", "attention_forward", "bf16[1, 3, 17, 20]", "dtype bf16",
                             version, "head dim 20", "OCTET_REQUIRE_FUSED_ATTENTION"}));
    // The backward refuses too (with any forward result of the right shapes).
    const AttentionOutput fwd = kernels::cuda::unfused_attention_forward(p.q, p.k, p.v, scale_for(c));
    EXPECT_TRUE(throws_with(
        [&] { kernels::attention_backward(p.dout, p.q, p.k, p.v, fwd.out, fwd.lse, scale_for(c)); },
        {"attention: no fused cuDNN plan", "attention_backward", "bf16[1, 3, 17, 20]", version, "head dim 20"}));
    expect_attention_unfused(before, 0, 0, "refused calls run nothing");
  }
  {
    const Case c{2, 2, 17, 17, 32};  // f32: cuDNN's fused attention is bf16/f16 only
    const Problem p = make_problem(c, DType::f32, 86);
    EXPECT_TRUE(throws_with([&] { kernels::attention_forward(p.q, p.k, p.v, scale_for(c)); },
                            {"attention: no fused cuDNN plan", "dtype f32", version}));
  }
  {
    const ScopedEnv disable("OCTET_DISABLE_CUDNN_ATTENTION", "1");  // contradicts the requirement
    const Case c{1, 2, 41, 41, 64};
    const Problem p = make_problem(c, DType::bf16, 87);
    EXPECT_TRUE(throws_with([&] { kernels::attention_forward(p.q, p.k, p.v, scale_for(c)); },
                            {"attention: no fused cuDNN plan", "OCTET_DISABLE_CUDNN_ATTENTION=1"}));
  }
  {
    const Case c{2, 3, 197, 197, 64};  // fused: runs as usual
    const Problem p = make_problem(c, DType::bf16, 88);
    const AttentionPathCounts before = kernels::attention_path_counts();
    const AttentionOutput fwd = kernels::attention_forward(p.q, p.k, p.v, scale_for(c));
    const AttentionGrads grads = kernels::attention_backward(p.dout, p.q, p.k, p.v, fwd.out, fwd.lse, scale_for(c));
    expect_attention_fused(before, 1, 1, "bf16 B=2 H=3 S=197 D=64 under OCTET_REQUIRE_FUSED_ATTENTION=1");
    expect_forward_close(fwd, p, 1e-2, "required-fused forward");
    expect_backward_close(grads, p, 1e-2, "required-fused backward");
  }
}

// The first fallback in a process logs one warning with a fixed text that scripts grep for; later
// ones, whatever their reason, log nothing more.
TEST(CudaAttention, TheFallbackWarnsOncePerProcessWithAFixedText) {
  SKIP_WITHOUT_GPU();
  const AllowUnfused allow;
  std::string log;
  const AttentionPathCounts before = kernels::attention_path_counts();
  // Two different reasons (head dim 20, then f32), both directions.
  const std::pair<Case, DType> fallbacks[] = {{Case{1, 2, 17, 17, 20}, DType::bf16},
                                              {Case{1, 2, 17, 17, 32}, DType::f32}};
  {
    const testing::CapturedLog captured;
    for (const auto& [c, dtype] : fallbacks) {
      const Problem p = make_problem(c, dtype, 91);
      const AttentionOutput fwd = kernels::attention_forward(p.q, p.k, p.v, scale_for(c));
      kernels::attention_backward(p.dout, p.q, p.k, p.v, fwd.out, fwd.lse, scale_for(c));
    }
    log = captured.text();
  }
  expect_attention_unfused(before, 2, 2, "the fallbacks of this test");
  const size_t warnings = testing::occurrences(log, "attention: no fused cuDNN plan");
  // Once per process: only if nothing fell back earlier in this process (the whole binary in one run).
  const bool first_in_process = before.unfused_forward + before.unfused_backward == 0;
  EXPECT_EQ(warnings, first_in_process ? 1u : 0u) << log;
  if (first_in_process) {
    EXPECT_NE(log.find("head dim 20"), std::string::npos) << log;
    EXPECT_NE(log.find(std::to_string(kernels::cuda::cudnn_version())), std::string::npos) << log;
  }
}

TEST(CudaAttention, ForwardOnOnePathBackwardOnTheOther) {
  SKIP_WITHOUT_GPU();
  const Case c{1, 2, 41, 41, 64};
  const Problem p = make_problem(c, DType::bf16, 91);
  std::string why_not;
  const auto fused = kernels::cuda::cudnn_attention_forward(p.q, p.k, p.v, scale_for(c), why_not);
  ASSERT_TRUE(fused.has_value()) << cudnn_text() << ": " << why_not;
  const AttentionGrads unfused_grads =
      kernels::cuda::unfused_attention_backward(p.dout, p.q, p.k, p.v, fused->out, fused->lse, scale_for(c));
  expect_backward_close(unfused_grads, p, 1e-2, "unfused backward of the cuDNN forward");
  const AttentionOutput unfused = kernels::cuda::unfused_attention_forward(p.q, p.k, p.v, scale_for(c));
  const auto fused_grads = kernels::cuda::cudnn_attention_backward(p.dout, p.q, p.k, p.v, unfused.out, unfused.lse,
                                                                   scale_for(c), why_not);
  ASSERT_TRUE(fused_grads.has_value()) << cudnn_text() << ": " << why_not;
  expect_backward_close(*fused_grads, p, 1e-2, "cuDNN backward of the unfused forward");
}

// ---- the packed layout: qkv [B, S, 3, H, D] read in place, out [B, S, H, D], one dqkv -------------

// Random qkv and dout in `dtype` on the GPU, and the float64 CPU packed forward and backward of
// exactly those (rounded) values. (The CPU packed kernels are checked against plain loops in
// tests/kernels/test_attention.cpp.)
struct PackedProblem {
  Case c;
  Tensor qkv, dout;        // on the GPU
  AttentionOutput ref;     // f64, cpu: out [B, S, H, D], lse [B, H, S]
  Tensor ref_dqkv;         // f64, cpu
};
PackedProblem make_packed_problem(const Case& c, DType dtype, uint64_t seed) {
  const Tensor qkv = testing::random_tensor({c.b, c.s, 3, c.h, c.d}, dtype, seed);
  const Tensor dout = testing::random_tensor({c.b, c.s, c.h, c.d}, dtype, seed + 1);
  const Tensor qkv64 = qkv.to(DType::f64);
  const AttentionOutput ref = kernels::packed_attention_forward(qkv64, scale_for(c));
  const Tensor dqkv = kernels::packed_attention_backward(dout.to(DType::f64), qkv64, ref.out, ref.lse, scale_for(c));
  const Device gpu = Device::cuda(0);
  return {c, qkv.to(gpu), dout.to(gpu), ref, dqkv};
}

void expect_packed_close(const AttentionOutput& fwd, const Tensor& dqkv, const PackedProblem& p, double tolerance,
                         const std::string& what) {
  EXPECT_EQ(fwd.lse.dtype(), DType::f32) << what;
  EXPECT_LE(relative_error_to_reference(fwd.out, p.ref.out), tolerance) << what << " " << p.c << ": out";
  EXPECT_LE(max_abs_error(fwd.lse, p.ref.lse), tolerance) << what << " " << p.c << ": lse";
  // dq, dk and dv separately: a wrong offset into the packed gradient shows as one part's error.
  const Tensor got = dqkv.to(Device::cpu()).to(DType::f64);
  for (int64_t part = 0; part < 3; ++part) {
    EXPECT_LE(relative_error_to_reference(octet::select(got, 2, part), octet::select(p.ref_dqkv, 2, part)), tolerance)
        << what << " " << p.c << ": part " << part << " (0 dq, 1 dk, 2 dv) of dqkv";
  }
}

// The model's shapes: ViT-B/L (64), ViT-H (80) and 128-wide heads, S = 197 and 257 (224² and
// 256² images with a class token), and odd lengths (S = Sk in this layout).
const std::vector<Case> kPackedFusedCases = {
    {2, 3, 197, 197, 64}, {2, 4, 257, 257, 80}, {1, 2, 50, 50, 80}, {2, 2, 17, 17, 128}, {3, 5, 33, 33, 64},
};

TEST(CudaAttention, CudnnPackedForwardAndBackwardMatchCpuInBf16) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : kPackedFusedCases) {
    const PackedProblem p = make_packed_problem(c, DType::bf16, 51);
    std::string why_not;
    const std::optional<AttentionOutput> fwd = kernels::cuda::cudnn_packed_attention_forward(p.qkv, scale_for(c), why_not);
    ASSERT_TRUE(fwd.has_value()) << c << ": " << cudnn_text() << " built no packed forward plan: " << why_not;
    EXPECT_EQ(fwd->out.shape(), (Shape{c.b, c.s, c.h, c.d}));
    const std::optional<Tensor> dqkv =
        kernels::cuda::cudnn_packed_attention_backward(p.dout, p.qkv, fwd->out, fwd->lse, scale_for(c), why_not);
    ASSERT_TRUE(dqkv.has_value()) << c << ": " << cudnn_text() << " built no packed backward plan: " << why_not;
    EXPECT_EQ(dqkv->shape(), p.qkv.shape());
    expect_packed_close(*fwd, *dqkv, p, 1e-2, "cuDNN packed");
  }
}

TEST(CudaAttention, DispatcherRunsThePackedLayoutFused) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : kPackedFusedCases) {
    const PackedProblem p = make_packed_problem(c, DType::bf16, 55);
    std::ostringstream what;
    what << "packed bf16 " << c;
    const AttentionPathCounts before = kernels::attention_path_counts();
    const AttentionOutput fwd = kernels::packed_attention_forward(p.qkv, scale_for(c));
    const Tensor dqkv = kernels::packed_attention_backward(p.dout, p.qkv, fwd.out, fwd.lse, scale_for(c));
    expect_attention_fused(before, 1, 1, what.str());
    expect_packed_close(fwd, dqkv, p, 1e-2, "dispatched packed");
  }
}

TEST(CudaAttention, UnfusedPackedMatchesCpu) {
  SKIP_WITHOUT_GPU();
  AllowUnfused allow;
  // f32 (cuDNN takes none), head dims cuDNN refuses (20, 136), and bf16 forced off cuDNN.
  const std::vector<std::pair<Case, DType>> cases = {
      {{2, 3, 17, 17, 20}, DType::f32}, {{1, 2, 50, 50, 136}, DType::f32}, {{2, 3, 197, 197, 64}, DType::bf16}};
  for (const auto& [c, dtype] : cases) {
    const PackedProblem p = make_packed_problem(c, dtype, 61);
    const AttentionOutput fwd = kernels::cuda::unfused_packed_attention_forward(p.qkv, scale_for(c));
    const Tensor dqkv = kernels::cuda::unfused_packed_attention_backward(p.dout, p.qkv, fwd.out, fwd.lse, scale_for(c));
    expect_packed_close(fwd, dqkv, p, dtype == DType::f32 ? 1e-5 : 1e-2, "unfused packed");
  }
}

// A forward on one path and the backward on the other agree: both keep lse in f32 natural log, and
// both write dq, dk and dv into the same places of dqkv.
TEST(CudaAttention, PackedPathsMixForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  AllowUnfused allow;
  const Case c{2, 4, 65, 65, 80};
  const PackedProblem p = make_packed_problem(c, DType::bf16, 71);
  std::string why_not;
  const auto fused = kernels::cuda::cudnn_packed_attention_forward(p.qkv, scale_for(c), why_not);
  ASSERT_TRUE(fused.has_value()) << cudnn_text() << ": " << why_not;
  const Tensor unfused_grads =
      kernels::cuda::unfused_packed_attention_backward(p.dout, p.qkv, fused->out, fused->lse, scale_for(c));
  expect_packed_close(*fused, unfused_grads, p, 1e-2, "fused forward, unfused backward");
  const AttentionOutput unfused = kernels::cuda::unfused_packed_attention_forward(p.qkv, scale_for(c));
  const auto fused_grads =
      kernels::cuda::cudnn_packed_attention_backward(p.dout, p.qkv, unfused.out, unfused.lse, scale_for(c), why_not);
  ASSERT_TRUE(fused_grads.has_value()) << cudnn_text() << ": " << why_not;
  expect_packed_close(unfused, *fused_grads, p, 1e-2, "unfused forward, fused backward");
}

}  // namespace
}  // namespace octet
