// Per-iteration learning-rate schedules (step, linear, cosine) with linear warmup, and linear LR scaling.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace convnets::train {

struct ScheduleOptions {
  std::string kind = "cosine";  // step | linear | cosine | staircase
  double base_lr = 0.1;         // after linear scaling
  double warmup_epochs = 0;
  double warmup_lr = 0;         // > 0: warmup starts here instead of at base/W
  double decay_epochs = 2.4;    // staircase: epochs between decays by step_factor
  std::vector<double> steps;    // step: epochs where the LR is multiplied by step_factor
  double step_factor = 0.1;
  double end_lr = 0;
  std::int64_t steps_per_epoch = 1;
  std::int64_t epochs = 1;
};

// DLE's lr_{step,linear,cosine}_policy (image_classification/training.py),
// evaluated per optimizer step rather than per epoch: warmup rises linearly
// from base/W to base over the first W steps; after it, cosine follows
// end + (base - end) (1 + cos(pi p)) / 2 and linear end + (base - end)(1 - p),
// with p the fraction of post-warmup steps done; step multiplies by the factor
// at each listed epoch. staircase is timm's "step" scheduler of the GPUNet and
// EfficientNet recipes (--sched step --decay-epochs 2.4 --decay-rate 0.97):
// base * factor^floor(epoch / decay_epochs), epoch counted from step 0, here
// per step (timm updates at epoch ends, so its first decay of 2.4 lands at 3).
// With warmup_lr > 0, warmup rises linearly from warmup_lr to base (timm's
// --warmup-lr) instead of from base/W.
class LrSchedule {
 public:
  explicit LrSchedule(ScheduleOptions o);
  double at(std::int64_t step) const;
  std::int64_t total_steps() const { return total_; }
  std::int64_t warmup_steps() const { return warmup_; }

 private:
  ScheduleOptions o_;
  std::int64_t total_, warmup_;
};

// Goyal et al. 2017 linear scaling: lr * optimizer_batch / reference (0: none).
double scaled_lr(double lr, std::int64_t optimizer_batch, std::int64_t reference_batch);

}  // namespace convnets::train
