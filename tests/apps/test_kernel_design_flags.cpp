// --layernorm-backward, --bias-grad and --row-prefetch (apps/kernel_design_flags.h), bench_vit's choice of the GPU
// kernel designs on trial: what they parse to, that they set the process-wide designs, and their
// refusal on the CPU, which has one kernel for each op.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "apps/kernel_design_flags.h"
#include "kernels/layernorm_design.h"
#include "kernels/linear.h"
#include "kernels/row_prefetch.h"
#include "tests/apps/parse_flags.h"
#include "tests/testing.h"

namespace octet {
namespace {
using testing::throws_with;

KernelDesignFlags parse(const std::vector<std::string>& args) {
  return testing::parse_flags(args, KernelDesignFlags{},
                              [](CLI::App& app, KernelDesignFlags& f) { add_kernel_design_flags(app, f); });
}

TEST(KernelDesignFlags, DefaultToTheLibrarysDesigns) {
  const KernelDesignFlags flags = parse({});
  EXPECT_EQ(flags.layernorm_backward, "rows");
  EXPECT_EQ(flags.bias_grad, "epilogue");
  EXPECT_EQ(flags.row_prefetch, "refill");
  EXPECT_EQ(flags.describe(), "");
  EXPECT_EQ(kernels::layernorm_backward_design(), kernels::LayerNormBackwardDesign::kRows);
  EXPECT_EQ(kernels::linear_bias_grad_design(), kernels::LinearBiasGradDesign::kEpilogue);
  EXPECT_EQ(kernels::row_prefetch(), kernels::RowPrefetch::kRefill);
}

TEST(KernelDesignFlags, ParseAndDescribeTheOtherDesigns) {
  const KernelDesignFlags both = parse({"--layernorm-backward", "columns", "--bias-grad", "column-sum"});
  EXPECT_EQ(both.describe(), "--layernorm-backward columns --bias-grad column-sum");
  EXPECT_EQ(parse({"--bias-grad", "column-sum"}).describe(), "--bias-grad column-sum");
  EXPECT_EQ(parse({"--row-prefetch", "after", "--layernorm-backward", "columns"}).describe(),
            "--layernorm-backward columns --row-prefetch after");
  EXPECT_EQ(parse({"--row-prefetch", "refill"}).describe(), "");
  EXPECT_THROW(parse({"--layernorm-backward", "pipelined"}), CLI::ValidationError);
  EXPECT_THROW(parse({"--bias-grad", "bgradb"}), CLI::ValidationError);
  EXPECT_THROW(parse({"--row-prefetch", "double"}), CLI::ValidationError);
}

TEST(KernelDesignFlags, SetTheProcessWideDesigns) {
  // Only the device's kind is checked: no GPU needed.
  apply_kernel_design_flags(
      parse({"--layernorm-backward", "columns", "--bias-grad", "column-sum", "--row-prefetch", "after"}),
      Device::cuda(0));
  EXPECT_EQ(kernels::layernorm_backward_design(), kernels::LayerNormBackwardDesign::kColumns);
  EXPECT_EQ(kernels::linear_bias_grad_design(), kernels::LinearBiasGradDesign::kColumnSum);
  EXPECT_EQ(kernels::row_prefetch(), kernels::RowPrefetch::kAfter);
  apply_kernel_design_flags(parse({}), Device::cuda(0));
  EXPECT_EQ(kernels::layernorm_backward_design(), kernels::LayerNormBackwardDesign::kRows);
  EXPECT_EQ(kernels::linear_bias_grad_design(), kernels::LinearBiasGradDesign::kEpilogue);
  EXPECT_EQ(kernels::row_prefetch(), kernels::RowPrefetch::kRefill);
  apply_kernel_design_flags(parse({}), Device::cpu());
  EXPECT_EQ(kernels::layernorm_backward_design(), kernels::LayerNormBackwardDesign::kRows);
}

TEST(KernelDesignFlags, OnTheCpuEachOpHasOneKernel) {
  EXPECT_TRUE(throws_with([] { apply_kernel_design_flags(parse({"--bias-grad", "column-sum"}), Device::cpu()); },
                          {"--bias-grad column-sum", "cpu", "drop the flag", "--device cuda"}));
  EXPECT_TRUE(throws_with(
      [] { apply_kernel_design_flags(parse({"--layernorm-backward", "columns"}), Device::cpu()); },
      {"--layernorm-backward columns", "cpu", "drop the flag"}));
  EXPECT_TRUE(throws_with([] { apply_kernel_design_flags(parse({"--row-prefetch", "after"}), Device::cpu()); },
                          {"--row-prefetch after", "cpu", "drop the flag"}));
  EXPECT_EQ(kernels::layernorm_backward_design(), kernels::LayerNormBackwardDesign::kRows)
      << "a refused flag sets nothing";
  EXPECT_EQ(kernels::linear_bias_grad_design(), kernels::LinearBiasGradDesign::kEpilogue);
  EXPECT_EQ(kernels::row_prefetch(), kernels::RowPrefetch::kRefill);
}

}  // namespace
}  // namespace octet
