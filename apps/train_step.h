#pragma once
// The training step, one for train_vit (which trains with it) and bench_vit (which times it), so that
// the benchmark measures what training runs. A step is one optimizer update:
//
//   for each of grad_accum micro-batches:
//     forward and loss, inside an Fp8Autocast scope when fp8
//     backward of the loss scaled by 1/grad_accum
//   clip the gradients' global norm, optimizer step, zero_grad
//
// The learning rate is the caller's to set before the step (train_vit sets its schedule's).
#include <cstdint>
#include <functional>

#include "core/tensor.h"
#include "data/loader.h"
#include "nn/fp8.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace octet {

struct StepResult {
  Tensor loss;        // the mean over the micro-batches, on the model's device: reading it waits for the step
  data::Batch batch;  // the last micro-batch (train_vit logs its epoch)
  // What the first micro-batch's forward left alive for its backward: the device's bytes in use
  // (core/storage.h, memory_in_use) after the forward less before it, less what `held_bytes` says the
  // forward allocated that is not activations. --recompute blocks shrinks it to about one block input
  // per block. Reading it costs nothing (two counter reads).
  int64_t saved_activation_bytes = 0;
};

// Called at the step's boundaries, for whoever watches it: after each micro-batch's forward (the FP8
// scope closed, its scale update done) and backward, and once after the optimizer step, before
// zero_grad frees the gradients. bench_vit times the phases between them; train_vit reads FSDP's
// memory ledger at the step's high-water mark.
struct StepHooks {
  std::function<void()> after_forward{}, after_backward{}, before_zero_grad{};
};

struct TrainStep {
  nn::Module& model;
  nn::CrossEntropyLoss criterion;
  optim::Optimizer& optimizer;
  // Backward of one micro-batch's loss, and the clip of the gradients' global norm (needed when
  // clip_grad > 0). One process runs loss.backward(); train_vit passes ParallelModel's, which reduce
  // the gradients over the ranks under DDP and FSDP.
  std::function<void(const Tensor& loss, bool last_micro_batch)> backward{};
  std::function<void(double max_norm)> clip_grad_norm{};
  int64_t grad_accum = 1;  // micro-batches per step
  double clip_grad = 0;    // the bound on the gradients' global norm; 0 = no clip
  bool fp8 = false;        // the forward's Linears run their GEMMs in FP8 under fp8_recipe
  nn::Fp8Recipe fp8_recipe{};
  nn::AmaxReducer amax_reducer = nullptr;  // reduces the FP8 amaxes over the ranks; null in one process
  StepHooks hooks{};
  // Bytes held now that a forward may allocate and that are not activations: FSDP's gathered units,
  // the FP8 Linears' weight casts. Subtracted from the saved-activation figure; none when null.
  std::function<int64_t()> held_bytes{};

  // One step on grad_accum batches drawn from next_batch.
  StepResult operator()(const std::function<data::Batch()>& next_batch) const;
};

}  // namespace octet
