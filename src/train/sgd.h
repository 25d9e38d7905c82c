// SGD with momentum/Nesterov and decoupled parameter groups (no decay on BN and biases), as torch.optim.SGD computes it, over flat buffers.
#pragma once

#include "train/optimizer.h"

#include <string>
#include <vector>

namespace convnets::train {

struct SgdOptions {
  double momentum = 0.875;
  bool nesterov = false;
  double weight_decay = 0;
  // DLE's --bn-weight-decay: off leaves 1-D parameters (BN gamma/beta, biases) undecayed.
  bool decay_all = false;
};

class Sgd : public Optimizer {
 public:
  struct Param {
    std::string name;
    at::Tensor value;
    at::Tensor momentum;  // view of the flat momentum buffer
    double weight_decay;
  };

  // Rebinds the model's trainable parameters and gradients into flat buffers
  // (FlatParameters): group 0 decayed, group 1 not.
  Sgd(torch::nn::Module& model, SgdOptions options);

  void zero_grad() override { flat_.zero_grad(); }
  // One update with learning rate `lr`: torch.optim.SGD's single-tensor
  // arithmetic (dampening 0), applied per group to the whole flat buffer, so
  // the result is the same element for element. `skip` (optional 0-dim bool
  // on the device, e.g. an fp16 overflow) leaves parameters and momentum
  // unchanged without a host sync.
  void step(double lr, const at::Tensor& skip = {}) override;
  // The same update with the learning rate read from a 0-dim device tensor,
  // as a captured CUDA graph needs (a host scalar would be baked in). The
  // final p - lr * d rounds twice where step(double) rounds once (FMA), so
  // the two may differ in the last bit.
  void step(const at::Tensor& lr, const at::Tensor& skip = {}) override;

  const std::vector<Param>& params() const { return params_; }
  const SgdOptions& options() const { return options_; }
  runtime::FlatParameters& flat() override { return flat_; }
  const at::Tensor& momentum_buffer() const { return momentum_; }

  // "optimizer.momentum.<param>" tensors, and loading them back (strict:
  // every parameter's buffer, same shape; errors name the tensor and file).
  NamedTensors state() const override;
  void load_state(const TensorFile& file, const std::string& source) override;
  std::string name() const override { return "sgd"; }

 private:
  template <typename Apply>
  void update(const at::Tensor& skip, Apply&& apply_lr);

  SgdOptions options_;
  runtime::FlatParameters flat_;
  at::Tensor momentum_;  // flat, laid out like flat_.values()
  std::vector<Param> params_;
};

}  // namespace convnets::train
