#include "models/layers.h"

#include "models/cudnn_graphs.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>

#include <string>

namespace convnets::models {
namespace {

// The cuDNN side of conv_bn_act (layers.h): the checks that need the tensors themselves, then the graph's plan.
class CudnnFusedConv final : public FusedConvBackend {
 public:
  std::string refusal(const Conv2dImpl& conv, const at::Tensor& x, Activation act,
                      const at::Tensor& residual) const override {
    if (!x.is_cuda()) return "not on CUDA";
    // The graph computes no gradient: a pass that asks for one keeps autograd's ops.
    if (at::GradMode::is_enabled() &&
        (conv.weight.requires_grad() || x.requires_grad() || (residual.defined() && residual.requires_grad()))) {
      return "gradients are asked for";
    }
    // An NCHW input (the stem's, from an engine that fed NCHW) is made NHWC in forward, as ATen's own cuDNN call
    // does for it: refusing it cost ResNet-50's stem its fusion on the H100 (2026-11-27).
    const auto& w = conv.weight;
    if (w.scalar_type() != x.scalar_type() || !w.is_contiguous(at::MemoryFormat::ChannelsLast)) {
      return "weights not in the input's dtype and channels-last memory";
    }
    const auto& b = conv.bias;
    if (!b.defined() || b.scalar_type() != x.scalar_type() || !b.is_contiguous()) {
      return "no bias in the input's dtype (BN not folded into it)";
    }
    norm_conv::ConvAct c;
    if (auto why = fused_conv_shape_refusal(conv, x.sizes(), x.scalar_type(), act, residual.defined(), c); !why.empty()) {
      return why;
    }
    if (residual.defined() && (residual.sizes() != at::IntArrayRef{c.g.n, c.g.k, c.g.out_h(), c.g.out_w()} ||
                               residual.scalar_type() != x.scalar_type() ||
                               !residual.is_contiguous(at::MemoryFormat::ChannelsLast))) {
      return "a residual not of the output's shape, dtype and NHWC memory";
    }
    return norm_conv::conv_bias_act_refusal(c);
  }

  at::Tensor forward(const Conv2dImpl& conv, const at::Tensor& x, Activation act,
                     const at::Tensor& residual) const override {
    norm_conv::ConvAct c;
    const auto why = fused_conv_shape_refusal(conv, x.sizes(), x.scalar_type(), act, residual.defined(), c);
    TORCH_CHECK(why.empty(), "conv_bn_act: forward on a conv its refusal turned down: ", why);
    auto y = at::empty({c.g.n, c.g.k, c.g.out_h(), c.g.out_w()}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
    norm_conv::conv_bias_act(c, x.contiguous(at::MemoryFormat::ChannelsLast), conv.weight, conv.bias, residual, y);
    return y;
  }
};

}  // namespace

const FusedConvBackend& cudnn_fused_conv_backend() {
  static const CudnnFusedConv backend;
  return backend;
}

}  // namespace convnets::models
