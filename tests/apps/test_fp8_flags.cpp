// The FP8 recipe flags (apps/fp8_flags.h) shared by train_vit and bench_vit: what they parse to, and
// the refusals that name the flag and the fix.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "apps/fp8_flags.h"
#include "nn/fp8_linear.h"
#include "tests/apps/parse_flags.h"
#include "tests/testing.h"

namespace octet {
namespace {
using testing::throws_with;

// Parses `args` (after the program name) into fresh Fp8Options.
Fp8Options parse(const std::vector<std::string>& args) {
  return testing::parse_flags(args, Fp8Options{}, [](CLI::App& app, Fp8Options& o) { add_fp8_flags(app, o); });
}

TEST(Fp8Flags, DefaultsAreTransformerEnginesDelayedScaling) {
  const Fp8Options o = parse({});
  EXPECT_TRUE(o.given.empty());
  const nn::Fp8Recipe recipe = fp8_recipe_from(o);
  EXPECT_EQ(recipe.describe(), nn::Fp8Recipe(nn::DelayedScaling{}).describe());
  EXPECT_EQ(recipe.amax_history_len(), 1024);
  EXPECT_EQ(recipe.backward_dtype(), DType::e5m2);
  check_fp8_options("fp32", o);  // no --fp8-* flag: fine with any precision
}

TEST(Fp8Flags, EachFlagReachesTheRecipe) {
  const Fp8Options o = parse({"--fp8-amax-history", "16", "--fp8-margin", "2", "--fp8-amax-algo", "most_recent",
                              "--fp8-format", "e4m3"});
  check_fp8_options("fp8", o);
  const nn::Fp8Recipe recipe = fp8_recipe_from(o);
  ASSERT_TRUE(recipe.is_delayed());
  EXPECT_EQ(recipe.delayed().amax_history_len, 16);
  EXPECT_EQ(recipe.margin(), 2);
  EXPECT_EQ(recipe.delayed().amax_compute_algo, nn::AmaxCompute::MostRecent);
  EXPECT_EQ(recipe.backward_dtype(), DType::e4m3);

  const nn::Fp8Recipe current = fp8_recipe_from(parse({"--fp8-recipe", "current", "--fp8-margin", "1"}));
  EXPECT_FALSE(current.is_delayed());
  EXPECT_EQ(current.margin(), 1);
  EXPECT_EQ(current.format(), nn::Fp8Format::HYBRID);
}

TEST(Fp8Flags, RefusalsNameTheFlagAndTheFix) {
  EXPECT_TRUE(throws_with([] { check_fp8_options("bf16", parse({"--fp8-margin", "1"})); },
                          {"--fp8-margin", "--precision bf16", "pass --precision fp8"}));
  const Fp8Options current_with_history = parse({"--fp8-recipe", "current", "--fp8-amax-history", "8"});
  EXPECT_TRUE(throws_with([&] { check_fp8_options("fp8", current_with_history); },
                          {"--fp8-amax-history", "--fp8-recipe current", "pass --fp8-recipe delayed"}));
  const Fp8Options current_with_algo = parse({"--fp8-recipe", "current", "--fp8-amax-algo", "max"});
  EXPECT_TRUE(throws_with([&] { check_fp8_options("fp8", current_with_algo); }, {"--fp8-amax-algo"}));
  EXPECT_THROW(parse({"--fp8-amax-history", "0"}), CLI::ValidationError);
  EXPECT_THROW(parse({"--fp8-margin", "65"}), CLI::ValidationError);
  EXPECT_THROW(parse({"--fp8-recipe", "sometimes"}), CLI::ValidationError);
  EXPECT_THROW(parse({"--fp8-fused-producers", "maybe"}), CLI::ValidationError);
  EXPECT_TRUE(throws_with([] { check_fp8_options("bf16", parse({"--fp8-fused-producers", "off"})); },
                          {"--fp8-fused-producers", "--precision bf16"}));
}

TEST(Fp8Flags, FusedProducersSwitchTheProcessWideSetting) {
  apply_fp8_switches(parse({"--fp8-fused-producers", "off"}));
  EXPECT_FALSE(nn::fp8_fused_producers());
  apply_fp8_switches(parse({}));
  EXPECT_TRUE(nn::fp8_fused_producers()) << "on by default";
}

}  // namespace
}  // namespace octet
