#include "apps/run_options.h"

#include <algorithm>
#include <thread>

#include "apps/flag_checks.h"

#include "core/cuda_memory.h"
#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "distributed/launch.h"
#include "nn/fp8_linear.h"

namespace octet {

void add_run_flags(CLI::App& app, RunOptions& o) {
  // Records the flags that check_run_options refuses where they would do nothing.
  auto given = [&o](const char* flag) { return [&o, flag](const std::string&) { o.given.insert(flag); }; };
  const auto names = models::vit_config_names();
  app.add_option("--model", o.model, "model config")->check(CLI::IsMember(names))->capture_default_str();
  app.add_option("--dataset", o.dataset, "fashion-mnist, or synthetic (noise images for throughput runs)")
      ->check(CLI::IsMember({"fashion-mnist", "synthetic"}))->capture_default_str();
  app.add_option("--data-dir", o.data_dir, "folder with the Fashion-MNIST files (default: the Debian package's)")
      ->each(given("--data-dir"));
  app.add_option("--synthetic-size", o.synthetic_size, "images in the synthetic training set")
      ->transform(whole_at_least(1))->each(given("--synthetic-size"))->capture_default_str();
  app.add_option("--epochs", o.epochs, "passes over the training set")->transform(whole_at_least(1))->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps (overrides --epochs)")->transform(whole_at_least(1));
  app.add_option("--batch-size", o.batch_size, "images per step")->transform(whole_at_least(1))->capture_default_str();
  app.add_option("--grad-accum", o.grad_accum, "micro-batches of --batch-size accumulated per optimizer step")
      ->transform(whole_at_least(1))->capture_default_str();
  app.add_option("--eval-batch-size", o.eval_batch_size, "images per evaluation batch")
      ->transform(whole_at_least(1))->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "adamw or sgd (nesterov momentum)")
      ->check(CLI::IsMember({"adamw", "sgd"}))->capture_default_str();
  app.add_option("--lr", o.lr, "peak learning rate")->check(number_above(0))->capture_default_str();
  app.add_option("--min-lr", o.min_lr, "learning rate at the end of the cosine")
      ->check(number_at_least(0))->each(given("--min-lr"))->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay,
                 "weight decay, not on norms, biases, pos_embed or cls_token: decoupled for adamw (default 0.05), "
                 "L2 added to the gradient for sgd, as torch.optim.SGD applies it (default here 1e-4)")
      ->check(number_at_least(0))->each(given("--weight-decay"));
  app.add_option("--momentum", o.momentum, "SGD momentum")
      ->check(number_between(0, 1))->each(given("--momentum"))->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps, "steps of linear warmup")
      ->transform(whole_at_least(0))->capture_default_str();
  app.add_option("--label-smoothing", o.label_smoothing, "cross-entropy label smoothing")
      ->check(number_between(0, 1))->capture_default_str();
  app.add_option("--clip-grad", o.clip_grad, "global gradient-norm clip (0 = off)")
      ->check(number_at_least(0))->capture_default_str();
  app.add_option("--drop-path", o.drop_path, "stochastic-depth rate (default: the model config's)")
      ->check(number_between(0, 1));
  app.add_option("--gelu", o.gelu,
                 "the MLPs' GELU: erf (timm's ViTs) or tanh (the approximation; on the GPU in bf16 fc1's GEMM "
                 "then computes it in its epilogue)")
      ->check(CLI::IsMember({"erf", "tanh"}))->capture_default_str();
  add_autotune_flag(app, o.autotune);
  app.add_option("--precision", o.precision,
                 "fp32; bf16 (bf16 weights, activations and GEMMs; f32 master weights, optimizer state, "
                 "norm statistics and loss); or fp8 (bf16, with the transformer blocks' Linears running their "
                 "GEMMs in FP8 under the --fp8-* recipe). bf16 and FP8 are emulated exactly on the CPU")
      ->capture_default_str();
  add_fp8_flags(app, o.fp8);
  app.add_option("--fp8-log-layer", o.fp8_log_layer,
                 "with --precision fp8: the Linear (module path) whose scales, amaxes and quantisation error "
                 "are logged at every --log-every step")
      ->each([&o](const std::string&) { o.fp8.given.emplace_back("--fp8-log-layer"); })
      ->capture_default_str();
  app.add_option("--device", o.device, "auto (the first GPU if there is one, else the CPU; under mpirun the local "
                 "rank's GPU), cpu, cuda or cuda:N (under mpirun: every rank on GPU N)")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed for weights, shuffling and dropout")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (default: every core)")->transform(whole_at_least(0, INT_MAX));
  app.add_option("--log-every", o.log_every, "steps between log lines")->transform(whole_at_least(1))->capture_default_str();
  app.add_option("--eval-every", o.eval_every, "steps between test evaluations (default: every epoch)")
      ->transform(whole_at_least(0));
  app.add_option("--metrics", o.metrics, "write step and eval events to this JSON Lines file");
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "write checkpoints under this folder");
  app.add_option("--checkpoint-every", o.checkpoint_every, "steps between checkpoints (default: at the end)")
      ->transform(whole_at_least(0));
  app.add_option("--resume", o.resume, "continue from a checkpoint folder (or a --checkpoint-dir: its latest)");
  app.add_option("--recompute", o.recompute,
                 "none, or blocks: each transformer block keeps only its input in forward and runs again in "
                 "backward (activation recompute: about a third more compute for most of the activations' memory); "
                 "the same bits as none, with every --precision and --parallel")
      ->check(CLI::IsMember({"none", "blocks"}))->capture_default_str();
  app.add_option("--parallel", o.parallel,
                 "none; ddp (data parallel over the ranks mpirun starts); or fsdp (sharded parameters, gradients "
                 "and optimizer state). --batch-size is per rank")
      ->check(CLI::IsMember({"none", "ddp", "fsdp"}))->capture_default_str();
  app.add_option("--sharding", o.sharding, "with --parallel fsdp: full (ZeRO-3), grad-op (ZeRO-2), none (DDP), "
                 "hybrid (full sharding within each group of --shard-group-size ranks, replicas across groups: "
                 "for jobs over several nodes) or hybrid-grad-op (the same with grad-op within each group)")
      ->check(CLI::IsMember({"full", "grad-op", "none", "hybrid", "hybrid-grad-op"}))
      ->each(given("--sharding"))->capture_default_str();
  app.add_option("--shard-group-size", o.shard_group_size, "with --sharding hybrid or hybrid-grad-op: the consecutive "
                 "ranks that shard "
                 "the model among themselves (default: the ranks of one node); the world size must be a multiple")
      ->transform(whole_at_least(1, INT_MAX));
  app.add_option("--fsdp-prefetch", o.fsdp_prefetch, "with --parallel fsdp: gather the next unit of backward "
                 "when a unit's backward starts (pre) or after its gradients are reduced (post)")
      ->check(CLI::IsMember({"pre", "post"}))->each(given("--fsdp-prefetch"))->capture_default_str();
  app.add_flag("--fp8-all-gather", o.fp8_all_gather, "with --parallel fsdp and --precision fp8: all-gather the "
               "weights of the FP8 Linears as E4M3 bytes, half of bf16's traffic for them (training is bit for bit "
               "the same)");
  app.add_option("--dist-backend", o.dist_backend, "auto (nccl on GPUs, mpi on the CPU), nccl or mpi (several "
                 "ranks may share a GPU over mpi)")
      ->check(CLI::IsMember({"auto", "nccl", "mpi"}))->each(given("--dist-backend"))->capture_default_str();
  app.add_option("--bucket-cap-mb", o.bucket_cap_mb, "DDP gradient bucket size (the first bucket is 1 MB)")
      ->check(number_above(0))->each(given("--bucket-cap-mb"))->capture_default_str();
  app.add_option("--reduce-dtype", o.reduce_dtype, "dtype DDP and FSDP reduce gradients in: f32 or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}))->each(given("--reduce-dtype"))->capture_default_str();
  app.add_option("--lora-rank", o.lora_rank, "LoRA: adapters of this rank on every block's qkv, proj, fc1 and fc2; "
                 "only they and the head train (0 = off)")
      ->transform(whole_at_least(0))->capture_default_str();
  app.add_option("--lora-alpha", o.lora_alpha, "LoRA scale numerator: the update is (alpha / rank)·B·A")
      ->check(number_above(0))->each(given("--lora-alpha"))->capture_default_str();
  app.add_option("--save-model", o.save_model, "write the trained weights to this safetensors file at the end, under "
                 "timm's names (gathered from the shards under FSDP), loadable by one process or timm");
  app.add_option("--lora-save", o.lora_save, "with --lora-rank: write the adapters and the head alone to this "
                 "safetensors file at the end");
  app.add_option("--trace", o.trace, "write a Chrome trace (Perfetto's viewer or chrome://tracing opens it) of "
                 "--trace-steps steps to this file; with several ranks, one file per rank: trace.json -> "
                 "trace.rank0.json, ...");
  app.add_option("--trace-steps", o.trace_steps, "steps the trace records, after one untraced warm-up step")
      ->transform(whole_at_least(1))->each(given("--trace-steps"))->capture_default_str();
}

namespace {

// --sharding hybrid (or hybrid-grad-op) and --shard-group-size: the group size defaults to the ranks
// of one node, and must divide the world size.
void check_hybrid_sharding(RunOptions& o, const distributed::LaunchInfo& launch) {
  if (!o.sharding.starts_with("hybrid")) {
    OCTET_CHECK(o.shard_group_size == 0, "--shard-group-size ", o.shard_group_size, " sets the shard groups of "
                "--sharding hybrid and hybrid-grad-op, but --sharding is ", o.sharding, "; pass --sharding hybrid, or drop "
                "the flag");
    return;
  }
  OCTET_CHECK(o.parallel == "fsdp", "--sharding ", o.sharding, " shards FSDP's units within groups of ranks, so it "
              "needs --parallel fsdp (got --parallel ", o.parallel, ")");
  const bool given = o.shard_group_size > 0;
  if (!given) o.shard_group_size = launch.local_world_size;
  OCTET_CHECK(o.world_size % o.shard_group_size == 0, "--sharding ", o.sharding, ": the world size ", o.world_size,
              " is not a multiple of the shard group size ", o.shard_group_size,
              given ? " (--shard-group-size)" : " (the ranks on this node; set it with --shard-group-size)",
              "; pass a --shard-group-size that divides ", o.world_size, ", or start a multiple of ",
              o.shard_group_size, " ranks");
}

// A flag given where it does nothing is refused rather than ignored: a run that silently trains
// without what its command line asks for is worse than one that does not start.
void check_flags_apply(const RunOptions& o) {
  auto given = [&o](const char* flag) { return o.given.count(flag) > 0; };
  // (--sharding hybrid has a message of its own, check_hybrid_sharding's.)
  for (const char* flag : {"--sharding", "--fsdp-prefetch"}) {
    OCTET_CHECK(!given(flag) || o.parallel == "fsdp" || o.sharding.starts_with("hybrid"), flag,
                " applies with --parallel fsdp, but --parallel is ", o.parallel, "; pass --parallel fsdp, or drop ",
                flag);
  }
  OCTET_CHECK(!given("--bucket-cap-mb") || o.parallel == "ddp", "--bucket-cap-mb sizes DDP's gradient buckets, but "
              "--parallel is ", o.parallel, "; pass --parallel ddp, or drop --bucket-cap-mb");
  for (const char* flag : {"--reduce-dtype", "--dist-backend"}) {
    OCTET_CHECK(!given(flag) || o.parallel != "none", flag, " applies with --parallel ddp or fsdp, but --parallel "
                "is none; pass --parallel ddp or fsdp (under mpirun), or drop ", flag);
  }
  OCTET_CHECK(!given("--lora-alpha") || o.lora_rank > 0, "--lora-alpha scales LoRA's adapters, but --lora-rank is "
              "0 (no adapters); pass --lora-rank R, or drop --lora-alpha");
  OCTET_CHECK(!given("--momentum") || o.optimizer == "sgd", "--momentum is SGD's, but --optimizer is ", o.optimizer,
              " (AdamW's moments have fixed betas here); pass --optimizer sgd, or drop --momentum");
  OCTET_CHECK(!given("--data-dir") || o.dataset == "fashion-mnist", "--data-dir is where Fashion-MNIST is read "
              "from, but --dataset is ", o.dataset, "; pass --dataset fashion-mnist, or drop --data-dir");
  OCTET_CHECK(!given("--synthetic-size") || o.dataset == "synthetic", "--synthetic-size sizes --dataset synthetic, "
              "but --dataset is ", o.dataset, "; pass --dataset synthetic, or drop --synthetic-size");
  // (Its default, 1e-5, above a --lr given alone is lowered to --lr: the schedule, apps/train_vit.cpp.)
  OCTET_CHECK(!given("--min-lr") || o.min_lr <= o.lr, "--min-lr ", o.min_lr, " is above --lr ", o.lr,
              ": the cosine would end above its peak; pass --min-lr ", o.lr, " or less");
  OCTET_CHECK(!given("--trace-steps") || !o.trace.empty(), "--trace-steps sets how many steps --trace records, "
              "but no --trace file is given; pass --trace FILE, or drop --trace-steps");
}

}  // namespace

void check_run_options(RunOptions& o) {
  OCTET_CHECK(o.precision == "fp32" || o.precision == "bf16" || o.precision == "fp8", "--precision ", o.precision,
              ": not a precision Octet trains in; pass fp32, bf16 or fp8");
  check_fp8_options(o.precision, o.fp8);
  check_flags_apply(o);
  // SGD's weight decay is L2 on the gradient, which momentum then amplifies by 1/(1 - momentum): the
  // AdamW default, 0.05, would shrink the weights ~10x as fast as under AdamW; 1e-4 is SGD's usual.
  if (o.optimizer == "sgd" && o.given.count("--weight-decay") == 0) o.weight_decay = 1e-4;
  const distributed::LaunchInfo launch = distributed::launch_info();
  o.world_size = launch.world_size, o.rank = launch.rank, o.local_rank = launch.local_rank;
  OCTET_CHECK(o.world_size == 1 || o.parallel != "none", "mpirun started ", o.world_size, " ranks but --parallel is "
              "none, so each would train alone on the same data; pass --parallel ddp or fsdp");
  // One GPU per rank: the local rank's. An explicit --device cuda:N puts every rank on GPU N (under
  // NCCL that needs NCCL 2.30 or newer with NCCL_MULTI_RANK_GPU_ENABLE=1: distributed/nccl_shared_device.h).
  const bool auto_device = o.device == "auto";
  if (auto_device) o.device = cuda::is_available() ? fmt::format("cuda:{}", launch.local_rank) : "cpu";
  Device device;
  try {
    device = Device::parse(o.device);
  } catch (const Error&) {
    OCTET_FAIL("--device ", o.device, ": not a device; pass auto, cpu, cuda or cuda:N");
  }
  if (device.is_cuda()) {
    OCTET_CHECK(cuda::is_available(), "--device ", o.device, ": ",
                OCTET_HAS_CUDA ? "no CUDA device is visible on this machine"
                               : "this build has no CUDA backend (configured with OCTET_CUDA=OFF)",
                "; pass --device cpu");
    OCTET_CHECK(!auto_device || device.index < cuda::device_count(), "--device auto: rank ", launch.rank,
                " is local rank ", launch.local_rank, " on its node, so its GPU is ", o.device, ", but this machine "
                "has ", cuda::device_count(), " CUDA device(s); start at most ", cuda::device_count(),
                " ranks per node, or put every rank on one GPU with --device cuda:0 (with --dist-backend mpi, or "
                "NCCL 2.30 or newer and NCCL_MULTI_RANK_GPU_ENABLE=1)");
    OCTET_CHECK(device.index < cuda::device_count(), "--device ", o.device, ": this machine has ",
                cuda::device_count(), " CUDA device(s); pick one of cuda:0..cuda:", cuda::device_count() - 1);
  }
  o.device = device.str();  // "cpu" or "cuda:N", as checkpoints record it
  OCTET_CHECK(!o.fp8_all_gather || (o.parallel == "fsdp" && o.precision == "fp8"), "--fp8-all-gather gathers "
              "FSDP's units in FP8, so it needs --parallel fsdp and --precision fp8 (got --parallel ", o.parallel,
              ", --precision ", o.precision, ")");
  check_hybrid_sharding(o, launch);
  OCTET_CHECK(o.lora_rank > 0 || o.lora_save.empty(), "--lora-save needs --lora-rank R: there are no adapters "
              "to save without it");
  OCTET_CHECK(o.checkpoint_every == 0 || !o.checkpoint_dir.empty(),
              "--checkpoint-every needs --checkpoint-dir DIR to say where checkpoints go");
  OCTET_CHECK(o.dist_backend != "nccl" || device.is_cuda(), "--dist-backend nccl runs collectives on GPUs, but "
              "--device is ", o.device, "; pass --dist-backend mpi (or auto) on the CPU");
  // The ranks on a node share its cores: more threads than cores makes OpenMP teams spin against
  // each other (at 4096 threads on 2 cores a step takes minutes).
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  OCTET_CHECK(cores == 0 || o.threads <= cores, "--threads ", o.threads, " is more than this machine's ", cores,
              " cores; pass at most ", cores, ", or leave it out for an even share of them among the node's ranks");
  if (o.threads == 0) o.threads = std::max(1, cores / launch.local_world_size);

  // Where the run will write, checked now rather than when it gets there (after training).
  if (o.rank == 0) {
    check_output_file("--metrics", o.metrics);
    check_output_file("--save-model", o.save_model);
    check_output_file("--lora-save", o.lora_save);
  }
  check_output_file("--trace", o.trace);  // every rank writes its own, beside it
  // Under FSDP every rank writes its shard; otherwise rank 0 alone.
  if (o.rank == 0 || o.parallel == "fsdp") check_output_folder("--checkpoint-dir", o.checkpoint_dir);
}

std::map<std::string, std::string> run_flags(const RunOptions& o) {
  auto num = [](double v) { return std::to_string(v); };
  std::map<std::string, std::string> flags = {{"model", o.model},
          {"dataset", o.dataset},
          {"epochs", std::to_string(o.epochs)},
          {"steps", std::to_string(o.steps)},
          {"batch_size", std::to_string(o.batch_size)},
          {"grad_accum", std::to_string(o.grad_accum)},
          {"optimizer", o.optimizer},
          {"lr", num(o.lr)},
          {"min_lr", num(o.min_lr)},
          {"weight_decay", num(o.weight_decay)},
          {"momentum", num(o.momentum)},
          {"warmup_steps", std::to_string(o.warmup_steps)},
          {"label_smoothing", num(o.label_smoothing)},
          {"clip_grad", num(o.clip_grad)},
          {"drop_path", num(o.drop_path)},
          {"gelu", o.gelu},
          {"autotune", o.autotune},
          {"precision", o.precision},
          {"device", o.device},
          {"seed", std::to_string(o.seed)},
          {"threads", std::to_string(o.threads)},
          {"parallel", o.parallel},
          {"sharding", o.parallel == "fsdp" ? o.sharding : "-"},
          {"shard_group_size", o.sharding.starts_with("hybrid") ? std::to_string(o.shard_group_size) : "-"},
          {"world_size", std::to_string(o.world_size)},
          {"reduce_dtype", o.reduce_dtype},
          {"lora_rank", std::to_string(o.lora_rank)}};
  if (o.precision == "fp8") {
    flags["fp8_recipe"] = o.fp8.recipe;
    flags["fp8_margin"] = std::to_string(o.fp8.margin);
    flags["fp8_format"] = o.fp8.format;
    if (o.fp8.recipe == "delayed") {
      flags["fp8_amax_history"] = std::to_string(o.fp8.amax_history);
      flags["fp8_amax_algo"] = o.fp8.amax_algo;
    }
  }
  return flags;
}

namespace {

// run_flags' key as the command line spells it: batch_size -> --batch-size (the world size is
// mpirun's -np).
std::string flag_of(std::string key) {
  if (key == "world_size") return "mpirun -np";
  std::replace(key.begin(), key.end(), '_', '-');
  return "--" + key;
}

}  // namespace

void check_resume_flags(const std::string& path, const std::map<std::string, std::string>& saved,
                        const std::map<std::string, std::string>& now) {
  auto both = [&](const std::string& key) { return saved.count(key) > 0 && now.count(key) > 0; };
  // What decides the shapes of the weights and the optimizer state.
  for (const std::string key : {"model", "lora_rank"}) {
    OCTET_CHECK(!both(key) || saved.at(key) == now.at(key), "--resume ", path, ": the checkpoint was trained with ",
                flag_of(key), " ", saved.at(key), " and this run has ", flag_of(key), " ", now.at(key),
                "; its weights fit only that model: pass ", flag_of(key), " ", saved.at(key));
  }
  // f32 weights or bf16 ones (with f32 masters): fp8 and bf16 share theirs, so either resumes the other.
  // FSDP's shards are f32 in every precision, so its checkpoints resume in any.
  auto low = [](const std::string& precision) { return precision != "fp32"; };
  const bool sharded = saved.count("parallel") > 0 && saved.at("parallel") == "fsdp";
  OCTET_CHECK(sharded || !both("precision") || low(saved.at("precision")) == low(now.at("precision")), "--resume ",
              path,
              ": the checkpoint was trained with --precision ", saved.at("precision"), " (",
              low(saved.at("precision")) ? "bf16 weights with f32 masters" : "f32 weights", ") and this run has "
              "--precision ", now.at("precision"), "; pass --precision ", saved.at("precision"),
              low(saved.at("precision")) ? " (or the other of bf16 and fp8)" : "");
}

void warn_about_changed_flags(const std::map<std::string, std::string>& saved,
                              const std::map<std::string, std::string>& now) {
  for (const auto& [key, value] : now) {
    const auto it = saved.find(key);
    if (it != saved.end() && it->second != value)
      logging::warn("resuming with {} {} where the checkpoint ran with {}: the run will not match an "
                    "uninterrupted one bit for bit", flag_of(key), value, it->second);
  }
}

models::ViTConfig model_config(const RunOptions& o) {
  models::ViTConfig config = models::vit_config(o.model);
  if (o.drop_path >= 0) config.drop_path_rate = o.drop_path;
  config.gelu = models::vit_gelu(o.gelu);
  return config;
}

std::shared_ptr<nn::Linear> fp8_log_linear(models::VisionTransformer& model, const std::string& name) {
  std::vector<std::string> fp8_linears;
  std::shared_ptr<nn::Linear> found;
  bool exists = false;
  for (const auto& [path, module] : model.named_modules()) {
    auto linear = std::dynamic_pointer_cast<nn::Linear>(module);
    if (path == name) exists = true, found = linear;
    if (linear && linear->fp8_allowed) fp8_linears.push_back(path);
  }
  std::string examples;
  for (size_t i = 0; i < fp8_linears.size() && i < 6; ++i) examples += (i ? ", " : "") + fp8_linears[i];
  if (fp8_linears.size() > 6) examples += ", ... (" + std::to_string(fp8_linears.size()) + " in all)";
  OCTET_CHECK(exists, "--fp8-log-layer ", name, ": ", model.config().name, " has no module of that name; pass "
              "one of its FP8 Linears: ", examples);
  OCTET_CHECK(found != nullptr && found->fp8_allowed, "--fp8-log-layer ", name, " is ",
              found ? "a Linear this model keeps out of FP8" : "not a Linear", ", so it has no FP8 numbers; pass "
              "one of the FP8 Linears: ", examples);
  const std::string reason =
      nn::fp8_linear_unsupported_reason(found->in_features, found->out_features, DType::bf16, DType::bf16);
  OCTET_CHECK(reason.empty(), "--fp8-log-layer ", name, " runs in bf16, not FP8 (", reason,
              "), so it has no FP8 numbers; pass another Linear: ", examples);
  return found;
}

Datasets load_datasets(const RunOptions& o, const models::ViTConfig& config) {
  Datasets d;
  if (o.dataset == "synthetic") {
    const Shape image{config.in_chans, config.img_size, config.img_size};
    d.train = data::make_synthetic(o.synthetic_size, image, config.num_classes, o.seed);
    d.test = data::make_synthetic(std::min<int64_t>(o.synthetic_size, 10000), image, config.num_classes, o.seed + 1);
    return d;
  }
  d.train = data::load_fashion_mnist(o.data_dir, /*train=*/true);
  d.test = data::load_fashion_mnist(o.data_dir, /*train=*/false);
  const Shape image = d.train->image_shape();
  OCTET_CHECK(image == Shape({config.in_chans, config.img_size, config.img_size}) &&
                  d.train->num_classes() == config.num_classes,
              "--model ", config.name, " takes ", config.in_chans, "x", config.img_size, "x", config.img_size,
              " images in ", config.num_classes, " classes, but Fashion-MNIST has ", image.str(), " images in ",
              d.train->num_classes(), " classes; use --model vit_fashion_mnist, or --dataset synthetic");
  return d;
}

void check_batch_fits(const RunOptions& o, const Datasets& d) {
  const int64_t step_images = o.batch_size * o.world_size;
  OCTET_CHECK(step_images <= d.train->size(), "--batch-size ", o.batch_size, " on each of ", o.world_size,
              " rank(s) takes ", step_images, " images a micro-batch, more than the training set's ", d.train->size(),
              "; lower --batch-size", o.world_size > 1 ? " or start fewer ranks" : "",
              o.dataset == "synthetic" ? ", or raise --synthetic-size" : "");
}

}  // namespace octet
