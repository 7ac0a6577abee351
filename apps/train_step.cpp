#include "apps/train_step.h"

#include "autograd/ops.h"

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
    Tensor loss;
    {
      // FP8 covers the forward only. Leaving the scope updates the forward scales; the backward,
      // which runs after it, updates the gradient scales at its end.
      nn::Fp8Autocast fp8_scope(fp8, fp8_recipe, amax_reducer);
      loss = criterion(model(result.batch.images), result.batch.labels);
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
