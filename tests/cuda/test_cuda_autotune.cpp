// Autotuning on the GPU (kernels/autotune.h). With it on, the GEMMs of a training step (plain,
// accumulating into their output, with the BIAS and BGRADB epilogues, with a residual read as C, and
// FP8) and its fused attention (forward and backward, packed as the model runs it) must compute what
// they compute with it off, against float64 within the suite's bounds, although each new problem
// first ran 1 + kAutotuneTimedRuns times for each of up to kAutotuneCandidates candidates. The
// failures these guard against: trials that add C again (an accumulated gradient summed many times),
// or leave a trial's output where the real run's belongs.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/cuda_stream.h"
#include "kernels/attention.h"
#include "kernels/cuda/cudnn_graph.h"
#include "kernels/fp8_gemm.h"
#include "kernels/gemm.h"
#include "kernels/autotune.h"
#include "kernels/linear.h"
#include "tests/cuda/attention_paths.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/cuda/fp8_bound.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::random_tensor;
using testing::relative_error_to_reference;
using testing::tolerance;

// Autotuning on for one test's scope.
struct AutotuneOn {
  AutotuneOn() { kernels::set_autotune(true); }
  ~AutotuneOn() { kernels::set_autotune(false); }
  AutotuneOn(const AutotuneOn&) = delete;
  AutotuneOn& operator=(const AutotuneOn&) = delete;
};

// alpha·a·bᵀ + beta·c0 in float64 on the CPU.
Tensor reference(const Tensor& a, const Tensor& b, const Tensor& c0, double alpha, double beta) {
  Tensor want = c0.to(DType::f64).clone();
  kernels::gemm(a.to(DType::f64), false, b.to(DType::f64), true, want, alpha, beta);
  return want;
}

// Shapes no other test uses (m prime), so that the problem is new to the process here.
TEST(CudaAutotune, TunesEachProblemOnceAndComputesTheProduct) {
  SKIP_WITHOUT_GPU();
  AutotuneOn on;
  const Tensor a = random_tensor({331, 264}, DType::bf16, 1), b = random_tensor({136, 264}, DType::bf16, 2);
  const Tensor a_gpu = a.to(kGpu), b_gpu = b.to(kGpu);
  const int before = kernels::autotuned_problems();
  Tensor got = empty({331, 136}, DType::bf16, kGpu);
  kernels::gemm(a_gpu, false, b_gpu, true, got);
  EXPECT_EQ(kernels::autotuned_problems(), before + 1) << "a new problem is tuned";
  const Tensor want = reference(a, b, zeros({331, 136}), 1.0, 0.0);
  EXPECT_LE(relative_error_to_reference(got, want), tolerance(DType::bf16));

  Tensor again = empty({331, 136}, DType::bf16, kGpu);
  kernels::gemm(a_gpu, false, b_gpu, true, again);
  EXPECT_EQ(kernels::autotuned_problems(), before + 1) << "a problem seen before keeps its algorithm";
  EXPECT_TRUE(testing::same_bits(again, got)) << "the same algorithm on the same operands";
}

// beta != 0 with C = D (a weight gradient accumulated over micro-batches): the trials write scratch,
// so the output holds alpha·a·bᵀ + beta·c0 once. f32 and bf16 outputs, beta 1 and 0.5.
TEST(CudaAutotune, AccumulatingIntoTheOutputAddsItOnce) {
  SKIP_WITHOUT_GPU();
  AutotuneOn on;
  uint64_t seed = 20;
  int64_t m = 211;  // a new m each time: beta's value is not in the problem, only whether C is read
  for (DType out : {DType::f32, DType::bf16}) {
    for (double beta : {1.0, 0.5}) {
      const Tensor a = random_tensor({m, 1024}, DType::bf16, seed), b = random_tensor({96, 1024}, DType::bf16, seed + 1);
      // The old output on the product's scale (sqrt(k) = 32), so that adding it twice fails any bound.
      const Tensor c0 = random_tensor({m, 96}, out, seed + 2, 32.0);
      Tensor got = c0.to(kGpu);
      const int before = kernels::autotuned_problems();
      kernels::gemm(a.to(kGpu), false, b.to(kGpu), true, got, 0.75, beta);
      EXPECT_EQ(kernels::autotuned_problems(), before + 1);
      EXPECT_LE(relative_error_to_reference(got, reference(a, b, c0, 0.75, beta)), tolerance(out))
          << dtype_name(out) << " beta " << beta;
      seed += 3;
      m += 2;
    }
  }
}

// A Linear's forward with the BIAS epilogue, with a residual read as C apart from D, and its backward
// with the bias gradient from BGRADB: against the CPU's kernels on the same bf16 inputs.
TEST(CudaAutotune, LinearForwardAndBackwardThroughTheEpilogues) {
  SKIP_WITHOUT_GPU();
  AutotuneOn on;
  const Tensor x = random_tensor({3, 67, 104}, DType::bf16, 40), w = random_tensor({152, 104}, DType::bf16, 41);
  const Tensor bias = random_tensor({152}, DType::bf16, 42), residual = random_tensor({3, 67, 152}, DType::bf16, 43);
  const Tensor dy = random_tensor({3, 67, 152}, DType::bf16, 44);
  const Tensor xg = x.to(kGpu), wg = w.to(kGpu), bg = bias.to(kGpu), rg = residual.to(kGpu), dyg = dy.to(kGpu);

  EXPECT_LE(relative_error_to_reference(kernels::linear_forward(xg, wg, bg), kernels::linear_forward(x, w, bias)),
            tolerance(DType::bf16));
  EXPECT_LE(relative_error_to_reference(kernels::linear_forward(xg, wg, bg, rg),
                                        kernels::linear_forward(x, w, bias, residual)),
            tolerance(DType::bf16));
  EXPECT_TRUE(testing::same_bits(rg, residual)) << "the residual is read, never written";

  const kernels::LinearGrads got = kernels::linear_backward(dyg, xg, wg, true, true, true);
  const kernels::LinearGrads want = kernels::linear_backward(dy, x, w, true, true, true);
  EXPECT_LE(relative_error_to_reference(got.dx, want.dx), tolerance(DType::bf16));
  EXPECT_LE(relative_error_to_reference(got.dweight, want.dweight), tolerance(DType::bf16));
  EXPECT_LE(relative_error_to_reference(got.dbias, want.dbias), tolerance(DType::bf16));
}

// The FP8 GEMM accumulating into its output with a bias (ViT-B's qkv over one image), element by
// element within the FP8 bound of the exact result: out added once.
TEST(CudaAutotune, Fp8GemmAccumulatesOnceWithinTheBound) {
  SKIP_WITHOUT_GPU();
  AutotuneOn on;
  const int64_t m = 197, k = 768, n = 2304;
  const double sd = 448.0 / 64;  // E4M3 values well inside the range
  const Tensor a = random_tensor({m, k}, DType::f32, 60, sd).to(DType::e4m3);
  const Tensor b = random_tensor({n, k}, DType::f32, 61, sd).to(DType::e4m3);
  const Tensor scale_inv_a = from_vector<float>({0.37f}, {1}), scale_inv_b = from_vector<float>({3.1f}, {1});
  const double product_rms = sd * sd * std::sqrt(double(k)) * 0.37 * 3.1;
  const Tensor bias = random_tensor({n}, DType::bf16, 62, product_rms);
  const Tensor old = random_tensor({m, n}, DType::bf16, 63, product_rms);
  const Tensor got = old.to(kGpu);
  kernels::fp8_gemm(a.to(kGpu), scale_inv_a.to(kGpu), b.to(kGpu), scale_inv_b.to(kGpu), got, bias.to(kGpu),
                    /*accumulate=*/true, /*fast_accumulate=*/true);
  EXPECT_TRUE(testing::within_fp8_gemm_bound(
      got, testing::fp8_gemm_reference(a, scale_inv_a, b, scale_inv_b, DType::bf16, bias, old)));
}

// Attention as the model runs it (qkv packed [B, S, 3, H, D], ViT-H's 80-wide heads, a shape no other
// test uses): each direction is tuned once, runs fused, and matches the float64 CPU attention.
TEST(CudaAutotune, PackedAttentionForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  AutotuneOn on;
  const int64_t b = 2, s = 97, h = 4, d = 80;
  const double scale = 1.0 / std::sqrt(double(d));
  const Tensor qkv = random_tensor({b, s, 3, h, d}, DType::bf16, 80), dout = random_tensor({b, s, h, d}, DType::bf16, 81);
  const kernels::AttentionOutput want = kernels::packed_attention_forward(qkv.to(DType::f64), scale);
  const Tensor want_dqkv =
      kernels::packed_attention_backward(dout.to(DType::f64), qkv.to(DType::f64), want.out, want.lse, scale);

  const Tensor qkv_gpu = qkv.to(kGpu), dout_gpu = dout.to(kGpu);
  const int before = kernels::autotuned_problems();
  const kernels::AttentionPathCounts paths = kernels::attention_path_counts();
  const kernels::AttentionOutput got = kernels::packed_attention_forward(qkv_gpu, scale);
  const Tensor dqkv = kernels::packed_attention_backward(dout_gpu, qkv_gpu, got.out, got.lse, scale);
  testing::expect_attention_fused(paths, 1, 1, "autotuned packed attention, B=2 S=97 H=4 D=80");
  EXPECT_EQ(kernels::autotuned_problems(), before + 2) << "the forward and the backward are tuned";
  EXPECT_LE(relative_error_to_reference(got.out, want.out), 1e-2);
  EXPECT_LE(relative_error_to_reference(dqkv, want_dqkv), 1e-2);

  const kernels::AttentionOutput again = kernels::packed_attention_forward(qkv_gpu, scale);
  EXPECT_EQ(kernels::autotuned_problems(), before + 2) << "a shape seen before keeps its plan";
  EXPECT_TRUE(testing::same_bits(again.out, got.out));
}

// cuDNN's plan while autotuning (kernels/cuda/cudnn_graph.h's build_plan), on a graph of one matmul,
// which cuDNN's runtime fusion engines run on Hopper. A candidate that refuses to run is a false
// trial, and the fallback list is asked next. An error raised while the candidates are timed is the
// GPU's (a sticky CUDA error, a failed event), not a refusal: it must reach the caller, which then
// caches nothing (attention's find_plan once caught it and ran the shape unfused for the rest of the
// process). The trials here never run the plan, so no tensor is bound. (A single candidate is not
// timed at all: then the test says so and skips.)
TEST(CudaAutotune, CudnnPlanRethrowsAnErrorWhileTimingAndReportsRefusals) {
  SKIP_WITHOUT_GPU();
  (void)empty({1}, DType::f32, Device::cuda(0));  // without a GPU (the dry run) this says so, before cuDNN does
  namespace cudnn = kernels::cuda::cudnn;
  cudnnHandle_t handle = nullptr;
  cudnn::check(cudnnCreate(&handle), "cudnnCreate", "the test's handle");
  struct Destroy {
    cudnnHandle_t h;
    ~Destroy() { cudnnDestroy(h); }
  } destroy{handle};
  const cudaStream_t stream = octet::cuda::current_stream(0);
  const auto describe = [](cudnn::GraphBuilder& g) {
    // [B, M, K] = [1, 64, 64]: the rank a matmul outside attention's fused engines takes (the 4th
    // entry does not count).
    const cudnn::Dims dims = {1, 64, 64, 0}, strides = {64 * 64, 64, 1, 0};
    const cudnn::TensorRef a = g.tensor("A", 1, dims, strides, CUDNN_DATA_BFLOAT16, 3);
    const cudnn::TensorRef b = g.tensor("B", 2, dims, strides, CUDNN_DATA_BFLOAT16, 3);
    const cudnn::TensorRef c = g.tensor("C", 3, dims, strides, CUDNN_DATA_BFLOAT16, 3);
    g.matmul("A·B", a, b, c);
  };
  const auto what = [] { return std::string("the test's 64 x 64 x 64 matmul"); };

  {  // autotuning off: the heuristics' first plan, no trial run
    cudnn::GraphBuilder g;
    describe(g);
    std::string why;
    int trials = 0;
    const auto plan = cudnn::build_plan(handle, g, why, stream, [&](const cudnn::Plan&) { return ++trials > 0; }, what);
    ASSERT_NE(plan, nullptr) << "cuDNN gave no plan for a lone bf16 matmul, so the checks below mean nothing: " << why;
    EXPECT_EQ(trials, 0);
  }
  AutotuneOn on;
  {  // tuned, every candidate running: a plan, and trials only when there is a choice to time
    cudnn::GraphBuilder g;
    describe(g);
    std::string why;
    int trials = 0;
    const auto plan = cudnn::build_plan(handle, g, why, stream, [&](const cudnn::Plan&) { return ++trials > 0; }, what);
    ASSERT_NE(plan, nullptr) << why;
    if (trials == 0) {
      GTEST_SKIP() << "cuDNN offered one engine configuration for a lone bf16 matmul, so autotuning times "
                      "nothing and its error path cannot be reached with this graph";
    }
  }
  {
    cudnn::GraphBuilder g;
    describe(g);
    std::string why;
    int trials = 0;
    EXPECT_THROW(cudnn::build_plan(
                     handle, g, why, stream,
                     [&](const cudnn::Plan&) -> bool {
                       ++trials;
                       OCTET_FAIL("planted: an error while the candidates are timed");
                     },
                     what),
                 Error);
    EXPECT_EQ(trials, 1) << "the first trial's error ends the timing";
  }
  {
    cudnn::GraphBuilder g;
    describe(g);
    std::string why;
    int trials = 0;
    const auto plan =
        cudnn::build_plan(handle, g, why, stream, [&](const cudnn::Plan&) { return ++trials < 0; }, what);
    EXPECT_GE(trials, 1);
    // Every timed candidate refused, and the search went on to the fallback list: it gives the plan
    // (a single configuration, not timed, kept as with autotuning off), or no plan with a reason
    // that is not the first list's alone ("cuDNN ran none of the ..." was the whole reason when the
    // search stopped there).
    if (plan == nullptr) {
      EXPECT_FALSE(why.empty());
      EXPECT_NE(why.rfind("cuDNN ran none of the", 0), 0u) << why;
    }
  }
}

}  // namespace
}  // namespace octet
