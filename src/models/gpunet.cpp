#include "models/gpunet.h"

#include "core/error.h"
#include "models/graph.h"
#include "models/layers.h"
#include "models/mobile_blocks.h"

#include <torch/torch.h>

#include <cmath>

namespace convnets {

// ---------------------------------------------------------------- modules

namespace {

namespace nn = torch::nn;
using models::BatchNorm2d;
using models::Conv2d;

constexpr double kBnEpsPlain = 1e-3;    // DLE's non-distill blocks (TF EfficientNet's BN)
constexpr double kBnEpsDistill = 1e-5;  // PyTorch's default, the distill head/irb/tail

// Bias-free: every GPUNet conv is followed by a BN (the squeeze-excite's biased 1x1 convs are the block library's).
Conv2d conv(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride, std::int64_t pad,
            std::int64_t groups = 1) {
  return Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(pad).groups(groups).bias(false));
}

using models::Act;
using models::batch_norm;
using models::BlockImpl;
using models::emit_activation;
using models::SqueezeExcite;
using models::Value;

Act act_of(const GpunetLayer& l) { return l.act == "swish" ? Act::SiLU : Act::ReLU; }

// A Sequential of convs, BNs and stateless layers under `net` or `body`:
// DLE's Prologue/PrologueD/PrologueLargeD/Epilogue/EpilogueD and the distill
// Inverted_Residual_Block, whose state_dict keys are positional (net.0, net.1, ...).
class SequentialBlockImpl : public BlockImpl {
 public:
  SequentialBlockImpl(const std::string& child, nn::Sequential seq, bool residual)
      : child_(child), seq_(register_module(child, std::move(seq))), residual_(residual) {}
  // Each conv, its BN and the activation after them as one conv_bn_act (one cuDNN graph on the CUDA graph
  // engine), and the skip in the last one's epilogue; the other layers as they are.
  torch::Tensor forward(const torch::Tensor& x) override {
    const std::size_t n = seq_->size();
    auto y = x;
    bool joined = false;
    for (std::size_t i = 0; i < n;) {
      auto* conv = seq_->ptr(i)->as<models::Conv2dImpl>();
      auto* bn = i + 1 < n ? seq_->ptr(i + 1)->as<models::BatchNorm2dImpl>() : nullptr;
      if (!conv || !bn) {
        y = (seq_->begin() + static_cast<std::ptrdiff_t>(i))->forward(y);
        ++i;
        continue;
      }
      Act act = Act::None;
      if (i + 2 < n && seq_->ptr(i + 2)->as<nn::ReLUImpl>()) act = Act::ReLU;
      if (i + 2 < n && seq_->ptr(i + 2)->as<nn::SiLUImpl>()) act = Act::SiLU;
      i += act == Act::None ? 2 : 3;
      joined = residual_ && i == n && act == Act::None;
      y = models::conv_bn_act(*conv, *bn, y, act, joined ? x : torch::Tensor());
    }
    return residual_ && !joined ? y + x : y;
  }
  Value emit(GraphEmitter& g, const Value& x, const std::string& name) override {
    auto y = emit_sequential(g, *seq_, x, name + "." + child_);
    return residual_ ? g.add(y, x) : y;
  }

 private:
  std::string child_;
  nn::Sequential seq_;
  bool residual_;
};

class ConvBnActImpl : public BlockImpl {
 public:
  ConvBnActImpl(const GpunetLayer& l, std::int64_t pad) : act_(act_of(l)) {
    conv_ = register_module("conv", conv(l.num_in_channels, l.num_out_channels, l.kernel_size, l.stride, pad));
    bn1_ = register_module("bn1", batch_norm(l.num_out_channels, kBnEpsPlain));
  }
  torch::Tensor forward(const torch::Tensor& x) override { return models::conv_bn_act(*conv_, *bn1_, x, act_); }
  Value emit(GraphEmitter& g, const Value& x, const std::string& name) override {
    return emit_activation(g, g.conv_bn(x, *conv_, name + ".conv", *bn1_, name + ".bn1"), act_);
  }

 private:
  Act act_;
  Conv2d conv_{nullptr};
  BatchNorm2d bn1_{nullptr};
};

// MBConv with optional SE (models::InvertedResidualImpl, timm's InvertedResidual)
// with DLE's explicit padding on the depthwise conv; the SE width from the
// expanded tensor, as DLE passes se_ratio = 0.25 / expansion to timm.
std::shared_ptr<BlockImpl> inverted_residual(const GpunetLayer& l, double drop_path_rate) {
  models::InvertedResidualOptions o;
  o.in = l.num_in_channels, o.out = l.num_out_channels;
  o.mid = gpunet_make_divisible(static_cast<double>(l.num_in_channels) * l.expansion);
  o.kernel = l.kernel_size, o.stride = l.stride;
  o.se_channels = l.use_se ? gpunet_se_width(o.mid, l.expansion) : 0;
  o.act = act_of(l);
  o.bn_eps = kBnEpsPlain;
  o.drop_path = drop_path_rate;
  const std::int64_t pad = gpunet_spatial(l, false).padding;
  return std::make_shared<models::InvertedResidualImpl<Conv2d>>(
      o, [pad](std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride, std::int64_t groups) {
        return conv(in, out, k, stride, k == 1 ? 0 : pad, groups);
      });
}

// FusedMBConv (Gupta & Tan 2019, EfficientNet-EdgeTPU): timm's EdgeResidual.
// DLE asks for TF "same" padding on the k x k conv but its helper builds a
// plain conv with padding 0 whenever stride > 1: those convs are unpadded.
class EdgeResidualImpl : public BlockImpl {
 public:
  EdgeResidualImpl(const GpunetLayer& l, double drop_path_rate)
      : act_(act_of(l)),
        residual_(l.stride == 1 && l.num_in_channels == l.num_out_channels),
        drop_path_(drop_path_rate) {
    const std::int64_t mid = gpunet_make_divisible(static_cast<double>(l.num_in_channels) * l.expansion);
    const std::int64_t pad = gpunet_spatial(l, false).padding;
    conv_exp_ = register_module("conv_exp", conv(l.num_in_channels, mid, l.kernel_size, l.stride, pad));
    bn1_ = register_module("bn1", batch_norm(mid, kBnEpsPlain));
    if (l.use_se) se_ = register_module("se", SqueezeExcite(mid, gpunet_se_width(mid, l.expansion), act_));
    conv_pwl_ = register_module("conv_pwl", conv(mid, l.num_out_channels, 1, 1, 0));
    bn2_ = register_module("bn2", batch_norm(l.num_out_channels, kBnEpsPlain));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    auto y = models::conv_bn_act(*conv_exp_, *bn1_, x, act_);
    if (se_) y = se_(y);
    // Drop-path is the identity outside training: the skip joins the conv's epilogue there.
    if (residual_ && !is_training()) return models::conv_bn_act(*conv_pwl_, *bn2_, y, Act::None, x);
    y = models::conv_bn_act(*conv_pwl_, *bn2_, y, Act::None);
    return residual_ ? models::drop_path(y, drop_path_, is_training()) + x : y;
  }
  Value emit(GraphEmitter& g, const Value& x, const std::string& name) override {
    auto y = emit_activation(g, g.conv_bn(x, *conv_exp_, name + ".conv_exp", *bn1_, name + ".bn1"), act_);
    if (se_) y = se_->emit(g, y, name + ".se");
    y = g.conv_bn(y, *conv_pwl_, name + ".conv_pwl", *bn2_, name + ".bn2");
    return residual_ ? g.add(y, x) : y;
  }

 private:
  Act act_;
  bool residual_;
  double drop_path_;
  Conv2d conv_exp_{nullptr}, conv_pwl_{nullptr};
  BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  SqueezeExcite se_{nullptr};
};

nn::AnyModule activation_module(bool swish) {
  return swish ? nn::AnyModule(nn::SiLU()) : nn::AnyModule(nn::ReLU());
}

std::shared_ptr<BlockImpl> make_block(const GpunetDefinition& d, const GpunetLayer& l, double drop_path_rate,
                                      double dropout, std::int64_t num_classes) {
  const double eps = d.distill ? kBnEpsDistill : kBnEpsPlain;
  const auto& t = l.layer_type;
  const std::int64_t in = l.num_in_channels, out = l.num_out_channels;
  const bool residual = l.stride == 1 && in == out;
  if (t == "head" || t == "head_large") {
    const bool swish = !d.distill && l.act != "relu";  // non-distill default: swish
    nn::Sequential s;
    s->push_back(conv(in, out, 3, 2, 1));
    s->push_back(batch_norm(out, eps));
    s->push_back(activation_module(swish));
    if (t == "head_large") {
      for (int i = 0; i < 2; ++i) {
        s->push_back(conv(out, out, 3, 1, 1));
        s->push_back(batch_norm(out, eps));
        s->push_back(nn::ReLU());
      }
    }
    return std::make_shared<SequentialBlockImpl>("net", s, false);
  }
  if (t == "tail") {
    nn::Sequential s;
    const std::int64_t wide = d.distill ? 1152 : out;  // DLE's EpilogueD hard-codes 1152
    s->push_back(conv(in, wide, 1, 1, 0));
    s->push_back(batch_norm(wide, eps));
    s->push_back(nn::ReLU());
    s->push_back(nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions({1, 1})));
    if (d.distill) {
      s->push_back(conv(wide, out, 1, 1, 0));
      s->push_back(nn::ReLU());
    }
    s->push_back(nn::Flatten());
    s->push_back(nn::Dropout(dropout));
    s->push_back(models::Linear(out, num_classes));
    return std::make_shared<SequentialBlockImpl>("net", s, false);
  }
  if (!d.distill) {
    if (t == "conv") return std::make_shared<ConvBnActImpl>(l, gpunet_spatial(l, false).padding);
    if (t == "irb") return inverted_residual(l, drop_path_rate);
    return std::make_shared<EdgeResidualImpl>(l, drop_path_rate);
  }
  const std::int64_t mid = in * static_cast<std::int64_t>(l.expansion);
  const std::int64_t k = l.kernel_size, pad = gpunet_spatial(l, true).padding;
  nn::Sequential s;
  if (t == "irb") {
    s->push_back(conv(in, mid, 1, 1, 0, l.groups));
    s->push_back(batch_norm(mid, eps));
    s->push_back(nn::ReLU());
    s->push_back(conv(mid, mid, k, l.stride, pad, mid));
    s->push_back(batch_norm(mid, eps));
    s->push_back(nn::ReLU());
    s->push_back(conv(mid, out, 1, 1, 0, l.groups));
    s->push_back(batch_norm(out, eps));
  } else {  // distill fused_irb: padded, BN eps 1e-3, groups unused (as DLE)
    s->push_back(conv(in, mid, k, l.stride, pad));
    s->push_back(batch_norm(mid, kBnEpsPlain));
    s->push_back(nn::ReLU());
    s->push_back(conv(mid, out, 1, 1, 0));
    s->push_back(batch_norm(out, kBnEpsPlain));
  }
  return std::make_shared<SequentialBlockImpl>("body", s, residual);
}

// DLE's child names (GPUNET_SPEC.md sections 3 and 4); `n` is the layer's
// 1-based position in the JSON list, the data entry counted.
std::string child_name(const GpunetDefinition& d, const GpunetLayer& l, std::size_t n) {
  const std::string N = std::to_string(n);
  const std::string stage = "stage: " + std::to_string(l.stage) + " ";
  if (d.distill) {
    if (l.layer_type == "head" || l.layer_type == "head_large") return "head:";
    if (l.layer_type == "tail") return "tail:";
    return stage + l.layer_type + N;
  }
  if (l.layer_type == "head") return "head: " + N;
  if (l.layer_type == "tail") return " layer" + N;
  return stage + "layer" + N;
}

class GpunetImpl : public NetworkImpl {
 public:
  GpunetImpl(const GpunetDefinition& d, const ModelOptions& o) {
    network_ = register_module("network", std::make_shared<nn::Module>());
    const auto rates = gpunet_drop_path_rates(d, o.drop_path >= 0 ? o.drop_path : kGpunetDropPath);
    const double dropout = o.dropout >= 0 ? o.dropout : kGpunetDropout;
    random_ = dropout > 0;
    for (std::size_t i = 0; i < d.layers.size(); ++i) {
      const auto& l = d.layers[i];
      if (rates[i] > 0 && l.stride == 1 && l.num_in_channels == l.num_out_channels &&
          (l.layer_type == "irb" || l.layer_type == "fused_irb")) {
        random_ = true;
      }
      auto block = make_block(d, d.layers[i], rates[i], dropout, o.num_classes);
      names_.push_back("network." + child_name(d, d.layers[i], i + 2));
      network_->register_module(child_name(d, d.layers[i], i + 2), block);
      blocks_.push_back(std::move(block));
    }
  }
  torch::Tensor forward(torch::Tensor x) override {
    for (auto& b : blocks_) x = b->forward(x);
    return x;
  }
  bool random_in_training() const override { return random_; }
  std::string emit(GraphEmitter& g, const std::string& input) override {
    auto x = input;
    for (std::size_t i = 0; i < blocks_.size(); ++i) x = blocks_[i]->emit(g, x, names_[i]);
    return x;
  }

 private:
  bool random_ = false;
  std::vector<std::string> names_;
  std::shared_ptr<nn::Module> network_;
  std::vector<std::shared_ptr<BlockImpl>> blocks_;
};

}  // namespace

std::vector<double> gpunet_drop_path_rates(const GpunetDefinition& d, double drop_path) {
  const double last = static_cast<double>(d.layers.size());  // len(config) - 1
  std::vector<double> rates;
  for (std::size_t i = 0; i < d.layers.size(); ++i) {
    rates.push_back(d.distill ? 0.0 : drop_path * static_cast<double>(i + 1) / last);
  }
  return rates;
}

Network make_gpunet(const GpunetDefinition& d, const ModelOptions& options) {
  TORCH_CHECK(!d.layers.empty(), "make_gpunet: an empty definition (parse_gpunet validates them)");
  return std::make_shared<GpunetImpl>(d, options);
}

}  // namespace convnets
