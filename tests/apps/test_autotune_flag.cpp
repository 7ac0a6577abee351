// --autotune (apps/autotune_flag.h), shared by train_vit and bench_vit: what it parses to, that it
// switches the process-wide setting, and its refusal on the CPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "apps/autotune_flag.h"
#include "kernels/autotune.h"
#include "tests/apps/parse_flags.h"
#include "tests/testing.h"

namespace octet {
namespace {
using testing::throws_with;

std::string parse(const std::vector<std::string>& args) {
  return testing::parse_flags(args, std::string("off"),
                              [](CLI::App& app, std::string& value) { add_autotune_flag(app, value); });
}

TEST(AutotuneFlag, ParsesOnAndOff) {
  EXPECT_EQ(parse({}), "off");
  EXPECT_EQ(parse({"--autotune", "on"}), "on");
  EXPECT_THROW(parse({"--autotune", "maybe"}), CLI::ValidationError);
}

TEST(AutotuneFlag, SwitchesTheProcessWideSetting) {
  apply_autotune("on", Device::cuda(0));  // only the device's kind is checked: no GPU needed
  EXPECT_TRUE(kernels::autotune_enabled());
  apply_autotune("off", Device::cuda(0));
  EXPECT_FALSE(kernels::autotune_enabled());
  apply_autotune("off", Device::cpu());
  EXPECT_FALSE(kernels::autotune_enabled());
}

TEST(AutotuneFlag, OnTheCpuThereIsNothingToTune) {
  EXPECT_TRUE(throws_with([] { apply_autotune("on", Device::cpu()); },
                          {"--autotune on", "cpu", "drop the flag", "--device cuda"}));
  EXPECT_FALSE(kernels::autotune_enabled()) << "a refused flag switches nothing on";
}

}  // namespace
}  // namespace octet
