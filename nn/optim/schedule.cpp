// optim::WarmupCosineSchedule: linear warmup, cosine decay, then flat.
#include "nn/optim/schedule.h"

#include <cmath>
#include <numbers>

#include "tensor/error.h"

namespace tessera::optim {

WarmupCosineSchedule::WarmupCosineSchedule(double max_lr, double min_lr, int64_t warmup_steps, int64_t total_steps)
    : max_lr_(max_lr), min_lr_(min_lr), warmup_steps_(warmup_steps), total_steps_(total_steps) {
  TESSERA_CHECK(min_lr >= 0.0 && min_lr <= max_lr, "WarmupCosineSchedule: need 0 <= min_lr <= max_lr, got {} and {}",
                min_lr, max_lr);
  TESSERA_CHECK(warmup_steps >= 0 && warmup_steps <= total_steps,
                "WarmupCosineSchedule: need 0 <= warmup_steps <= total_steps, got {} and {}", warmup_steps,
                total_steps);
}

double WarmupCosineSchedule::lr(int64_t step) const {
  TESSERA_CHECK(step >= 0, "WarmupCosineSchedule: step must be >= 0, got {}", step);
  if (step < warmup_steps_) {
    return max_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
  }
  if (step >= total_steps_) return min_lr_;
  const double ratio = static_cast<double>(step - warmup_steps_) / static_cast<double>(total_steps_ - warmup_steps_);
  return min_lr_ + (max_lr_ - min_lr_) * 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
}

}  // namespace tessera::optim
