#include "models/resnet.h"

#include "models/block_fusion.h"
#include "models/graph.h"
#include "models/layers.h"

#include <torch/torch.h>

#include <memory>
#include <regex>

namespace convnets {
namespace {

using models::Conv2d;
using models::Linear;
namespace nn = torch::nn;

Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t groups = 1) {
  return Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).groups(groups).bias(false));
}

// DLE's SqueezeAndExcitation (trt=False): Linear layers named `squeeze` and
// `expand` over the spatial mean of the residual branch, fixed reduced width.
class SqueezeExcitationImpl : public nn::Module {
 public:
  SqueezeExcitationImpl(int64_t channels, int64_t reduced)
      : squeeze(register_module("squeeze", Linear(channels, reduced))),
        expand(register_module("expand", Linear(reduced, channels))) {}

  // Per-channel gate in [0, 1], shaped [N, C, 1, 1] to broadcast over the branch.
  torch::Tensor forward(const torch::Tensor& branch) {
    auto s = branch.mean({2, 3});
    s = torch::sigmoid(expand(torch::relu(squeeze(s))));
    return s.unsqueeze(-1).unsqueeze(-1);
  }

  // The gate as graph ops, on an [N, C, 1, 1] mean.
  GraphEmitter::Value emit(GraphEmitter& g, const GraphEmitter::Value& branch, const std::string& name) {
    auto s = g.linear_1x1(g.global_avg_pool(branch), *squeeze, name + ".squeeze");
    return g.sigmoid(g.linear_1x1(g.relu(s), *expand, name + ".expand"));
  }

  Linear squeeze, expand;
};
TORCH_MODULE(SqueezeExcitation);

// BasicBlock and Bottleneck in one class (torchvision's resnet.py; DLE's image_classification/models/resnet.py):
// the registration order below is the state_dict order of torchvision (conv/bn pairs, then downsample) and of DLE
// (SE registered after downsample). Its fused training paths live beside it (models/block_fusion.h).
class BlockImpl : public nn::Module, public models::TunableModule {
 public:
  BlockImpl(const ResNetConfig& c, int64_t in, int64_t planes, int64_t stride) {
    const int64_t expansion = c.bottleneck ? 4 : 1;
    const int64_t out = planes * expansion;
    if (c.bottleneck) {
      const int64_t width = planes * c.width_per_group / 64 * c.groups;
      convs_ = {conv(in, width, 1), conv(width, width, 3, stride, c.groups), conv(width, out, 1)};
      const int64_t widths[3] = {width, width, out};
      for (int i = 0; i < 3; ++i) bns_.push_back(models::BatchNorm2d(widths[i]));
    } else {
      convs_ = {conv(in, planes, 3, stride), conv(planes, planes, 3)};
      bns_ = {models::BatchNorm2d(planes), models::BatchNorm2d(planes)};
    }
    for (size_t i = 0; i < convs_.size(); ++i) {
      register_module("conv" + std::to_string(i + 1), convs_[i]);
      register_module("bn" + std::to_string(i + 1), bns_[i]);
      bns_[i]->set_fusion(models::BnFusion::Relu);
    }
    // Without SE the last BN is followed by the shortcut's add and the ReLU; with it, by the SE gate.
    bns_.back()->set_fusion(c.se_channels > 0 ? models::BnFusion::None : models::BnFusion::AddRelu);
    if (stride != 1 || in != out) {
      downsample_ = register_module("downsample", nn::Sequential(conv(in, out, 1, stride), models::BatchNorm2d(out)));
    }
    if (c.se_channels > 0) se_ = register_module("squeeze", SqueezeExcitation(out, c.se_channels));
    models::ResidualParts parts;
    for (size_t i = 0; i < convs_.size(); ++i) parts.branch.emplace_back(convs_[i].get(), bns_[i].get());
    if (downsample_) {
      parts.downsample_conv = downsample_[0]->as<models::Conv2dImpl>();
      parts.downsample_bn = downsample_[1]->as<models::BatchNorm2dImpl>();
    }
    parts.squeeze_excitation = c.se_channels > 0;
    fusion_ = std::make_unique<models::ResidualFusion>(*this, std::move(parts), [this](const at::Tensor& x) {
      return forward(x);
    });
  }

  models::FusionTunable& tunable() override { return *fusion_; }

  // relu(branch(x) + shortcut(x)), the branch conv-BN-ReLU pairs and a last conv-BN (DLE's SE: its gate on the
  // branch, shortcut + branch * gate in one addcmul). On a fused path the whole block may run as one NormConv
  // function, and BnFold reads x through the slot that sums its two gradients (models/block_fusion.h).
  torch::Tensor forward(const torch::Tensor& x) {
    using models::Activation;
    if (auto whole = fusion_->whole_block(x)) return *whole;
    const auto in = fusion_->input(x);
    auto y = in.conv_bn_act(*convs_[0], *bns_[0], Activation::ReLU);
    for (size_t i = 1; i + 1 < convs_.size(); ++i) y = models::conv_bn_act(*convs_[i], *bns_[i], y, Activation::ReLU);
    const auto shortcut = downsample_ ? in.conv_bn_act(*downsample_[0]->as<models::Conv2dImpl>(),
                                                       *downsample_[1]->as<models::BatchNorm2dImpl>(), Activation::None)
                                      : in.identity();
    if (!se_) return models::conv_bn_act(*convs_.back(), *bns_.back(), y, Activation::ReLU, shortcut);
    y = models::conv_bn_act(*convs_.back(), *bns_.back(), y, Activation::None);
    return torch::relu(torch::addcmul(shortcut, y, se_(y)));
  }

  // forward() as graph ops: shortcut + branch (or + branch * gate), then ReLU.
  GraphEmitter::Value emit(GraphEmitter& g, const GraphEmitter::Value& x, const std::string& name) {
    auto y = x;
    for (size_t i = 0; i < convs_.size(); ++i) {
      const auto n = std::to_string(i + 1);
      y = g.conv_bn(y, *convs_[i], name + ".conv" + n, *bns_[i], name + ".bn" + n);
      if (i + 1 < convs_.size()) y = g.relu(y);
    }
    auto shortcut = x;
    if (downsample_) {
      shortcut = g.conv_bn(x, *downsample_[0]->as<models::Conv2dImpl>(), name + ".downsample.0",
                           *downsample_[1]->as<models::BatchNorm2dImpl>(), name + ".downsample.1");
    }
    if (se_) y = g.mul(y, se_->emit(g, y, name + ".squeeze"));
    return g.relu(g.add(shortcut, y));
  }

  models::BatchNorm2d last_bn() { return bns_.back(); }

 private:
  std::vector<Conv2d> convs_;
  std::vector<models::BatchNorm2d> bns_;
  nn::Sequential downsample_{nullptr};
  SqueezeExcitation se_{nullptr};
  std::unique_ptr<models::ResidualFusion> fusion_;
};
TORCH_MODULE(Block);

class ResNetImpl : public NetworkImpl {
 public:
  ResNetImpl(const ResNetConfig& c, const ModelOptions& o)
      : small_input_stem_(c.small_input_stem), dropout_(std::max(o.dropout, 0.0)) {
    TORCH_CHECK(!c.blocks.empty() && c.blocks.size() == c.widths.size(), "one width per ResNet stage");
    const int64_t stem = c.small_input_stem ? c.widths[0] : 64;
    auto stem_conv = c.small_input_stem ? nn::Conv2dOptions(3, stem, 3).stride(1).padding(1).bias(false)
                                        : nn::Conv2dOptions(3, stem, 7).stride(2).padding(3).bias(false);
    conv1_ = register_module("conv1", Conv2d(stem_conv));
    bn1_ = register_module("bn1", models::BatchNorm2d(stem));
    bn1_->set_fusion(models::BnFusion::Relu);
    const int64_t expansion = c.bottleneck ? 4 : 1;
    int64_t in = stem;
    for (size_t s = 0; s < c.blocks.size(); ++s) {
      const int64_t planes = c.widths[s];
      nn::Sequential stage;
      for (int b = 0; b < c.blocks[s]; ++b) {
        stage->push_back(Block(c, in, planes, (b == 0 && s > 0) ? 2 : 1));
        in = planes * expansion;
      }
      stages_.push_back(register_module("layer" + std::to_string(s + 1), stage));
    }
    fc_ = register_module("fc", Linear(in, o.num_classes));
    if (o.initialize) initialise(o);
  }

  bool random_in_training() const override { return dropout_ > 0; }

  std::string emit(GraphEmitter& g, const std::string& input) override {
    auto x = g.relu(g.conv_bn(input, *conv1_, "conv1", *bn1_, "bn1"));
    if (!small_input_stem_) x = g.max_pool(x, 3, 2, 1);
    for (size_t s = 0; s < stages_.size(); ++s) {
      const auto stage = "layer" + std::to_string(s + 1);
      for (size_t b = 0; b < stages_[s]->size(); ++b) {
        x = stages_[s][b]->as<BlockImpl>()->emit(g, x, stage + "." + std::to_string(b));
      }
    }
    return g.linear(g.flatten(g.global_avg_pool(x)), *fc_, "fc");
  }

  torch::Tensor forward(torch::Tensor x) override {
    x = models::conv_bn_act(*conv1_, *bn1_, x, models::Activation::ReLU);
    if (!small_input_stem_) x = torch::max_pool2d(x, 3, 2, 1);
    for (auto& stage : stages_) {
      if (!stage->is_empty()) x = stage->forward(x);  // an empty Sequential refuses forward()
    }
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    // timm's drop_rate: dropout on the pooled features (off by default, as in torchvision and DLE).
    if (dropout_ > 0) x = torch::dropout(x, dropout_, is_training());
    return fc_(x);
  }

 private:
  // DLE image_classification/models/resnet.py and torchvision ResNet.__init__:
  // kaiming-normal convs (relu gain), BN gamma 1 / beta 0, fc and SE Linear keep
  // PyTorch's default init.
  void initialise(const ModelOptions& o) {
    torch::NoGradGuard no_grad;
    nn::init::FanModeType mode = torch::kFanIn;
    if (o.conv_init == ConvInit::FanOut) mode = torch::kFanOut;
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* c = m->as<models::Conv2d>()) {
        nn::init::kaiming_normal_(c->weight, 0.0, mode, torch::kReLU);
      } else if (auto* bn = m->as<models::BatchNorm2d>()) {
        nn::init::ones_(bn->weight);
        nn::init::zeros_(bn->bias);
      }
    }
    if (o.zero_init_residual) {
      for (auto& stage : stages_) {
        for (auto& block : *stage) nn::init::zeros_(block.get<BlockImpl>().last_bn()->weight);
      }
    }
  }

  bool small_input_stem_;
  double dropout_;
  Conv2d conv1_{nullptr};
  models::BatchNorm2d bn1_{nullptr};
  std::vector<nn::Sequential> stages_;
  Linear fc_{nullptr};
};

}  // namespace

Network make_resnet(const ResNetConfig& config, const ModelOptions& options) {
  return std::make_shared<ResNetImpl>(config, options);
}

std::string resnet_key_from_dle(const std::string& key) {
  static const std::regex dle_stage(R"(^layers\.(\d+)\.)");
  std::smatch m;
  if (!std::regex_search(key, m, dle_stage)) return key;
  return "layer" + std::to_string(std::stoi(m[1]) + 1) + "." + m.suffix().str();
}

}  // namespace convnets
