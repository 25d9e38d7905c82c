// The optimizer interface the training step drives (SGD, RMSpropTF), all over flat parameter buffers, and the factory.
#pragma once

#include "io/safetensors.h"
#include "runtime/flat_params.h"

#include <torch/nn/module.h>

#include <memory>
#include <string>

namespace convnets::train {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void zero_grad() = 0;
  // One update at learning rate `lr`. `skip` (optional 0-dim bool on the
  // device, e.g. an fp16 overflow) leaves parameters and state unchanged
  // without a host sync.
  virtual void step(double lr, const at::Tensor& skip = {}) = 0;
  // The same with the LR in a 0-dim device tensor, as a captured CUDA graph
  // needs (a host scalar would be baked in).
  virtual void step(const at::Tensor& lr, const at::Tensor& skip = {}) = 0;
  virtual runtime::FlatParameters& flat() = 0;
  // "optimizer.<buffer>.<param>" tensors (views of the state); load_state is
  // strict: every buffer of every parameter, same shape; errors name the
  // tensor and `source`.
  virtual NamedTensors state() const = 0;
  virtual void load_state(const TensorFile& file, const std::string& source) = 0;
  virtual std::string name() const = 0;
};

struct OptimizerOptions {
  std::string kind = "sgd";  // sgd | rmsproptf | rmsprop
  double momentum = 0.875;
  bool nesterov = false;     // sgd
  double weight_decay = 0;
  bool decay_all = false;    // false: no decay on 1-D parameters (BN, biases)
  double alpha = 0.9;        // rmsproptf, rmsprop
  double eps = 1e-3;         // rmsproptf (inside the square root), rmsprop (outside)
};

// Rebinds the model's parameters into flat buffers (call once the model is on
// its device and in its memory format).
std::unique_ptr<Optimizer> make_optimizer(torch::nn::Module& model, const OptimizerOptions& options);

}  // namespace convnets::train
