// Exponential moving average of a model's weights, kept as a second model that evaluation can run as is.
#pragma once

#include "models/network.h"

namespace convnets::train {

// DLE's EMA (image_classification/models/common.py) and timm's ModelEmaV2:
// every floating-point state_dict entry (parameters and BN statistics) moves
// as ema = decay * ema + (1 - decay) * model; integer buffers are copied.
class Ema {
 public:
  // `shadow` is a freshly built model of the same arch; it gets the model's weights.
  Ema(Network shadow, const torch::nn::Module& model, double decay);
  void update(const torch::nn::Module& model);
  Network& model() { return shadow_; }
  double decay() const { return decay_; }

 private:
  Network shadow_;
  double decay_;
};

}  // namespace convnets::train
