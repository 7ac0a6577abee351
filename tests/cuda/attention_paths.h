#pragma once
// Which path the GPU attention took (kernels::attention_path_counts), for the tests whose attention
// must run on cuDNN's fused kernels: an unfused fallback computes the same values, so comparisons
// alone would let it pass. Failures name the cuDNN version, since which graphs have fused engines
// depends on the release.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "kernels/attention.h"
#include "kernels/cuda/attention_cuda.h"

namespace octet::testing {

// "cuDNN 91900" (cudnnGetVersion(): major·10000 + minor·100 + patch).
inline std::string cudnn_text() { return "cuDNN " + std::to_string(kernels::cuda::cudnn_version()); }

// Since `before`, exactly `forwards` forward and `backwards` backward GPU attention calls ran, all fused.
inline void expect_attention_fused(const kernels::AttentionPathCounts& before, int64_t forwards, int64_t backwards,
                                   const std::string& what) {
  const kernels::AttentionPathCounts now = kernels::attention_path_counts();
  EXPECT_EQ(now.unfused_forward - before.unfused_forward, 0)
      << what << ": the attention forward fell back to the unfused GPU kernels: " << cudnn_text()
      << " built no fused plan for it (the log's 'attention: no fused cuDNN plan' line says why)";
  EXPECT_EQ(now.unfused_backward - before.unfused_backward, 0)
      << what << ": the attention backward fell back to the unfused GPU kernels: " << cudnn_text()
      << " built no fused plan for it (the log's 'attention: no fused cuDNN plan' line says why)";
  EXPECT_EQ(now.fused_forward - before.fused_forward, forwards) << what << " (" << cudnn_text() << ")";
  EXPECT_EQ(now.fused_backward - before.fused_backward, backwards) << what << " (" << cudnn_text() << ")";
}

// Since `before`, exactly `forwards` forward and `backwards` backward GPU attention calls ran, all unfused.
inline void expect_attention_unfused(const kernels::AttentionPathCounts& before, int64_t forwards, int64_t backwards,
                                     const std::string& what) {
  const kernels::AttentionPathCounts now = kernels::attention_path_counts();
  EXPECT_EQ(now.fused_forward - before.fused_forward, 0) << what;
  EXPECT_EQ(now.fused_backward - before.fused_backward, 0) << what;
  EXPECT_EQ(now.unfused_forward - before.unfused_forward, forwards) << what;
  EXPECT_EQ(now.unfused_backward - before.unfused_backward, backwards) << what;
}

}  // namespace octet::testing
