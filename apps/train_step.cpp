// The training step. On a GPU it queues its work and returns without waiting for the device: it
// reads no tensor value on the host and synchronizes no stream or event, so the host runs ahead and
// the GPU never idles between steps. tests/apps/test_train_step_syncs.cpp proves it on the CPU with
// core/host_sync.h's count, and tests/cuda/test_cuda_step_syncs.cpp on a GPU, where a step is also
// queued behind a kernel that holds the stream: a step that waited for the device would hang there.
// What the step does instead of a host read:
//   - clip: the norm, the coefficient and the scaling stay on the device (optim/clip_grad.h);
//   - DropPath and dropout draw their masks on the device from (seed, offset) (kernels/random_masks.h);
//   - the loss comes back as a device tensor (StepResult::loss).
//
// The host syncs that remain, per step and why:
//   - log steps (--log-every), and evaluations and checkpoints: TrainReport::read_losses reads the
//     queued losses in one host read (and checks them for NaN); under --precision fp8 the log step
//     also reads --fp8-log-layer's scales, amaxes and output error. Evaluation reads its predictions
//     and losses; a checkpoint copies the state to the host. All are on their own schedule.
//   - the first step (and a new shape): the cuBLASLt workspace is allocated with cudaMalloc and cuDNN
//     builds its attention plans; either may wait for the device, once. With --autotune on, each new
//     GEMM or attention problem also waits once for each candidate it times (kernels/autotune.h).
//   - a host far ahead of the GPU: the device prefetcher (data/device_prefetcher.h) hands out a
//     batch only once its worker has a pinned buffer free, i.e. once the GPU has copied out of it:
//     a wait only when the host is ~3 batches ahead, the back-pressure any bounded queue needs.
//   - data parallelism over MPI with GPU tensors: the MPI group stages every collective through the
//     host. NCCL (the GPU default) orders its collectives on the device: no host wait.
//   - a device without a stream-ordered memory pool, or OCTET_NO_CUDA_MEMORY_POOL=1: every free is
//     a cudaFree, which waits for the device (core/cuda_memory.h).
//   - --trace: writing the trace resolves the GPU-timed collective spans with event waits.
#include "apps/train_step.h"

#include "autograd/ops.h"
#include "core/storage.h"

namespace octet {

namespace {

void call(const std::function<void()>& hook) {
  if (hook) hook();
}

}  // namespace

StepResult TrainStep::operator()(const std::function<data::Batch()>& next_batch) const {
  // Each micro-batch's loss is scaled by 1/grad_accum, so that the gradients sum to those of the
  // mean. Under DDP all but the last backward skip the all-reduce (no_sync); the last reduces the sum.
  StepResult result;
  for (int64_t micro = 0; micro < grad_accum; ++micro) {
    result.batch = next_batch();
    const Device device = result.batch.images.device();
    const int64_t in_use = static_cast<int64_t>(memory_in_use(device)), held = held_bytes ? held_bytes() : 0;
    Tensor loss;
    {
      // FP8 covers the forward only. Leaving the scope updates the forward scales; the backward,
      // which runs after it, updates the gradient scales at its end.
      nn::Fp8Autocast fp8_scope(fp8, fp8_recipe, amax_reducer);
      loss = criterion(model(result.batch.images), result.batch.labels);
    }
    if (micro == 0) {
      result.saved_activation_bytes = static_cast<int64_t>(memory_in_use(device)) - in_use -
                                      ((held_bytes ? held_bytes() : 0) - held);
    }
    call(hooks.after_forward);
    const Tensor scaled = grad_accum > 1 ? loss * (1.0 / static_cast<double>(grad_accum)) : loss;
    backward(scaled, micro + 1 == grad_accum);
    call(hooks.after_backward);
    result.loss = micro == 0 ? scaled.detach() : result.loss + scaled.detach();
  }
  if (clip_grad > 0) clip_grad_norm(clip_grad);
  optimizer.step();
  call(hooks.before_zero_grad);
  optimizer.zero_grad();
  return result;
}

}  // namespace octet
