// Conv2d and Linear layers that account their multiply-accumulates, and the tracer that reads the count.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

namespace convnets {

class NetworkImpl;

namespace layers {

// These derive from LibTorch's own modules so parameter names ("weight", "bias"),
// initialisation and state_dict layout stay exactly PyTorch's.
class Conv2dImpl : public torch::nn::Conv2dImpl {
 public:
  using torch::nn::Conv2dImpl::Conv2dImpl;
  torch::Tensor forward(const torch::Tensor& input);
};
TORCH_MODULE(Conv2d);

class LinearImpl : public torch::nn::LinearImpl {
 public:
  using torch::nn::LinearImpl::LinearImpl;
  torch::Tensor forward(const torch::Tensor& input);
};
TORCH_MODULE(Linear);

}  // namespace layers

// Multiply-accumulates of conv and linear layers for one image at `input_size`
// (the convention of torchvision's and timm's published GMACs). The pass runs
// in shape-only mode: convolutions return zeros of the right shape instead of
// computing, so counting resnext101_32x8d takes milliseconds, not seconds.
int64_t count_macs(NetworkImpl& net, int input_size, int in_channels = 3);

int64_t count_parameters(const torch::nn::Module& module);

}  // namespace convnets
