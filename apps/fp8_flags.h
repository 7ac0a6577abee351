#pragma once
// The FP8 recipe as command-line flags (--precision fp8), shared by train_vit and bench_vit:
// Transformer Engine's DelayedScaling / CurrentScaling knobs.
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "nn/fp8.h"

namespace octet {

// The FP8 recipe as flags (--precision fp8): Transformer Engine's DelayedScaling/CurrentScaling knobs.
struct Fp8Options {
  std::string recipe = "delayed";  // or "current"
  int amax_history = 1024;         // delayed only
  int margin = 0;
  std::string amax_algo = "max";  // or "most_recent"; delayed only
  std::string format = "hybrid";  // or "e4m3"
  std::string fused_producers = "on";  // or "off": nn::set_fp8_fused_producers
  std::vector<std::string> given;  // the --fp8-* flags on the command line, for the checks
};

// --fp8-recipe, --fp8-amax-history, --fp8-margin, --fp8-amax-algo, --fp8-format, --fp8-fused-producers.
void add_fp8_flags(CLI::App& app, Fp8Options& options);
// The checks CLI11 cannot express; throws octet::Error naming the flag and the fix.
void check_fp8_options(const std::string& precision, const Fp8Options& options);
nn::Fp8Recipe fp8_recipe_from(const Fp8Options& options);
// Applies the process-wide FP8 switches (--fp8-fused-producers) for the run.
void apply_fp8_switches(const Fp8Options& options);

}  // namespace octet
