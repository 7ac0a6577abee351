#pragma once
// Helpers shared by the GPU tests: skipping without a device, the tolerances, and comparisons of a
// GPU result with the CPU's. Relative errors are norm-wise, ||got - want||_2 / ||want||_2, read as
// f64 on the host (the absolute norm ||got - want||_2 where want is all zeros).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "tests/testing.h"

// First statement of every GPU test: CI machines have no GPU, and there the suite must skip cleanly,
// unless this is the dry run below.
#define SKIP_WITHOUT_GPU()                                                     \
  if (!::octet::cuda::is_available() && !::octet::testing::gpu_tests_on_cpu()) \
  GTEST_SKIP() << "no CUDA device on this machine; this test runs on the GPU machine"

namespace octet::testing {

// The dry run, OCTET_GPU_TESTS_ON_CPU=1 (tools/gpu_tests_on_cpu.sh): nothing skips, and the CPU stands
// in for the GPU (kGpu below), so that a test whose own setup or CPU reference throws (an argument
// the API has since refused) shows on a machine without a GPU, before a GPU machine's time goes to it.
inline bool gpu_tests_on_cpu() {
  static const bool on = [] {
    const char* value = std::getenv("OCTET_GPU_TESTS_ON_CPU");
    return value != nullptr && std::string_view(value) == "1";
  }();
  return on;
}

inline const Device kGpu = gpu_tests_on_cpu() ? Device::cpu() : Device::cuda(0);

// The suite's bounds on the norm-wise relative error: 1e-5 for f32, 1e-2 for bf16 (and anything else).
// Not for FP8 GEMMs: Hopper's FP8 tensor cores do not accumulate in f32, whatever the output dtype;
// their element-wise bound is in tests/cuda/fp8_bound.h.
inline double tolerance(DType d) { return d == DType::f32 ? 1e-5 : 1e-2; }

// The largest norm-wise relative error over runs of `row` consecutive elements (the last run may be
// shorter): a whole-tensor error lets one wrong row of 12,608 pass (its share of the norm is under
// 1%), this does not. Held to the same bound as the whole tensor: a run's error is at most its
// largest element's relative error, one ulp for a kernel that rounds once, where the element's own
// terms do not cancel. Elements where either side is NaN are left out (relative_error_matching_nans
// checks those).
inline double max_row_relative_error(const Tensor& got, const Tensor& want, int64_t row) {
  EXPECT_EQ(got.numel(), want.numel());
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  double worst = 0;
  for (size_t start = 0; start < w.size() && start < g.size(); start += static_cast<size_t>(row)) {
    double num = 0, den = 0;
    for (size_t i = start; i < std::min(start + static_cast<size_t>(row), w.size()); ++i) {
      if (std::isnan(g[i]) || std::isnan(w[i])) continue;
      num += (g[i] - w[i]) * (g[i] - w[i]);
      den += w[i] * w[i];
    }
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
  return worst;
}

// Row counts and widths for the row kernels' tests: one row, a few, a block's worth; widths off every
// pack size, a warp's, ViT-H's, and past a warp's registers.
inline const std::vector<int64_t> kRows = {1, 7, 37};
inline const std::vector<int64_t> kWidths = {13, 96, 1280, 3000};

// A copy of t on the GPU whose data starts `elements` elements past a 16-byte boundary (the allocation's
// start), so the kernels take their scalar (unpacked) paths: one element by default; 4 bf16 or 2 f32
// elements give an 8-byte aligned start that is still not 16-byte aligned.
inline Tensor misaligned_on_gpu(const Tensor& t, int64_t elements = 1) {
  const Tensor flat = empty({t.numel() + elements}, t.dtype(), kGpu);
  const Tensor view = flat.narrow(elements, t.numel()).reshape(t.shape());
  view.copy_(t);
  return view;
}

}  // namespace octet::testing
