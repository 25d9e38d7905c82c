// The inference graph a network computes, emitted op by op to an exporter (ONNX) next to each module's forward.
#pragma once

#include "models/layers.h"

#include <string>
#include <utility>

namespace torch::nn {
class SequentialImpl;
}

namespace convnets {

// Each network describes its eval-mode forward pass through these calls, in
// the same order as forward() computes it, so the exported graph is the
// network and not a second model of it. Values are tensor names in the
// graph; `name` is the module's state_dict path, for initializer names and
// for errors. Dropout and drop-path are identities in eval mode and emit
// nothing.
class GraphEmitter {
 public:
  using Value = std::string;
  virtual ~GraphEmitter() = default;
  // A conv whose output feeds `bn` and nothing else: an exporter may fold them.
  virtual Value conv_bn(const Value& x, const models::Conv2dImpl& conv, const std::string& conv_name,
                        const models::BatchNorm2dImpl& bn, const std::string& bn_name) = 0;
  virtual Value conv(const Value& x, const models::Conv2dImpl& conv, const std::string& name) = 0;
  // [N, in] -> [N, out]
  virtual Value linear(const Value& x, const models::LinearImpl& fc, const std::string& name) = 0;
  // The same Linear applied to an [N, in, 1, 1] tensor, giving [N, out, 1, 1] (SE units).
  virtual Value linear_1x1(const Value& x, const models::LinearImpl& fc, const std::string& name) = 0;
  virtual Value relu(const Value& x) = 0;
  virtual Value silu(const Value& x) = 0;
  virtual Value sigmoid(const Value& x) = 0;
  virtual Value add(const Value& a, const Value& b) = 0;
  virtual Value mul(const Value& a, const Value& b) = 0;  // broadcasting [N,C,1,1] over [N,C,H,W]
  virtual Value max_pool(const Value& x, int kernel, int stride, int padding) = 0;
  virtual Value global_avg_pool(const Value& x) = 0;  // [N,C,H,W] -> [N,C,1,1]
  virtual Value flatten(const Value& x) = 0;          // [N,C,1,1] -> [N,C]
};

// Emits a Sequential of convnets layers and stateless modules (ReLU, SiLU,
// Sigmoid, AdaptiveAvgPool2d to 1x1, Flatten, Dropout); a Conv2d directly
// followed by a BatchNorm2d goes out as conv_bn. Any other module is an
// Error naming `name`.<index> and its type.
GraphEmitter::Value emit_sequential(GraphEmitter& g, const torch::nn::SequentialImpl& seq, const GraphEmitter::Value& x,
                                    const std::string& name);

// The weight and bias of `conv` followed by `bn` in eval mode, as one conv:
// computed in fp64 and rounded once to the conv's dtype.
std::pair<torch::Tensor, torch::Tensor> fold_conv_bn(const models::Conv2dImpl& conv, const models::BatchNorm2dImpl& bn);

// Folds every BatchNorm that directly follows a conv (as emit() pairs them)
// into that conv's weight and a new bias, in fp64, and turns the BN into an
// identity: an inference-only transformation (the BNs then refuse training
// mode). Returns the number of folded pairs.
int fold_batchnorm(NetworkImpl& model);

}  // namespace convnets
