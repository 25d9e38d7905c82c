// Per-iteration learning-rate schedules (step, linear, cosine) with linear warmup, and linear LR scaling.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace convnets::train {

struct ScheduleOptions {
  std::string kind = "cosine";  // step | linear | cosine
  double base_lr = 0.1;         // after linear scaling
  double warmup_epochs = 0;
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
// at each listed epoch.
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
