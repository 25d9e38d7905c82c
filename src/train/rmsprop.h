// RMSprop over flat buffers in its two forms: TensorFlow's (timm's RMSpropTF, the GPUNet/EfficientNet recipes') and PyTorch's (torch.optim.RMSprop, DLE's --optimizer rmsprop).
#pragma once

#include "train/optimizer.h"

namespace convnets::train {

// Both: g = grad + wd * p (coupled weight decay), v = alpha v + (1 - alpha) g^2, not centered. Then
//   rmsproptf (timm.optim.RMSpropTF, lr_in_momentum; tf.train.RMSPropOptimizer):
//     v starts at 1;  m = momentum * m + lr * g / sqrt(v + eps);  p = p - m
//     (the LR sits inside the momentum buffer: a schedule's change acts on new gradients only)
//   rmsprop (torch.optim.RMSprop, which DLE's image_classification/optimizers.py builds):
//     v starts at 0;  m = momentum * m + g / (sqrt(v) + eps);  p = p - lr * m
//     (without momentum, p = p - lr * g / (sqrt(v) + eps))
// 1-D parameters are not decayed unless decay_all (timm's filter_bias_and_bn; DLE's bn group).
class RmsProp : public Optimizer {
 public:
  // options.kind: "rmsproptf" or "rmsprop".
  RmsProp(torch::nn::Module& model, const OptimizerOptions& options);

  void zero_grad() override { flat_.zero_grad(); }
  void step(double lr, const at::Tensor& skip = {}) override;
  void step(const at::Tensor& lr, const at::Tensor& skip = {}) override;
  runtime::FlatParameters& flat() override { return flat_; }
  NamedTensors state() const override;
  void load_state(const TensorFile& file, const std::string& source) override;
  std::string name() const override { return tf_ ? "rmsproptf" : "rmsprop"; }

 private:
  void update(const at::Tensor& skip, const at::Tensor* lr_tensor, double lr);

  OptimizerOptions options_;
  bool tf_;
  runtime::FlatParameters flat_;
  at::Tensor square_avg_, momentum_;  // flat, laid out like flat_.values()
};

}  // namespace convnets::train
