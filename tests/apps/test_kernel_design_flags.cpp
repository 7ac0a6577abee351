// --bias-grad (apps/kernel_design_flags.h), bench_vit's choice of the GPU kernel design on trial: what
// it parses to, that it sets the process-wide design, and its refusal on the CPU, which has one kernel
// for each op.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "apps/kernel_design_flags.h"
#include "kernels/linear.h"
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
  EXPECT_EQ(flags.bias_grad, "column-sum");
  EXPECT_EQ(flags.describe(), "");
  EXPECT_EQ(kernels::linear_bias_grad_design(), kernels::LinearBiasGradDesign::kColumnSum);
}

TEST(KernelDesignFlags, ParseAndDescribeTheOtherDesign) {
  EXPECT_EQ(parse({"--bias-grad", "epilogue"}).describe(), "--bias-grad epilogue");
  EXPECT_EQ(parse({"--bias-grad", "column-sum"}).describe(), "");
  EXPECT_THROW(parse({"--bias-grad", "bgradb"}), CLI::ValidationError);
  // The designs the fourth GPU run settled are gone, flags and all.
  EXPECT_THROW(parse({"--layernorm-backward", "columns"}), CLI::ParseError);
  EXPECT_THROW(parse({"--row-prefetch", "refill"}), CLI::ParseError);
}

TEST(KernelDesignFlags, SetTheProcessWideDesign) {
  // Only the device's kind is checked: no GPU needed.
  apply_kernel_design_flags(parse({"--bias-grad", "epilogue"}), Device::cuda(0));
  EXPECT_EQ(kernels::linear_bias_grad_design(), kernels::LinearBiasGradDesign::kEpilogue);
  apply_kernel_design_flags(parse({}), Device::cuda(0));
  EXPECT_EQ(kernels::linear_bias_grad_design(), kernels::LinearBiasGradDesign::kColumnSum);
  apply_kernel_design_flags(parse({}), Device::cpu());
  EXPECT_EQ(kernels::linear_bias_grad_design(), kernels::LinearBiasGradDesign::kColumnSum);
}

TEST(KernelDesignFlags, OnTheCpuEachOpHasOneKernel) {
  EXPECT_TRUE(throws_with([] { apply_kernel_design_flags(parse({"--bias-grad", "epilogue"}), Device::cpu()); },
                          {"--bias-grad epilogue", "cpu", "drop the flag", "--device cuda"}));
  EXPECT_EQ(kernels::linear_bias_grad_design(), kernels::LinearBiasGradDesign::kColumnSum)
      << "a refused flag sets nothing";
}

}  // namespace
}  // namespace octet
