#include "models/resnet.h"

#include "models/fusion.h"
#include "models/grad_fold.h"
#include "models/graph.h"
#include "models/layers.h"
#include "models/norm_conv.h"

#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <torch/torch.h>

#include <iostream>
#include <map>
#include <regex>
#include <sstream>

namespace convnets {
namespace {

using layers::Conv2d;
using layers::Linear;
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

// BasicBlock and Bottleneck in one class: the registration order below is the
// state_dict order of torchvision (conv/bn pairs, then downsample) and of DLE
// (SE registered after downsample).
class BlockImpl : public nn::Module, public layers::FusionTunable {
 public:
  BlockImpl(const ResNetConfig& c, int64_t in, int64_t planes, int64_t stride) {
    const int64_t expansion = c.bottleneck ? 4 : 1;
    const int64_t out = planes * expansion;
    if (c.bottleneck) {
      const int64_t width = planes * c.width_per_group / 64 * c.groups;
      convs_ = {conv(in, width, 1), conv(width, width, 3, stride, c.groups), conv(width, out, 1)};
      const int64_t widths[3] = {width, width, out};
      for (int i = 0; i < 3; ++i) bns_.push_back(layers::BatchNorm2d(widths[i]));
    } else {
      convs_ = {conv(in, planes, 3, stride), conv(planes, planes, 3)};
      bns_ = {layers::BatchNorm2d(planes), layers::BatchNorm2d(planes)};
    }
    for (size_t i = 0; i < convs_.size(); ++i) {
      register_module("conv" + std::to_string(i + 1), convs_[i]);
      register_module("bn" + std::to_string(i + 1), bns_[i]);
      bns_[i]->set_fusion(layers::BnFusion::Relu);
    }
    // Without SE the last BN is followed by the shortcut's add and the ReLU; with it, by the SE gate.
    bns_.back()->set_fusion(c.se_channels > 0 ? layers::BnFusion::None : layers::BnFusion::AddRelu);
    if (stride != 1 || in != out) {
      downsample_ = register_module("downsample", nn::Sequential(conv(in, out, 1, stride), layers::BatchNorm2d(out)));
    }
    if (c.se_channels > 0) se_ = register_module("squeeze", SqueezeExcitation(out, c.se_channels));
    for (size_t i = 0; i < convs_.size(); ++i) norm_block_.branch.push_back({convs_[i].get(), bns_[i].get()});
    if (downsample_) {
      norm_block_.downsample = {downsample_[0]->as<layers::Conv2dImpl>(), downsample_[1]->as<layers::BatchNorm2dImpl>()};
    }
  }

  std::string path_refusal(layers::FusionPath path, const layers::FusedBnContext& context) const override {
    using layers::FusionPath;
    if (path == FusionPath::Unfused) return "";
    if (path == FusionPath::NormConv) {
      if (auto why = layers::norm_conv::refusal(context, norm_block_); !why.empty()) return why;
      for (const auto& [shape, why] : verdicts_) {
        if (!why.empty()) return why;
      }
      return "";
    }
    // Bn and BnFold: the block's BN+ReLU layers as the part-2 rule takes them.
    for (const auto& bn : bns_) {
      if (bn->fusion() == layers::BnFusion::None) continue;
      if (auto why = layers::fused_bn_refusal(context, bn->fusion(), bn->options.num_features(), bn->synchronized());
          !why.empty()) {
        return why;
      }
    }
    return "";
  }

  void set_path(layers::FusionPath path) override {
    path_ = path;
    // NormConv keeps the fused BN on for a shape cuDNN has no graph for.
    for (auto& bn : bns_) bn->set_fused(path != layers::FusionPath::Unfused);
    if (downsample_) downsample_[1]->as<layers::BatchNorm2dImpl>()->set_fused(path != layers::FusionPath::Unfused);
  }

  layers::FusionPath path() const override { return path_; }

  std::string signature() const override {
    std::ostringstream s;
    auto conv_text = [&s](const layers::Conv2dImpl& c) {
      const auto& o = c.options;
      s << o.in_channels() << ">" << o.out_channels() << " " << (*o.kernel_size())[0] << "x" << (*o.kernel_size())[1]
        << "/" << (*o.stride())[0];
      if (o.groups() > 1) s << " g" << o.groups();
    };
    s << (convs_.size() == 3 ? "bottleneck " : "basic ");
    for (std::size_t i = 0; i < convs_.size(); ++i) {
      if (i) s << ", ";
      conv_text(*convs_[i]);
    }
    s << "; shortcut ";
    if (downsample_) conv_text(*norm_block_.downsample.conv);
    else s << "identity";
    if (se_) s << "; SE";
    return s.str();
  }

  std::vector<std::int64_t> last_input_sizes() const override { return last_input_; }
  at::Tensor train_forward(const at::Tensor& x) override { return forward(x); }

  // Training on CUDA in half precision, as the block's path says (models/fusion.h): the whole block as one NormConv
  // function where its plans build (models/norm_conv.h), else BN+ReLU and BN+add+ReLU through forward_fused, one
  // cuDNN call each (Paddle's fuse_bn_act_ops / fuse_bn_add_act_ops), the input's two gradients summed in the first
  // convolution's dgrad for BnFold (models/grad_fold.h); elsewhere the same function as separate ops.
  torch::Tensor forward(const torch::Tensor& x) {
    using layers::Activation;
    using layers::FusionPath;
    if (is_training()) last_input_ = x.sizes().vec();
    if (path_ == FusionPath::NormConv && is_training() && layers::norm_conv::takes(x, norm_block_) && planned(x)) {
      return layers::norm_conv::forward(norm_block_, x, layers::norm_conv::Backend::Cudnn);
    }
    std::shared_ptr<layers::GradSlot> slot;
    if (path_ == FusionPath::BnFold && is_training() && x.requires_grad() && torch::GradMode::is_enabled()) {
      slot = layers::make_grad_slot();
    }
    auto y = slot ? layers::bn_act(*bns_[0], layers::fold_conv(*convs_[0], x, slot), Activation::ReLU)
                  : layers::conv_bn_act(*convs_[0], *bns_[0], x, Activation::ReLU);
    for (size_t i = 1; i + 1 < convs_.size(); ++i) y = layers::conv_bn_act(*convs_[i], *bns_[i], y, Activation::ReLU);
    at::Tensor shortcut;
    if (downsample_) {
      auto& down = norm_block_.downsample;
      shortcut = slot ? layers::bn_act(*down.bn, layers::fold_conv(*down.conv, x, slot), Activation::None)
                      : layers::conv_bn_act(*down.conv, *down.bn, x, Activation::None);
    } else {
      shortcut = slot ? layers::fold_tap(x, slot) : x;
    }
    if (!se_) return layers::conv_bn_act(*convs_.back(), *bns_.back(), y, Activation::ReLU, shortcut);
    y = layers::conv_bn_act(*convs_.back(), *bns_.back(), y, Activation::None);
    // DLE's fused SE: shortcut + branch * gate in one addcmul.
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
      shortcut = g.conv_bn(x, *downsample_[0]->as<layers::Conv2dImpl>(), name + ".downsample.0",
                           *downsample_[1]->as<layers::BatchNorm2dImpl>(), name + ".downsample.1");
    }
    if (se_) y = g.mul(y, se_->emit(g, y, name + ".squeeze"));
    return g.relu(g.add(shortcut, y));
  }

  layers::BatchNorm2d last_bn() { return bns_.back(); }

 private:
  // Whether cuDNN built every plan of this block for x's shape: asked once per shape, outside a capture (the
  // training step's eager warm-up); a shape it has no engine for keeps part 2's path, said once.
  bool planned(const torch::Tensor& x) {
    std::vector<std::int64_t> key(x.sizes().begin(), x.sizes().end());
    key.push_back(static_cast<std::int64_t>(x.scalar_type()));
    if (auto it = verdicts_.find(key); it != verdicts_.end()) return it->second.empty();
    if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) return false;
    const auto why = layers::norm_conv::prepare(norm_block_, x);
    if (!why.empty()) std::cerr << "convnets: note: a residual block keeps the fused BN+ReLU path: " << why << "\n";
    return verdicts_.emplace(std::move(key), why).first->second.empty();
  }

  layers::norm_conv::Block norm_block_;
  layers::FusionPath path_ = layers::FusionPath::Bn;
  std::vector<std::int64_t> last_input_;
  std::map<std::vector<std::int64_t>, std::string> verdicts_;
  std::vector<Conv2d> convs_;
  std::vector<layers::BatchNorm2d> bns_;
  nn::Sequential downsample_{nullptr};
  SqueezeExcitation se_{nullptr};
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
    bn1_ = register_module("bn1", layers::BatchNorm2d(stem));
    bn1_->set_fusion(layers::BnFusion::Relu);
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
    x = layers::conv_bn_act(*conv1_, *bn1_, x, layers::Activation::ReLU);
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
      if (auto* c = m->as<layers::Conv2d>()) {
        nn::init::kaiming_normal_(c->weight, 0.0, mode, torch::kReLU);
      } else if (auto* bn = m->as<layers::BatchNorm2d>()) {
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
  layers::BatchNorm2d bn1_{nullptr};
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
