// The blocks GPUNet and EfficientNet share, as timm 0.5.4's efficientnet_blocks.py builds them: the block base,
// squeeze-excite, the inverted residual (MBConv), their activations and stochastic depth.
#pragma once

#include "models/graph.h"
#include "models/layers.h"

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <string>

namespace convnets::models {

using Value = GraphEmitter::Value;

// The activation a block applies after its expansion and depthwise convs and inside its squeeze-excite: GPUNet's
// layers name relu or swish, EfficientNet's are SiLU (= swish) throughout.
using Act = models::Activation;
using models::activate;
Value emit_activation(GraphEmitter& g, const Value& x, Act act);

// Stochastic depth as timm's drop_path: in training, each sample's `branch`
// is zeroed with probability p and the survivors scaled by 1 / (1 - p), so
// the expectation is unchanged; the identity in eval or at p = 0.
torch::Tensor drop_path(const torch::Tensor& branch, double p, bool training);

class BlockImpl : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
  // forward() in eval mode as graph ops; `name` is the block's state_dict path.
  virtual Value emit(GraphEmitter& g, const Value& x, const std::string& name) = 0;
  // The BN whose output the residual adds (zero_init_residual), or null.
  virtual models::BatchNorm2d residual_bn() { return models::BatchNorm2d{nullptr}; }
};

models::BatchNorm2d batch_norm(std::int64_t channels, double eps);

// timm's SqueezeExcite (Hu et al. 2018) as both networks configure it: the
// spatial mean, a 1x1 conv with bias to `reduced` channels, the block's
// activation, a 1x1 conv with bias back, a sigmoid gate on x. Its 1x1 convs on
// a 1x1 map are plain nn.Conv2d in timm whatever the network's padding.
class SqueezeExciteImpl : public torch::nn::Module {
 public:
  SqueezeExciteImpl(std::int64_t channels, std::int64_t reduced, Act act);
  torch::Tensor forward(const torch::Tensor& x);
  Value emit(GraphEmitter& g, const Value& x, const std::string& name);

 private:
  Act act_;
  models::Conv2d conv_reduce_{nullptr}, conv_expand_{nullptr};
};
TORCH_MODULE(SqueezeExcite);

struct InvertedResidualOptions {
  std::int64_t in = 0, out = 0;
  std::int64_t mid = 0;          // the expanded width: make_divisible(in x expansion) in both networks
  std::int64_t kernel = 3, stride = 1;
  std::int64_t se_channels = 0;  // the squeeze-excite's reduced width; 0: no squeeze-excite
  Act act = Act::SiLU;
  double bn_eps = 1e-3;          // TF's EfficientNet BN, which DLE's GPUNet blocks keep
  double drop_path = 0;
};

// timm's InvertedResidual (MBConv, Sandler et al. 2018, with SE): 1x1
// expansion, BN, act, k x k depthwise conv with the stride, BN, act, SE, 1x1
// linear projection, BN, and the skip (with drop-path) when stride 1 and
// in == out. `Conv` is the network's conv: GPUNet's plain, explicitly padded
// one; EfficientNet's TF-"SAME" Conv2dSame. `conv(in, out, kernel, stride,
// groups)` builds it bias-free with the network's padding.
template <class Conv>
class InvertedResidualImpl : public BlockImpl {
 public:
  using ConvFactory = std::function<Conv(std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t)>;

  InvertedResidualImpl(const InvertedResidualOptions& o, const ConvFactory& conv)
      : act_(o.act), residual_(o.stride == 1 && o.in == o.out), drop_path_(o.drop_path) {
    conv_pw_ = register_module("conv_pw", conv(o.in, o.mid, 1, 1, 1));
    bn1_ = register_module("bn1", batch_norm(o.mid, o.bn_eps));
    conv_dw_ = register_module("conv_dw", conv(o.mid, o.mid, o.kernel, o.stride, o.mid));
    bn2_ = register_module("bn2", batch_norm(o.mid, o.bn_eps));
    if (o.se_channels > 0) se_ = register_module("se", SqueezeExcite(o.mid, o.se_channels, o.act));
    conv_pwl_ = register_module("conv_pwl", conv(o.mid, o.out, 1, 1, 1));
    bn3_ = register_module("bn3", batch_norm(o.out, o.bn_eps));
  }
  // Each conv with its BN and activation (and the last with the skip, outside training: drop-path is the
  // identity there) through conv_bn_act: one cuDNN graph each on the CUDA graph engine.
  torch::Tensor forward(const torch::Tensor& x) override {
    auto y = models::conv_bn_act(*conv_pw_, *bn1_, x, act_);
    y = models::conv_bn_act(*conv_dw_, *bn2_, y, act_);
    if (se_) y = se_(y);
    if (residual_ && !is_training()) return models::conv_bn_act(*conv_pwl_, *bn3_, y, Act::None, x);
    y = models::conv_bn_act(*conv_pwl_, *bn3_, y, Act::None);
    return residual_ ? drop_path(y, drop_path_, is_training()) + x : y;
  }
  Value emit(GraphEmitter& g, const Value& x, const std::string& name) override {
    auto y = emit_activation(g, g.conv_bn(x, *conv_pw_, name + ".conv_pw", *bn1_, name + ".bn1"), act_);
    y = emit_activation(g, g.conv_bn(y, *conv_dw_, name + ".conv_dw", *bn2_, name + ".bn2"), act_);
    if (se_) y = se_->emit(g, y, name + ".se");
    y = g.conv_bn(y, *conv_pwl_, name + ".conv_pwl", *bn3_, name + ".bn3");
    return residual_ ? g.add(y, x) : y;
  }
  models::BatchNorm2d residual_bn() override { return residual_ ? bn3_ : models::BatchNorm2d{nullptr}; }

 private:
  Act act_;
  bool residual_;
  double drop_path_;
  Conv conv_pw_{nullptr}, conv_dw_{nullptr}, conv_pwl_{nullptr};
  models::BatchNorm2d bn1_{nullptr}, bn2_{nullptr}, bn3_{nullptr};
  SqueezeExcite se_{nullptr};
};

}  // namespace convnets::models
