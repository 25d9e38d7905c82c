// RMSprop in TensorFlow's form (timm's RMSpropTF, the GPUNet/EfficientNet recipe's optimizer) over flat buffers.
#pragma once

#include "train/optimizer.h"

namespace convnets::train {

// timm.optim.RMSpropTF (lr_in_momentum, not centered, coupled weight decay),
// which follows tf.train.RMSPropOptimizer rather than torch.optim.RMSprop:
//   g  = grad + wd * p
//   v  = v + (1 - alpha) (g^2 - v)          v starts at 1, not 0
//   m  = momentum * m + lr * g / sqrt(v + eps)   eps inside the square root
//   p  = p - m
// The LR sits inside the momentum buffer, so a schedule's change of LR acts
// on new gradients only. 1-D parameters are not decayed unless decay_all
// (timm's filter_bias_and_bn).
class RmsPropTf : public Optimizer {
 public:
  RmsPropTf(torch::nn::Module& model, const OptimizerOptions& options);

  void zero_grad() override { flat_.zero_grad(); }
  void step(double lr, const at::Tensor& skip = {}) override;
  void step(const at::Tensor& lr, const at::Tensor& skip = {}) override;
  runtime::FlatParameters& flat() override { return flat_; }
  NamedTensors state() const override;
  void load_state(const TensorFile& file, const std::string& source) override;
  std::string name() const override { return "rmsproptf"; }

 private:
  void update(const at::Tensor& skip, const at::Tensor* lr_tensor, double lr);

  OptimizerOptions options_;
  runtime::FlatParameters flat_;
  at::Tensor square_avg_, momentum_;  // flat, laid out like flat_.values()
};

}  // namespace convnets::train
