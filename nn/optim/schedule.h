// optim::WarmupCosineSchedule: the learning rate of llm.c / nanoGPT, a linear
// warmup to max_lr followed by a cosine decay to min_lr.
#pragma once

#include <cstdint>

namespace tessera::optim {

class WarmupCosineSchedule {
 public:
  // 0 <= min_lr <= max_lr, 0 <= warmup_steps <= total_steps.
  WarmupCosineSchedule(double max_lr, double min_lr, int64_t warmup_steps, int64_t total_steps);

  // The lr for step `step` (0-based):
  //   step < warmup:           max_lr * (step + 1) / warmup   (rises from ~0; max at the last warmup step)
  //   warmup <= step < total:  min_lr + (max_lr - min_lr) * (1 + cos(pi * r)) / 2,
  //                            r = (step - warmup) / (total - warmup)
  //   step >= total:           min_lr
  double lr(int64_t step) const;
  double operator()(int64_t step) const { return lr(step); }

  double max_lr() const { return max_lr_; }
  double min_lr() const { return min_lr_; }
  int64_t warmup_steps() const { return warmup_steps_; }
  int64_t total_steps() const { return total_steps_; }

 private:
  double max_lr_;
  double min_lr_;
  int64_t warmup_steps_;
  int64_t total_steps_;
};

}  // namespace tessera::optim
