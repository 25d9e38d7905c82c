// Exponential moving average of a model's weights, kept as a second model that evaluation can run as is.
#pragma once

#include "models/network.h"

namespace convnets::train {

// DLE's EMA (image_classification/models/common.py) and timm's ModelEmaV2:
// every floating-point state_dict entry (parameters and BN statistics) moves
// as ema = decay * ema + (1 - decay) * model; integer buffers are copied.
//
// With `warmup`, DLE's decay min(decay, (1 + t) / (10 + t)) at step t, so
// the early average is not dominated by the random initialisation; timm's
// ModelEmaV2 has none. The warm-up decay lives in a device tensor that
// set_step fills, so a captured CUDA graph of the step reads the current one.
class Ema {
 public:
  // `shadow` is a freshly built model of the same arch; it gets the model's weights.
  Ema(Network shadow, const torch::nn::Module& model, double decay, bool warmup = false);
  // Before the step's update: the decay of step `step` (counted from 0). No-op without warm-up.
  void set_step(std::int64_t step);
  void update(const torch::nn::Module& model);
  Network& model() { return shadow_; }
  double decay() const { return decay_; }
  double decay_at(std::int64_t step) const;

 private:
  Network shadow_;
  double decay_;
  bool warmup_;
  at::Tensor step_decay_;  // 0-dim, on the model's device (warm-up only)
};

}  // namespace convnets::train
