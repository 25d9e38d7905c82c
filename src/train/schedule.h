// Per-iteration learning-rate schedules (step, linear, cosine) with linear warmup, and linear LR scaling.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace convnets::train {

struct ScheduleOptions {
  std::string kind = "cosine";  // step | linear | cosine | staircase
  bool per_epoch = true;        // the LR changes at epoch starts only (DLE, timm); false: every step
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

// Per epoch (per_epoch), exactly as the references evaluate them at epoch e
// (the LR then holds for every step of e):
//   DLE's lr_{step,linear,cosine}_policy (ConvNets image_classification/
//   optimizers.py): warmup base (e + 1) / W for e < W; then cosine
//   end + (base - end) (1 + cos(pi (e - W) / (E - W))) / 2, linear
//   end + (base - end) (1 - (e - W) / (E - W)) (DLE has no end: end 0), step
//   base * factor^(number of listed epochs <= e);
//   timm 0.5.4's StepLRScheduler behind GPUNet's --sched step (staircase here):
//   warmup warmup_lr + e (base - warmup_lr) / W for e < W, then
//   base * factor^(e // decay_epochs) with Python's float floor division and
//   e counted from 0, warmup included.
// With warmup_lr > 0 the warmup is timm's for every kind, else DLE's.
// Per step (!per_epoch), the same curves with e replaced by the fractional
// epoch of the step and warmup over the first W * steps_per_epoch steps.
class LrSchedule {
 public:
  explicit LrSchedule(ScheduleOptions o);
  double at(std::int64_t step) const;
  double at_epoch(std::int64_t epoch) const;  // per_epoch: the LR of every step of `epoch`
  std::int64_t total_steps() const { return total_; }
  std::int64_t warmup_steps() const { return warmup_; }

 private:
  ScheduleOptions o_;
  std::int64_t total_, warmup_;
};

// a // b of two positive floats as CPython computes it (float_floor_div),
// which timm's decay point relies on: 12 // 2.4 is 5 there, not 4.
double python_floordiv(double a, double b);

// Goyal et al. 2017 linear scaling: lr * optimizer_batch / reference (0: none).
double scaled_lr(double lr, std::int64_t optimizer_batch, std::int64_t reference_batch);

}  // namespace convnets::train
