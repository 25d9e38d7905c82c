#include "train/schedule.h"

#include <cmath>

namespace convnets::train {

LrSchedule::LrSchedule(ScheduleOptions o) : o_(std::move(o)) {
  total_ = o_.steps_per_epoch * o_.epochs;
  warmup_ = static_cast<std::int64_t>(std::llround(o_.warmup_epochs * static_cast<double>(o_.steps_per_epoch)));
  if (warmup_ >= total_) warmup_ = total_ > 0 ? total_ - 1 : 0;
}

double python_floordiv(double a, double b) {
  const double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0;
  if (div == 0) return std::copysign(0.0, a / b);
  double floordiv = std::floor(div);
  if (div - floordiv > 0.5) floordiv += 1.0;
  return floordiv;
}

double LrSchedule::at_epoch(std::int64_t epoch) const {
  const double e = static_cast<double>(epoch);
  const double w = o_.warmup_epochs;
  if (e < w) {
    if (o_.warmup_lr > 0) return o_.warmup_lr + e * (o_.base_lr - o_.warmup_lr) / w;
    return o_.base_lr * (e + 1) / w;
  }
  if (o_.kind == "staircase") return o_.base_lr * std::pow(o_.step_factor, python_floordiv(e, o_.decay_epochs));
  if (o_.kind == "step") {
    double lr = o_.base_lr;
    for (double s : o_.steps) {
      if (e >= s) lr *= o_.step_factor;
    }
    return lr;
  }
  const double span = static_cast<double>(o_.epochs) - w;
  const double p = span > 0 ? (e - w) / span : 0.0;
  if (o_.kind == "linear") return o_.end_lr + (o_.base_lr - o_.end_lr) * (1.0 - p);
  return o_.end_lr + 0.5 * (1.0 + std::cos(M_PI * p)) * (o_.base_lr - o_.end_lr);
}

double LrSchedule::at(std::int64_t step) const {
  if (o_.per_epoch) return at_epoch(step / o_.steps_per_epoch);
  if (step < warmup_) {
    const double w = static_cast<double>(warmup_);
    if (o_.warmup_lr > 0) return o_.warmup_lr + (o_.base_lr - o_.warmup_lr) * static_cast<double>(step) / w;
    return o_.base_lr * static_cast<double>(step + 1) / w;
  }
  if (o_.kind == "staircase") {
    const double epoch = static_cast<double>(step) / static_cast<double>(o_.steps_per_epoch);
    // The epsilon keeps a boundary such as 24 steps / 10 / 2.4 from rounding below 1.
    return o_.base_lr * std::pow(o_.step_factor, std::floor(epoch / o_.decay_epochs + 1e-9));
  }
  if (o_.kind == "step") {
    const double epoch = static_cast<double>(step) / static_cast<double>(o_.steps_per_epoch);
    double lr = o_.base_lr;
    for (double s : o_.steps) {
      if (epoch >= s) lr *= o_.step_factor;
    }
    return lr;
  }
  const double span = static_cast<double>(total_ - warmup_);
  const double p = span > 0 ? static_cast<double>(step - warmup_) / span : 0.0;
  if (o_.kind == "linear") return o_.end_lr + (o_.base_lr - o_.end_lr) * (1.0 - p);
  return o_.end_lr + 0.5 * (o_.base_lr - o_.end_lr) * (1.0 + std::cos(M_PI * p));
}

double scaled_lr(double lr, std::int64_t optimizer_batch, std::int64_t reference_batch) {
  if (reference_batch <= 0) return lr;
  return lr * static_cast<double>(optimizer_batch) / static_cast<double>(reference_batch);
}

}  // namespace convnets::train
