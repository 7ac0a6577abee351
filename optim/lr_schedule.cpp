#include "optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace octet::optim {

WarmupCosineSchedule::WarmupCosineSchedule(double base_lr, int64_t warmup_steps, int64_t total_steps,
                                           double min_lr)
    : base_lr_(base_lr), warmup_steps_(warmup_steps), total_steps_(total_steps), min_lr_(min_lr) {
  OCTET_CHECK(std::isfinite(base_lr) && base_lr >= 0,
              "WarmupCosineSchedule: base_lr must be finite and >= 0, got ", base_lr);
  OCTET_CHECK(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= base_lr,
              "WarmupCosineSchedule: min_lr must be in [0, base_lr] (the cosine decays from base_lr down "
              "to it), got ", min_lr, " with base_lr ", base_lr);
  OCTET_CHECK(warmup_steps >= 0 && warmup_steps <= total_steps,
              "WarmupCosineSchedule: need 0 <= warmup_steps <= total_steps, got warmup_steps ", warmup_steps,
              " and total_steps ", total_steps, "; warmup is part of the total");
}

double WarmupCosineSchedule::lr(int64_t step) const {
  OCTET_CHECK(step >= 0, "WarmupCosineSchedule::lr: step counts updates from 0, got ", step);
  if (step < warmup_steps_) {
    return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
  }
  if (step >= total_steps_) return min_lr_;
  const double t =
      static_cast<double>(step - warmup_steps_) / static_cast<double>(total_steps_ - warmup_steps_);
  return min_lr_ + (base_lr_ - min_lr_) * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
}

}  // namespace octet::optim
