#pragma once
// train_vit's flags: their defaults (tuned for Fashion-MNIST on a 2-core CPU), their checks, and the
// datasets and model they select. The FP8 recipe flags (apps/fp8_flags.h) are shared with bench_vit.
#include <CLI/CLI.hpp>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/fashion_mnist.h"
#include "data/synthetic.h"
#include "models/vit.h"
#include "apps/fp8_flags.h"
#include "apps/autotune_flag.h"
#include "nn/layers.h"

namespace octet {

struct RunOptions {
  std::string model = "vit_fashion_mnist";
  std::string dataset = "fashion-mnist";  // or "synthetic"
  std::string data_dir;                   // "" = the Debian package's folder
  int64_t synthetic_size = 60000;
  int64_t epochs = 10;
  int64_t steps = 0;  // > 0 overrides --epochs
  int64_t batch_size = 128;
  int64_t grad_accum = 1;  // micro-batches of --batch-size per optimizer step
  int64_t eval_batch_size = 500;
  std::string optimizer = "adamw";
  double lr = 2e-3, min_lr = 1e-5, momentum = 0.9, beta1 = 0.9, beta2 = 0.999;
  double weight_decay = 0.05;  // AdamW's; check_run_options makes it 1e-4 for SGD unless given
  int64_t warmup_steps = 200;
  double label_smoothing = 0.1, clip_grad = 1.0, drop_path = -1;  // drop_path < 0: the model config's
  std::string gelu = "erf";  // or "tanh"
  std::string autotune = "off";  // or "on": kernels/autotune.h, on a GPU only
  std::string precision = "fp32";  // or "bf16", "fp8"
  Fp8Options fp8;
  std::string fp8_log_layer = "blocks.0.mlp.fc1";  // the Linear whose FP8 numbers are logged
  std::string device = "auto";     // check_run_options resolves it to "cpu" or "cuda:N"
  uint64_t seed = 0;
  int threads = 0;  // 0 = every core
  int64_t log_every = 50, eval_every = 0;  // eval_every 0 = at the end of every epoch
  std::string metrics, checkpoint_dir, resume;
  int64_t checkpoint_every = 0;  // 0 = only at the end (when --checkpoint-dir is set)

  // Data parallelism (mpirun -np N train_vit --parallel ddp): --batch-size is per rank.
  std::string recompute = "none";    // or "blocks": activation recompute per transformer block
  std::string parallel = "none";     // "ddp" or "fsdp"
  std::string sharding = "full";     // FSDP: full (ZeRO-3), grad-op (ZeRO-2), none or hybrid
  int shard_group_size = 0;          // --sharding hybrid: ranks per shard group (0: check_run_options sets one node's)
  std::string fsdp_prefetch = "pre";  // FSDP backward prefetch: pre or post
  bool fp8_all_gather = false;        // FSDP under --precision fp8: gather the FP8 Linears' weights as E4M3
  std::string dist_backend = "auto";  // nccl on a GPU, mpi on the CPU
  double bucket_cap_mb = 25;
  std::string reduce_dtype = "f32";  // or "bf16": the dtype DDP all-reduces gradients in
  int64_t lora_rank = 0;             // > 0: LoRA adapters on the blocks' Linears; only they and the head train
  double lora_alpha = 16;
  std::string save_model;            // the trained weights, one safetensors file with timm's names, at the end
  std::string lora_save;             // write the adapters and head alone to this safetensors file at the end
  std::string trace;                 // Chrome trace file; ".rank<r>" goes before the extension
  int64_t trace_steps = 3;           // steps recorded, after a first untraced one
  // The flags on the command line that apply only with others (--sharding with --parallel fsdp, ...):
  // check_run_options refuses one that would do nothing.
  std::set<std::string> given;
  // Filled by check_run_options from mpirun's environment (1/0 without it).
  int world_size = 1, rank = 0, local_rank = 0;
};

void add_run_flags(CLI::App& app, RunOptions& options);
// Cross-flag checks CLI11 cannot express, and --device resolved to the device it names; throws
// octet::Error (train_vit exits with code 2).
void check_run_options(RunOptions& options);

// The flags that shape a run, as strings: stored in checkpoints and in the metrics' start event.
std::map<std::string, std::string> run_flags(const RunOptions& options);
// Before a checkpoint loads: a flag that changes the weights' shapes or dtypes (--model, --lora-rank,
// fp32 against bf16/fp8) differing from the checkpoint's (`saved`, apps::checkpoint_run_flags) is an
// error naming it and its value there.
void check_resume_flags(const std::string& path, const std::map<std::string, std::string>& saved,
                        const std::map<std::string, std::string>& now);
// Resuming with other flags is allowed (say, more --steps) but breaks bitwise equality: log it.
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
// A micro-batch (--batch-size on every rank) must fit in the training set; the error names the flags.
void check_batch_fits(const RunOptions& options, const Datasets& datasets);

}  // namespace octet
