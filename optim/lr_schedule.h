#pragma once
// Learning-rate schedules. A schedule maps the index of an optimizer update to its lr:
//
//   for (int64_t step = 0; step < total_steps; ++step) { opt.set_lr(schedule.lr(step)); opt.step(); }
#include <cstdint>

namespace octet::optim {

// Linear warmup, then half a cosine down to min_lr (timm's and most ViT recipes' shape).
// Steps count from 0, the index of the update about to be made:
//   step < warmup_steps:               lr = base_lr · (step + 1) / warmup_steps
//                                      (so step 0 already trains, and step warmup_steps - 1 is at base_lr)
//   warmup_steps <= step < total_steps: lr = min_lr + (base_lr - min_lr) · (1 + cos(π·t)) / 2,
//                                      t = (step - warmup_steps) / (total_steps - warmup_steps)
//                                      (starts at base_lr; half way through the decay it is
//                                      (base_lr + min_lr) / 2)
//   step >= total_steps:               lr = min_lr
// warmup_steps may be 0 (no warmup) and may equal total_steps (no decay).
class WarmupCosineSchedule {
 public:
  WarmupCosineSchedule(double base_lr, int64_t warmup_steps, int64_t total_steps, double min_lr = 0);
  double lr(int64_t step) const;

  double base_lr() const { return base_lr_; }
  double min_lr() const { return min_lr_; }
  int64_t warmup_steps() const { return warmup_steps_; }
  int64_t total_steps() const { return total_steps_; }

 private:
  double base_lr_;
  int64_t warmup_steps_, total_steps_;
  double min_lr_;
};

}  // namespace octet::optim
