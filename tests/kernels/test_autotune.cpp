// GEMM autotuning's switch and the rule that picks a timed algorithm (kernels/autotune.h). The
// timing itself needs a GPU: tests/cuda/test_cuda_autotune.cpp.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/autotune.h"

namespace octet {
namespace {

using kernels::autotune_pick;

TEST(Autotune, IsOffUnlessSwitchedOn) {
  EXPECT_FALSE(kernels::autotune_enabled()) << "off by default: the heuristic's algorithm, the same in every run";
  kernels::set_autotune(true);
  EXPECT_TRUE(kernels::autotune_enabled());
  kernels::set_autotune(false);
  EXPECT_FALSE(kernels::autotune_enabled());
}

TEST(Autotune, KeepsTheHeuristicsFirstUnlessAnotherBeatsItByTheMargin) {
  // Within the 2% margin: noise, the first stays.
  EXPECT_EQ(autotune_pick({100e-6, 99e-6}), 0);
  EXPECT_EQ(autotune_pick({100e-6, 100e-6}), 0);
  // Beyond it: the fastest, wherever it is in the ranking.
  EXPECT_EQ(autotune_pick({100e-6, 97e-6}), 1);
  EXPECT_EQ(autotune_pick({100e-6, 90e-6, 95e-6, 80e-6, 120e-6}), 3);
  // A zero margin takes any gain; a wide one none of these.
  EXPECT_EQ(autotune_pick({100e-6, 99.9e-6}, 0.0), 1);
  EXPECT_EQ(autotune_pick({100e-6, 80e-6}, 0.25), 0);
  EXPECT_EQ(autotune_pick({100e-6}), 0);
}

TEST(Autotune, SkipsCandidatesThatDidNotRun) {
  EXPECT_EQ(autotune_pick({-1.0, 50e-6, 40e-6}), 2) << "the first did not run: the fastest that did";
  EXPECT_EQ(autotune_pick({-1.0, 50e-6}), 1);
  EXPECT_EQ(autotune_pick({100e-6, -1.0, 90e-6}), 2);
  EXPECT_EQ(autotune_pick({100e-6, -1.0, -1.0}), 0);
  EXPECT_EQ(autotune_pick({-1.0, -1.0}), -1);
  EXPECT_EQ(autotune_pick({}), -1);
}

}  // namespace
}  // namespace octet
