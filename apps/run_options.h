#pragma once
// train_vit's flags: their defaults (tuned for Fashion-MNIST on a 2-core CPU), their checks, and the
// datasets and model they select. The FP8 recipe flags are shared with bench_vit.
#include <CLI/CLI.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/fashion_mnist.h"
#include "data/synthetic.h"
#include "models/vit.h"
#include "nn/fp8.h"
#include "nn/layers.h"

namespace octet {

// The FP8 recipe as flags (--precision fp8): Transformer Engine's DelayedScaling/CurrentScaling knobs.
struct Fp8Options {
  std::string recipe = "delayed";  // or "current"
  int amax_history = 1024;         // delayed only
  int margin = 0;
  std::string amax_algo = "max";  // or "most_recent"; delayed only
  std::string format = "hybrid";  // or "e4m3"
  std::vector<std::string> given;  // the --fp8-* flags on the command line, for the checks
};

struct RunOptions {
  std::string model = "vit_fashion_mnist";
  std::string dataset = "fashion-mnist";  // or "synthetic"
  std::string data_dir;                   // "" = the Debian package's folder
  int64_t synthetic_size = 60000;
  int64_t epochs = 10;
  int64_t steps = 0;  // > 0 overrides --epochs
  int64_t batch_size = 128;
  int64_t eval_batch_size = 500;
  std::string optimizer = "adamw";
  double lr = 2e-3, min_lr = 1e-5, weight_decay = 0.05, momentum = 0.9, beta1 = 0.9, beta2 = 0.999;
  int64_t warmup_steps = 200;
  double label_smoothing = 0.1, clip_grad = 1.0, drop_path = -1;  // drop_path < 0: the model config's
  std::string precision = "fp32";  // or "bf16", "fp8"
  Fp8Options fp8;
  std::string fp8_log_layer = "blocks.0.mlp.fc1";  // the Linear whose FP8 numbers are logged
  std::string device = "auto";     // check_run_options resolves it to "cpu" or "cuda:N"
  uint64_t seed = 0;
  int threads = 0;  // 0 = every core
  int64_t log_every = 50, eval_every = 0;  // eval_every 0 = at the end of every epoch
  std::string metrics, checkpoint_dir, resume;
  int64_t checkpoint_every = 0;  // 0 = only at the end (when --checkpoint-dir is set)
};

void add_run_flags(CLI::App& app, RunOptions& options);
// Cross-flag checks CLI11 cannot express, and --device resolved to the device it names; throws
// octet::Error (train_vit exits with code 2).
void check_run_options(RunOptions& options);

// The flags that shape a run, as strings: stored in checkpoints and in the metrics' start event.
std::map<std::string, std::string> run_flags(const RunOptions& options);
// Resuming with different flags is allowed (say, more --steps) but breaks bitwise equality: log it.
void warn_about_changed_flags(const std::map<std::string, std::string>& saved,
                              const std::map<std::string, std::string>& now);

models::ViTConfig model_config(const RunOptions& options);

// --fp8-log-layer resolved in the built model: a Linear that runs in FP8. Throws naming the flag and
// listing valid names otherwise.
std::shared_ptr<nn::Linear> fp8_log_linear(models::VisionTransformer& model, const std::string& name);

struct Datasets {
  std::shared_ptr<const data::Dataset> train, test;
};
// Loads --dataset and checks that its images fit the model.
Datasets load_datasets(const RunOptions& options, const models::ViTConfig& config);

// ---- the FP8 recipe flags ------------------------------------------------------------------------
// Inline so that bench_vit, which does not link this file's .cpp (train_vit's datasets), shares them.

inline void add_fp8_flags(CLI::App& app, Fp8Options& o) {
  auto given = [&o](const char* flag) { return [&o, flag](const std::string&) { o.given.emplace_back(flag); }; };
  app.add_option("--fp8-recipe", o.recipe,
                 "with --precision fp8: delayed (scales from an amax history of past steps) or current "
                 "(each tensor's own amax, one more pass)")
      ->check(CLI::IsMember({"delayed", "current"}))->each(given("--fp8-recipe"))->capture_default_str();
  app.add_option("--fp8-amax-history", o.amax_history, "delayed recipe: steps of amax history")
      ->check(CLI::PositiveNumber)->each(given("--fp8-amax-history"))->capture_default_str();
  app.add_option("--fp8-margin", o.margin, "scale = fp8_max / amax / 2^margin: headroom, in powers of two")
      ->check(CLI::Range(0, 64))->each(given("--fp8-margin"))->capture_default_str();
  app.add_option("--fp8-amax-algo", o.amax_algo, "delayed recipe: the amax a scale comes from, max of the "
                 "history or most_recent")
      ->check(CLI::IsMember({"max", "most_recent"}))->each(given("--fp8-amax-algo"))->capture_default_str();
  app.add_option("--fp8-format", o.format, "hybrid (E4M3 forward, E5M2 gradients) or e4m3 (E4M3 everywhere)")
      ->check(CLI::IsMember({"hybrid", "e4m3"}))->each(given("--fp8-format"))->capture_default_str();
}

// The checks CLI11 cannot express; throws octet::Error naming the flag and the fix.
inline void check_fp8_options(const std::string& precision, const Fp8Options& o) {
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

inline nn::Fp8Recipe fp8_recipe_from(const Fp8Options& o) {
  const nn::Fp8Format format = o.format == "e4m3" ? nn::Fp8Format::E4M3 : nn::Fp8Format::HYBRID;
  if (o.recipe == "current") return nn::CurrentScaling{.margin = o.margin, .fp8_format = format};
  return nn::DelayedScaling{.margin = o.margin,
                            .amax_history_len = o.amax_history,
                            .amax_compute_algo = o.amax_algo == "most_recent" ? nn::AmaxCompute::MostRecent
                                                                              : nn::AmaxCompute::Max,
                            .fp8_format = format};
}
inline nn::Fp8Recipe fp8_recipe_from(const RunOptions& o) { return fp8_recipe_from(o.fp8); }

}  // namespace octet
