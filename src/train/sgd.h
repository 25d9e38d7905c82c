// SGD with momentum/Nesterov and decoupled parameter groups (no decay on BN and biases), as torch.optim.SGD computes it.
#pragma once

#include "io/safetensors.h"

#include <torch/nn/module.h>

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

class Sgd {
 public:
  struct Param {
    std::string name;
    at::Tensor value;
    at::Tensor momentum;  // zeros until the first step: 0 * m + d equals torch's clone(d) bit for bit
    double weight_decay;
  };

  Sgd(torch::nn::Module& model, SgdOptions options);

  void zero_grad();
  // One update with learning rate `lr`, torch.optim.SGD's single-tensor
  // arithmetic. `skip` (optional 0-dim bool on the device, e.g. an fp16
  // overflow) leaves parameters and momentum unchanged without a host sync.
  void step(double lr, const at::Tensor& skip = {});

  const std::vector<Param>& params() const { return params_; }
  const SgdOptions& options() const { return options_; }

  // "optimizer.momentum.<param>" tensors, and loading them back (strict:
  // every parameter's buffer, same shape; errors name the tensor and file).
  NamedTensors state() const;
  void load_state(const TensorFile& file, const std::string& source);

 private:
  SgdOptions options_;
  std::vector<Param> params_;
};

}  // namespace convnets::train
