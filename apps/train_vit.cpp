// train_vit: trains a Vision Transformer with Octet, the project's main program.
//
//   build/bin/train_vit                       Fashion-MNIST with the defaults below (the README's main job)
//   build/bin/train_vit --dataset synthetic --model vit_small_patch16_224 --steps 20
//   build/bin/train_vit --steps 200 --checkpoint-dir ckpt --checkpoint-every 100
//   build/bin/train_vit --steps 200 --resume ckpt          continues bitwise-exactly from ckpt/latest
//   build/bin/train_vit --device cuda --precision bf16     on the first GPU, bf16 with f32 master weights
//   build/bin/train_vit --precision fp8 --fp8-recipe delayed --fp8-amax-history 16   FP8 GEMMs in the blocks
//   mpirun -np 4 build/bin/train_vit --parallel ddp --batch-size 32   data parallel: 4 × 32 images per step
//
// train() reads top to bottom: setup (model, data parallelism, optimizer, data, schedule, resume),
// then the loop. Each step is apps/train_step.h's (forward, loss, backward, clip, optimizer step, as
// bench_vit times it); apps/train_report.h reports around it (logs, metrics, FP8 numbers, memory
// ledger, trace); evaluation and checkpoints follow on their schedules. On a GPU the host reads
// nothing from the device between log steps (apps/train_step.cpp lists the syncs that remain): the
// losses are read at log steps, evaluations and checkpoints.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <memory>
#include <string>

#include "apps/checkpoint.h"
#include "apps/flag_checks.h"
#include "apps/parallel.h"
#include "apps/run_options.h"
#include "apps/train_report.h"
#include "apps/train_step.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/log.h"
#include "core/random.h"
#include "data/device_prefetcher.h"
#include "data/loader.h"
#include "distributed/fsdp_checkpoint.h"
#include "distributed/launch.h"
#include "kernels/reduce.h"
#include "kernels/threads.h"
#include "models/vit.h"
#include "nn/fp8.h"
#include "nn/layers.h"
#include "nn/lora.h"
#include "nn/safetensors.h"
#include "optim/optim.h"

using namespace octet;

namespace {

// Training batches on the run's device: straight from the loader on the CPU; on a GPU through the
// prefetcher, which copies batch k+1 on its own stream while step k computes.
class TrainBatches {
 public:
  TrainBatches(data::DataLoader& loader, Device device) : loader_(loader) {
#if OCTET_HAS_CUDA
    if (device.is_cuda()) prefetcher_ = std::make_unique<data::DevicePrefetcher>(loader, device);
#else
    OCTET_CHECK(device.is_cpu(), "train_vit: ", device.str(), " needs a CUDA build");
#endif
  }
  data::Batch next() {
#if OCTET_HAS_CUDA
    if (prefetcher_) return prefetcher_->next();
#endif
    return loader_.next();
  }
  // The position of the batch next() returns next.
  data::DataLoader::State state() const {
#if OCTET_HAS_CUDA
    if (prefetcher_) return prefetcher_->state();
#endif
    return loader_.state();
  }
  void set_state(data::DataLoader::State state) {
#if OCTET_HAS_CUDA
    if (prefetcher_) return prefetcher_->set_state(state);
#endif
    loader_.set_state(state);
  }

 private:
  data::DataLoader& loader_;
#if OCTET_HAS_CUDA
  std::unique_ptr<data::DevicePrefetcher> prefetcher_;
#endif
};

// Accuracy and mean cross-entropy (no label smoothing) over the whole test set, on `device`.
// Under --precision fp8 this runs outside any Fp8Autocast scope, as a plain bf16 forward: evaluation
// then never touches the FP8 scaling state (amax histories, scales), so how often a run evaluates
// cannot change its training.
// Under data parallelism each rank evaluates its share of the test set and the counts are summed
// over the ranks. A rank's last batch may be empty; under FSDP every forward gathers parameters
// collectively, so such a rank still runs one (on a single blank image) and counts nothing.
EvalResult evaluate(models::VisionTransformer& model, data::DataLoader& loader, Device device,
                    distributed::ProcessGroup* group, bool forward_every_batch) {
  NoGradGuard no_grad;
  model.eval();
  int64_t correct = 0, seen = 0;
  double loss_sum = 0;
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    const data::Batch batch = loader.next();
    if (batch.labels.numel() == 0) {
      if (forward_every_batch) {
        Shape blank = batch.images.shape();
        blank[0] = 1;
        model(zeros(blank, DType::f32, device));
      }
      continue;
    }
    const Tensor logits = model(batch.images.to(device));
    const int64_t n = batch.labels.numel();
    loss_sum += cross_entropy(logits, batch.labels.to(device)).item() * static_cast<double>(n);
    // The arg-max of a few hundred rows is read on the host anyway: take it there.
    const Tensor predicted = kernels::max(logits.to(Device::cpu()), 1).indices;
    const int64_t* p = predicted.data<int64_t>();
    const int64_t* y = batch.labels.data<int64_t>();
    for (int64_t i = 0; i < n; ++i) correct += p[i] == y[i];
    seen += n;
  }
  model.train();
  if (group != nullptr) {
    const Tensor totals = from_vector<double>({static_cast<double>(correct), static_cast<double>(seen), loss_sum}, {3})
                              .to(group->device());
    group->all_reduce(totals, distributed::ReduceOp::Sum)->wait();
    const std::vector<double> t = totals.to_vector<double>();
    return {t[0] / t[1], t[2] / t[1]};
  }
  return {static_cast<double>(correct) / static_cast<double>(seen), loss_sum / static_cast<double>(seen)};
}

std::unique_ptr<optim::Optimizer> make_optimizer(const RunOptions& o, const ParallelModel& parallel) {
  auto groups = parallel.param_groups(o.lr, o.weight_decay);
  if (o.optimizer == "sgd") return std::make_unique<optim::SGD>(groups, o.lr, o.momentum, 0.0, /*nesterov=*/true);
  return std::make_unique<optim::AdamW>(groups, o.lr, o.beta1, o.beta2, 1e-8, o.weight_decay);
}

// LoRA: adapters on the blocks' Linears, everything else frozen but the head. Runs before any
// wrapper or optimizer takes the parameters.
void add_lora_adapters(models::VisionTransformer& model, const RunOptions& o) {
  Generator lora_generator(o.seed + 2);
  const auto adapted = nn::apply_lora(model, {.rank = o.lora_rank, .alpha = o.lora_alpha, .generator = &lora_generator},
                                      nn::lora_targets({"qkv", "proj", "fc1", "fc2"}), {"head.weight", "head.bias"});
  int64_t trainable = 0;
  for (const Tensor& p : model.parameters()) trainable += p.requires_grad() ? p.numel() : 0;
  logging::info("LoRA rank {} (alpha {}) on {} Linears: {} of {} parameters train", o.lora_rank, o.lora_alpha,
                adapted.size(), trainable, model.num_parameters());
}

// Everything that continues the run after `step` bitwise-exactly; returns the checkpoint's folder.
// Under FSDP every rank writes its shards; otherwise rank 0 alone calls this.
std::string save_checkpoint(const RunOptions& o, int64_t step, data::DataLoader::State loader,
                            models::VisionTransformer& model, ParallelModel& parallel, optim::Optimizer& optimizer) {
  const Generator& rng = default_generator();
  const apps::TrainerState state{.step = step, .loader = loader, .rng_seed = rng.seed(), .rng_offset = rng.offset(),
                                 .run = run_flags(o)};
  return parallel.fsdp() ? apps::save_sharded_checkpoint(o.checkpoint_dir, *parallel.fsdp(), optimizer, model, state)
                         : apps::save_checkpoint(o.checkpoint_dir, model, optimizer, state);
}

// --save-model and --lora-save, at the end of the run. Every rank calls this: under FSDP the
// weights are gathered from the shards collectively; rank 0 writes.
void save_weights(const RunOptions& o, models::VisionTransformer& model, ParallelModel& parallel, bool lead) {
  if (!o.save_model.empty()) {
    if (parallel.fsdp()) {
      distributed::export_consolidated(o.save_model, *parallel.fsdp());  // gathers; rank 0 writes
    } else if (lead) {
      nn::save_safetensors(o.save_model, model.state_dict(), {{"format", "pt"}});
    }
    logging::info("model weights written to {}", o.save_model);
  }
  if (!o.lora_save.empty()) {
    // The adapters and the head alone, under their full names.
    nn::StateDict adapters;
    for (auto& [name, tensor] : parallel.full_parameters()) {
      if (nn::is_lora_parameter_name(name) || name == "head.weight" || name == "head.bias") adapters[name] = tensor;
    }
    if (lead) {
      nn::save_safetensors(o.lora_save, adapters, {{"lora_rank", std::to_string(o.lora_rank)},
                                                   {"lora_alpha", std::to_string(o.lora_alpha)}});
      logging::info("LoRA adapters and head ({} tensors) written to {}", adapters.size(), o.lora_save);
    }
  }
}

int train(const RunOptions& o) {
  kernels::set_num_threads(o.threads);
  const models::ViTConfig config = model_config(o);
  const Device device = Device::parse(o.device);

  // Data parallelism: one process group for the job; --batch-size images per rank per step.
  std::shared_ptr<distributed::ProcessGroup> group;
  if (o.parallel != "none") group = distributed::init_process_group(device, distributed::parse_backend(o.dist_backend));
  const int rank = group ? group->rank() : 0, world = group ? group->size() : 1;
  const bool lead = rank == 0;  // writes the metrics and checkpoints, and logs; other ranks log warnings only
  if (!lead) logging::set_level("warn");

  const Datasets datasets = load_datasets(o, config);
  check_batch_fits(o, datasets);
  Generator init_generator(o.seed);
  auto model_ptr = std::make_shared<models::VisionTransformer>(config, /*initialize=*/true, &init_generator);
  models::VisionTransformer& model = *model_ptr;
  // bf16 and fp8 train bf16 weights (ParallelModel says how); fp8 is the bf16 model whose blocks'
  // Linears run their GEMMs in FP8 inside the step's Fp8Autocast scope.
  const bool fp8 = o.precision == "fp8";
  model.to(device);
  if (o.lora_rank > 0) add_lora_adapters(model, o);
  for (const auto& block : model.transformer_blocks()) block->recompute = o.recompute == "blocks";
  // The default generator draws dropout and drop-path masks: each rank its own stream (rank 0's is
  // a single process's), so ranks do not drop the same rows of their shards.
  manual_seed(o.seed + 1 + static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ull);
  ParallelModel parallel(o, model_ptr, group);
  auto optimizer = make_optimizer(o, parallel);
  // The Linear whose FP8 numbers the report logs, found now so that a wrong --fp8-log-layer fails
  // before a checkpoint loads.
  const std::shared_ptr<nn::Linear> fp8_logged = fp8 ? fp8_log_linear(model, o.fp8_log_layer) : nullptr;

  // On a GPU the host has nothing else to do: let every core assemble batches (synthetic 224x224
  // images cost milliseconds each).
  data::LoaderOptions train_options{.batch_size = o.batch_size, .shuffle = true, .drop_last = true, .seed = o.seed,
                                    .rank = rank, .world_size = world, .threads = device.is_cuda() ? o.threads : 1};
  data::DataLoader train_loader(datasets.train, train_options);
  TrainBatches train_batches(train_loader, device);
  data::DataLoader test_loader(datasets.test, {.batch_size = o.eval_batch_size, .shuffle = false, .drop_last = false,
                                               .rank = rank, .world_size = world});
  const int64_t total_steps =
      o.steps > 0 ? o.steps : std::max<int64_t>(1, o.epochs * train_loader.batches_per_epoch() / o.grad_accum);
  const int64_t warmup_steps = std::min(o.warmup_steps, total_steps);  // a short run warms up throughout
  if (warmup_steps < o.warmup_steps && rank == 0) {
    logging::info("--warmup-steps {} is longer than the run's {} steps: the lr rises over the whole run and never "
                  "decays; pass a smaller --warmup-steps for a cosine decay", o.warmup_steps, total_steps);
  }
  const optim::WarmupCosineSchedule schedule(o.lr, warmup_steps, total_steps, std::min(o.min_lr, o.lr));

  int64_t step = 0;
  if (!o.resume.empty()) {
    check_resume_flags(o.resume, apps::checkpoint_run_flags(o.resume), run_flags(o));
    const apps::TrainerState state =
        parallel.fsdp() ? apps::load_sharded_checkpoint(o.resume, *parallel.fsdp(), *optimizer, model)
                        : apps::load_checkpoint(o.resume, model, *optimizer);
    warn_about_changed_flags(state.run, run_flags(o));
    step = state.step;
    train_batches.set_state(state.loader);
    // Every rank has drawn as many numbers as rank 0, whose offset the checkpoint holds.
    default_generator().set_state(default_generator().seed(), state.rng_offset);
    logging::info("resumed from {} at step {} (epoch {}, batch {})", apps::resolve_checkpoint(o.resume), step,
                  state.loader.epoch, state.loader.batch);
  }
  OCTET_CHECK(step < total_steps, "the checkpoint is at step ", step, " but the run ends at step ", total_steps,
              "; raise --steps or --epochs to train further");

  TrainReport report(o, model, parallel, *optimizer, group.get(), fp8_logged, step, total_steps);
  report.start();

  // The step (apps/train_step.h), with ParallelModel's backward and clip, which reduce the
  // gradients over the ranks under DDP and FSDP.
  const TrainStep train_step{
      .model = model,
      .criterion = nn::CrossEntropyLoss(o.label_smoothing),
      .optimizer = *optimizer,
      .backward = [&](const Tensor& loss, bool last_micro_batch) { parallel.backward(loss, last_micro_batch); },
      .clip_grad_norm = [&](double max_norm) { parallel.clip_grad_norm_(max_norm); },
      .grad_accum = o.grad_accum,
      .clip_grad = o.clip_grad,
      .fp8 = fp8,
      .fp8_recipe = fp8_recipe_from(o.fp8),
      .amax_reducer = group ? distributed::fp8_amax_reducer(group) : nullptr,
      .hooks = {.before_zero_grad = [&] { report.read_ledger(); }},
      .held_bytes = [&] { return parallel.held_bytes(); }};

  model.train();
  while (step < total_steps) {
    report.begin_step(step);
    const double lr = schedule.lr(step);
    optimizer->set_lr(lr);
    const StepResult result = train_step([&] { return train_batches.next(); });
    ++step;
    report.end_step(step, lr, result);

    const bool end_of_epoch = train_batches.state().batch == 0;
    const bool eval_now = o.eval_every > 0 ? step % o.eval_every == 0 : end_of_epoch;
    if (eval_now || step == total_steps) {
      // Evaluation waits for the device anyway: read the queued losses first, so that a non-finite
      // one ends the run before it is evaluated.
      report.read_losses();
      report.eval(step, result.batch.epoch,
                  evaluate(model, test_loader, device, group.get(), /*forward_every_batch=*/parallel.fsdp() != nullptr));
    }
    const bool checkpoint_now = o.checkpoint_every > 0 ? step % o.checkpoint_every == 0 : step == total_steps;
    if (!o.checkpoint_dir.empty() && (checkpoint_now || step == total_steps) && (lead || parallel.fsdp())) {
      report.read_losses();  // never checkpoint a run whose loss has become NaN or inf
      const std::string where = save_checkpoint(o, step, train_batches.state(), model, parallel, *optimizer);
      logging::info("checkpoint written to {}", where);
    }
  }
  save_weights(o, model, parallel, lead);
  report.end(step);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"train_vit: train a Vision Transformer with Octet (Fashion-MNIST by default)"};
  app.failure_message(explain_parse_error);
  RunOptions options;
  add_run_flags(app, options);
  try {
    app.parse(argc, argv);
    check_run_options(options);
    apply_fp8_switches(options.fp8);
    apply_autotune(options.autotune, Device::parse(options.device));
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, or the error and a pointer to --help
    return code == 0 ? 0 : 2;
  } catch (const Error& e) {
    logging::error("{}", e.what());
    return 2;
  }
  // An exception on any rank ends every rank of the job (MPI_Abort), naming the rank that failed.
  return distributed::run_rank_main([&] { return train(options); });
}
