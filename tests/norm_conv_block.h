// A residual block's modules built stand-alone for the NormConv tests (CPU and GPU): the branch's convs and BNs, the downsample, the unfused function.
#pragma once

#include "models/layers.h"
#include "models/norm_conv.h"

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace convnets::testing_blocks {

// `widths`: the branch's convolutions' outputs (2: a BasicBlock, 3: a bottleneck), its 3x3 strided (v1.5); a
// downsample conv + BN when the shape changes. Parameters and buffers in `options`' dtype and device, BN's gamma,
// beta and running statistics drawn per channel (seeded), the 4-D weights channels-last.
struct BlockModules {
  std::vector<models::Conv2d> convs;
  std::vector<models::BatchNorm2d> bns;
  models::Conv2d down_conv{nullptr};
  models::BatchNorm2d down_bn{nullptr};
  models::norm_conv::Block block;

  BlockModules(std::int64_t in, std::vector<std::int64_t> widths, std::int64_t stride, unsigned seed,
               torch::TensorOptions options) {
    torch::manual_seed(seed);
    const bool bottleneck = widths.size() == 3;
    std::int64_t c = in;
    for (std::size_t i = 0; i < widths.size(); ++i) {
      const std::int64_t k = bottleneck && i != 1 ? 1 : 3;
      const std::int64_t s = (bottleneck ? i == 1 : i == 0) ? stride : 1;
      convs.emplace_back(torch::nn::Conv2dOptions(c, widths[i], k).stride(s).padding(k / 2).bias(false));
      bns.emplace_back(widths[i]);
      c = widths[i];
    }
    if (stride != 1 || in != c) {
      down_conv = models::Conv2d(torch::nn::Conv2dOptions(in, c, 1).stride(stride).bias(false));
      down_bn = models::BatchNorm2d(c);
    }
    torch::NoGradGuard no_grad;
    auto place = [&](torch::nn::Module& m) {
      m.to(options.device(), options.dtype().toScalarType());
      for (auto& p : m.parameters()) {
        if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
      }
    };
    for (std::size_t i = 0; i < bns.size(); ++i) {
      place(*convs[i]);
      place(*bns[i]);
      // Not the identity: gamma, beta and the running statistics all differ per channel.
      bns[i]->weight.uniform_(0.5, 1.5);
      bns[i]->bias.uniform_(-0.3, 0.3);
      bns[i]->running_mean.uniform_(-0.1, 0.1);
      bns[i]->running_var.uniform_(0.8, 1.2);
      bns[i]->set_fusion(i + 1 < bns.size() ? models::BnFusion::Relu : models::BnFusion::AddRelu);
      block.branch.push_back({convs[i].get(), bns[i].get()});
    }
    if (down_conv) {
      place(*down_conv);
      place(*down_bn);
      down_bn->weight.uniform_(0.5, 1.5);
      down_bn->bias.uniform_(-0.3, 0.3);
      block.downsample = {down_conv.get(), down_bn.get()};
    }
  }

  // The block as the modules compute it (resnet.cpp's BlockImpl, unfused): autograd's own backward.
  torch::Tensor plain(const torch::Tensor& x) {
    auto y = x;
    for (std::size_t i = 0; i + 1 < convs.size(); ++i) y = torch::relu(bns[i](convs[i](y)));
    y = bns.back()(convs.back()(y));
    return torch::relu(y + (down_conv ? down_bn(down_conv(x)) : x));
  }

  struct Entry {
    std::string name;  // "bn2.weight.grad", "bn2.running_var"
    torch::Tensor value;
    bool buffer;
  };
  // Every parameter's gradient (zeros where none) and every buffer, module by module.
  std::vector<Entry> gradients_and_buffers() {
    std::vector<Entry> out;
    std::vector<std::pair<std::string, torch::nn::Module*>> ms;
    for (std::size_t i = 0; i < convs.size(); ++i) ms.emplace_back("conv" + std::to_string(i + 1), convs[i].get());
    for (std::size_t i = 0; i < bns.size(); ++i) ms.emplace_back("bn" + std::to_string(i + 1), bns[i].get());
    if (down_conv) ms.emplace_back("downsample.0", down_conv.get()), ms.emplace_back("downsample.1", down_bn.get());
    for (auto& [name, m] : ms) {
      for (auto& p : m->named_parameters()) {
        out.push_back({name + "." + p.key() + ".grad", p.value().grad().defined() ? p.value().grad()
                                                                                   : torch::zeros_like(p.value()), false});
      }
      for (auto& b : m->named_buffers()) out.push_back({name + "." + b.key(), b.value(), true});
    }
    return out;
  }
};

}  // namespace convnets::testing_blocks
