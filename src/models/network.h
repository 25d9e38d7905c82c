// The contract every convnets model meets: a LibTorch module with a forward pass, build options, preprocessing metadata.
#pragma once

#include <torch/nn/module.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

namespace convnets {

class GraphEmitter;

// How images must be prepared for a model: what training and `eval`/`classify` read
// from a checkpoint so a model is never fed differently from how it was trained.
struct Preprocessing {
  int input_size = 224;        // square side of the training crop and the eval crop
  double crop_ratio = 0.875;   // eval: resize the short side to input_size / crop_ratio, centre-crop
  std::array<double, 3> mean{0.485, 0.456, 0.406};  // RGB, on the 0..1 scale
  std::array<double, 3> std{0.229, 0.224, 0.225};
  std::string interpolation = "bilinear";
};

enum class ConvInit { FanIn, FanOut };

struct ModelOptions {
  int64_t num_classes = 1000;
  // DLE's ResNet recipe uses kaiming-normal fan_in; torchvision uses fan_out.
  ConvInit conv_init = ConvInit::FanIn;
  // Zero each residual branch's last BN gamma so every block starts as identity
  // (Goyal et al. 2017, "Accurate, Large Minibatch SGD"; DLE's last_bn_0_init).
  bool zero_init_residual = false;
  // Regularisation inside the network; negative keeps the arch's default
  // (GPUNet: 0.2 each, as DLE builds it; ResNets: no dropout, no drop-path).
  double dropout = -1;    // before the classifier (timm's drop_rate)
  double drop_path = -1;  // stochastic depth (Huang et al. 2016): rate of the deepest residual block
  // false: skip the arch's own initialisation (LibTorch's constructor defaults stay) for a network that is only
  // measured (`convnets models`: the normal draws were 40 % of listing every arch).
  bool initialize = true;
};

class NetworkImpl : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor x) = 0;
  // Whether training-mode forward draws random masks (dropout, drop-path).
  virtual bool random_in_training() const { return false; }
  // The eval-mode forward pass as graph ops (models/graph.h), returning the
  // logits' value; the default is an Error: the arch has no graph form.
  virtual std::string emit(GraphEmitter& g, const std::string& input);
};
using Network = std::shared_ptr<NetworkImpl>;

}  // namespace convnets
