#include "apps/fp8_flags.h"

#include "apps/flag_checks.h"
#include "core/error.h"
#include "nn/fp8_linear.h"

namespace octet {

void add_fp8_flags(CLI::App& app, Fp8Options& o) {
  auto given = [&o](const char* flag) { return [&o, flag](const std::string&) { o.given.emplace_back(flag); }; };
  app.add_option("--fp8-recipe", o.recipe,
                 "with --precision fp8: delayed (scales from an amax history of past steps) or current "
                 "(each tensor's own amax, one more pass)")
      ->check(CLI::IsMember({"delayed", "current"}))->each(given("--fp8-recipe"))->capture_default_str();
  app.add_option("--fp8-amax-history", o.amax_history, "delayed recipe: steps of amax history")
      ->transform(whole_at_least(1, INT_MAX))->each(given("--fp8-amax-history"))->capture_default_str();
  app.add_option("--fp8-margin", o.margin, "scale = fp8_max / amax / 2^margin: headroom, in powers of two")
      ->check(CLI::Range(0, 64))->each(given("--fp8-margin"))->capture_default_str();
  app.add_option("--fp8-amax-algo", o.amax_algo, "delayed recipe: the amax a scale comes from, max of the "
                 "history or most_recent")
      ->check(CLI::IsMember({"max", "most_recent"}))->each(given("--fp8-amax-algo"))->capture_default_str();
  app.add_option("--fp8-format", o.format, "hybrid (E4M3 forward, E5M2 gradients) or e4m3 (E4M3 everywhere)")
      ->check(CLI::IsMember({"hybrid", "e4m3"}))->each(given("--fp8-format"))->capture_default_str();
  app.add_option("--fp8-fused-producers", o.fused_producers,
                 "on: under the delayed recipe the LayerNorms and GELU write their Linears' FP8 inputs, and GELU's "
                 "backward fc1's FP8 gradient (Transformer Engine's LayerNormLinear/LayerNormMLP); off: the "
                 "separate casts, the same bits (for comparing the two)")
      ->check(CLI::IsMember({"on", "off"}))->each(given("--fp8-fused-producers"))->capture_default_str();
}

void check_fp8_options(const std::string& precision, const Fp8Options& o) {
  if (precision != "fp8" && !o.given.empty())
    OCTET_FAIL(o.given.front(), " sets the FP8 recipe, but this run is --precision ", precision,
               "; pass --precision fp8 or drop the --fp8-* flags");
  if (o.recipe == "current") {
    for (const std::string& flag : o.given) {
      OCTET_CHECK(flag != "--fp8-amax-history" && flag != "--fp8-amax-algo", flag,
                  " shapes the delayed recipe's amax history, which --fp8-recipe current does not keep; drop ",
                  flag, " or pass --fp8-recipe delayed");
    }
  }
}

void apply_fp8_switches(const Fp8Options& o) { nn::set_fp8_fused_producers(o.fused_producers == "on"); }

nn::Fp8Recipe fp8_recipe_from(const Fp8Options& o) {
  const nn::Fp8Format format = o.format == "e4m3" ? nn::Fp8Format::E4M3 : nn::Fp8Format::HYBRID;
  if (o.recipe == "current") return nn::CurrentScaling{.margin = o.margin, .fp8_format = format};
  return nn::DelayedScaling{.margin = o.margin,
                            .amax_history_len = o.amax_history,
                            .amax_compute_algo = o.amax_algo == "most_recent" ? nn::AmaxCompute::MostRecent
                                                                              : nn::AmaxCompute::Max,
                            .fp8_format = format};
}

}  // namespace octet
