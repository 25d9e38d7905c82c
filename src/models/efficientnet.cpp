#include "models/efficientnet.h"

#include "core/error.h"
#include "models/gpunet_def.h"  // gpunet_make_divisible (timm's make_divisible)
#include "models/graph.h"
#include "models/layers.h"
#include "models/mobile_blocks.h"

#include <torch/torch.h>

#include <cctype>
#include <cmath>
#include <map>
#include <sstream>

namespace convnets {

namespace {

// EfficientNet-B0 (Tan & Le 2019, table 1) in timm's block-string notation,
// verbatim from timm 0.5.4 _gen_efficientnet; every B-variant scales it.
const char* const kEfficientNetB0[] = {
    "ds_r1_k3_s1_e1_c16_se0.25", "ir_r2_k3_s2_e6_c24_se0.25",  "ir_r2_k5_s2_e6_c40_se0.25",
    "ir_r3_k3_s2_e6_c80_se0.25", "ir_r3_k5_s1_e6_c112_se0.25", "ir_r4_k5_s2_e6_c192_se0.25",
    "ir_r1_k3_s1_e6_c320_se0.25",
};
constexpr std::int64_t kStemChannels = 32;   // before round_channels
constexpr std::int64_t kHeadChannels = 1280;  // before round_channels

// The tf_ variants pass bn_eps=BN_EPS_TF_DEFAULT (1e-3, TF's) and no
// bn_momentum, so BN keeps PyTorch's momentum 0.1 (BN_MOMENTUM_TF_DEFAULT,
// 0.01, is not applied to them).
constexpr double kBnEps = 1e-3;

// timm's round_channels (divisor 8, round_limit 0.9).
std::int64_t round_channels(double channels, double multiplier) {
  return gpunet_make_divisible(channels * multiplier);
}

}  // namespace

EfficientNetStage decode_efficientnet_stage(const std::string& block) {
  std::vector<std::string> ops;
  std::stringstream in(block);
  for (std::string op; std::getline(in, op, '_');) ops.push_back(op);
  if (ops.empty() || (ops[0] != "ds" && ops[0] != "ir")) {
    throw Error("EfficientNet block '" + block + "': the type must be ds or ir");
  }
  EfficientNetStage s;
  s.type = ops[0];
  std::map<std::string, std::string> options;
  for (std::size_t i = 1; i < ops.size(); ++i) {
    // As timm's re.split(r'(\d.*)', op): the letters, then the number.
    const auto& op = ops[i];
    std::size_t digit = 0;
    while (digit < op.size() && !std::isdigit(static_cast<unsigned char>(op[digit]))) ++digit;
    const std::string key = op.substr(0, digit), value = op.substr(digit);
    if (value.empty() || !(key == "r" || key == "k" || key == "s" || key == "e" || key == "c" || key == "se")) {
      throw Error("EfficientNet block '" + block + "': '" + op + "' is not one of r, k, s, e, c, se with a number");
    }
    options[key] = value;
  }
  for (const char* required : {"r", "k", "s", "c"}) {
    if (!options.count(required)) throw Error("EfficientNet block '" + block + "': no '" + required + "'");
  }
  s.repeats = std::stoll(options["r"]);
  s.kernel = std::stoll(options["k"]);
  s.stride = std::stoll(options["s"]);
  s.channels = std::stoll(options["c"]);
  s.expansion = options.count("e") ? std::stod(options["e"]) : 1.0;
  s.se_ratio = options.count("se") ? std::stod(options["se"]) : 0.0;
  return s;
}

std::vector<EfficientNetStage> efficientnet_stages(double channel_multiplier, double depth_multiplier) {
  std::vector<EfficientNetStage> stages;
  for (const char* block : kEfficientNetB0) {
    auto s = decode_efficientnet_stage(block);
    // _scale_stage_depth with one block string per stage: int(ceil(r * m)),
    // in double as Python computes it (B2: 3 x 1.2 = 3.5999... -> 4).
    s.repeats = static_cast<std::int64_t>(std::ceil(static_cast<double>(s.repeats) * depth_multiplier));
    s.channels = round_channels(static_cast<double>(s.channels), channel_multiplier);
    stages.push_back(s);
  }
  return stages;
}

const std::vector<EfficientNetVariant>& efficientnet_variants() {
  // timm 0.5.4 default_cfgs: bicubic, IMAGENET_DEFAULT_MEAN/STD (Preprocessing's defaults).
  static const std::vector<EfficientNetVariant> variants = [] {
    auto variant = [](const char* name, const char* description, double width, double depth, int size, double crop) {
      EfficientNetVariant v{name, description, width, depth, {}};
      v.preprocessing.input_size = size;
      v.preprocessing.crop_ratio = crop;
      v.preprocessing.interpolation = "bicubic";
      return v;
    };
    return std::vector<EfficientNetVariant>{
        variant("tf_efficientnet_b2", "EfficientNet-B2, TF port (Tan & Le 2019; timm 0.5.4 keys, SAME padding)", 1.1,
                1.2, 260, 0.890),
        variant("tf_efficientnet_b5_ns", "EfficientNet-B5 Noisy Student, TF port (timm 0.5.4 keys, SAME padding)", 1.6,
                2.2, 456, 0.934),
        variant("tf_efficientnet_b6_ns", "EfficientNet-B6 Noisy Student, TF port (timm 0.5.4 keys, SAME padding)", 1.8,
                2.6, 528, 0.942),
    };
  }();
  return variants;
}

namespace {

namespace nn = torch::nn;
using models::BatchNorm2d;
using models::Conv2dSame;
using Value = GraphEmitter::Value;

// The stem, block and head convs of the tf_ models: timm's
// create_conv2d(..., padding='same'), bias-free.
Conv2dSame conv(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride = 1, std::int64_t groups = 1) {
  return Conv2dSame(nn::Conv2dOptions(in, out, k).stride(stride).groups(groups).bias(false));
}

BatchNorm2d bn(std::int64_t c) { return models::batch_norm(c, kBnEps); }

using models::Act;
using models::BlockImpl;
using models::SqueezeExcite;

// The SE width. timm's builder (se_from_exp=False) divides se_ratio by the
// expansion and SqueezeExcite takes round(mid x ratio) with Python's round
// (ties to even): a quarter of the block's *input* channels, not of the
// expanded ones (B2's first ir block: 16 in, 96 mid, 4 in SE).
std::int64_t se_channels(std::int64_t mid, double se_ratio, double expansion) {
  return static_cast<std::int64_t>(std::nearbyint(static_cast<double>(mid) * (se_ratio / expansion)));
}

// timm's DepthwiseSeparableConv ("ds", MobileNet-V1's block with SE): k x k
// depthwise conv, BN, SiLU, SE, 1x1 conv, BN with no activation after it
// (pw_act is False for "ds"), the skip when stride 1 and in == out.
class DepthwiseSeparableImpl : public BlockImpl {
 public:
  DepthwiseSeparableImpl(std::int64_t in, std::int64_t out, const EfficientNetStage& s, std::int64_t stride,
                         double drop_path_rate)
      : residual_(stride == 1 && in == out), drop_path_(drop_path_rate) {
    conv_dw_ = register_module("conv_dw", conv(in, in, s.kernel, stride, in));
    bn1_ = register_module("bn1", bn(in));
    if (s.se_ratio > 0) se_ = register_module("se", SqueezeExcite(in, se_channels(in, s.se_ratio, 1.0), Act::SiLU));
    conv_pw_ = register_module("conv_pw", conv(in, out, 1));
    bn2_ = register_module("bn2", bn(out));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    auto y = models::conv_bn_act(*conv_dw_, *bn1_, x, Act::SiLU);
    if (se_) y = se_(y);
    // Drop-path is the identity outside training: the skip joins the conv's epilogue there.
    if (residual_ && !is_training()) return models::conv_bn_act(*conv_pw_, *bn2_, y, Act::None, x);
    y = models::conv_bn_act(*conv_pw_, *bn2_, y, Act::None);
    return residual_ ? models::drop_path(y, drop_path_, is_training()) + x : y;
  }
  Value emit(GraphEmitter& g, const Value& x, const std::string& name) override {
    auto y = g.silu(g.conv_bn(x, *conv_dw_, name + ".conv_dw", *bn1_, name + ".bn1"));
    if (se_) y = se_->emit(g, y, name + ".se");
    y = g.conv_bn(y, *conv_pw_, name + ".conv_pw", *bn2_, name + ".bn2");
    return residual_ ? g.add(y, x) : y;
  }
  BatchNorm2d residual_bn() override { return residual_ ? bn2_ : BatchNorm2d{nullptr}; }

 private:
  bool residual_;
  double drop_path_;
  Conv2dSame conv_dw_{nullptr}, conv_pw_{nullptr};
  BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  SqueezeExcite se_{nullptr};
};

// timm's InvertedResidual (models::InvertedResidualImpl) with SiLU, TF's BN
// eps and "SAME"-padded convs.
std::shared_ptr<BlockImpl> inverted_residual(std::int64_t in, std::int64_t out, const EfficientNetStage& s,
                                             std::int64_t stride, double drop_path_rate) {
  models::InvertedResidualOptions o;
  o.in = in, o.out = out;
  o.mid = gpunet_make_divisible(static_cast<double>(in) * s.expansion);
  o.kernel = s.kernel, o.stride = stride;
  o.se_channels = s.se_ratio > 0 ? se_channels(o.mid, s.se_ratio, s.expansion) : 0;
  o.act = Act::SiLU;
  o.bn_eps = kBnEps;
  o.drop_path = drop_path_rate;
  return std::make_shared<models::InvertedResidualImpl<Conv2dSame>>(
      o, [](std::int64_t i, std::int64_t c, std::int64_t k, std::int64_t st, std::int64_t groups) {
        return conv(i, c, k, st, groups);
      });
}

// timm's _init_weight_goog (TF's EfficientNet init): conv weights
// N(0, sqrt(2 / fan_out)) with fan_out = k x k x out / groups, conv biases 0,
// BN 1 and 0 (LibTorch's already), Linear U(+-1 / sqrt(out_features)), bias 0.
void init_goog(nn::Module& root) {
  torch::NoGradGuard no_grad;
  for (auto& m : root.modules(/*include_self=*/false)) {
    if (auto* c = dynamic_cast<models::Conv2dImpl*>(m.get())) {
      const auto& k = *c->options.kernel_size();
      const double fan_out = static_cast<double>(k[0] * k[1] * c->options.out_channels() / c->options.groups());
      c->weight.normal_(0.0, std::sqrt(2.0 / fan_out));
      if (c->bias.defined()) c->bias.zero_();
    } else if (auto* fc = dynamic_cast<models::LinearImpl*>(m.get())) {
      const double range = 1.0 / std::sqrt(static_cast<double>(fc->weight.size(0)));
      fc->weight.uniform_(-range, range);
      fc->bias.zero_();
    }
  }
}

class EfficientNetImpl : public NetworkImpl {
 public:
  EfficientNetImpl(const EfficientNetVariant& v, const ModelOptions& o) {
    const auto stages = efficientnet_stages(v.channel_multiplier, v.depth_multiplier);
    const std::int64_t stem = round_channels(kStemChannels, v.channel_multiplier);
    const std::int64_t features = round_channels(kHeadChannels, v.channel_multiplier);
    const double dropout = o.dropout >= 0 ? o.dropout : 0.0;
    const double drop_path_rate = o.drop_path >= 0 ? o.drop_path : 0.0;
    random_ = dropout > 0;

    conv_stem_ = register_module("conv_stem", conv(3, stem, 3, 2));
    bn1_ = register_module("bn1", bn(stem));
    auto blocks = register_module("blocks", std::make_shared<nn::Module>());
    std::int64_t total = 0;
    for (const auto& s : stages) total += s.repeats;
    std::int64_t in = stem, index = 0;
    for (std::size_t i = 0; i < stages.size(); ++i) {
      const auto& s = stages[i];
      auto stage = blocks->register_module(std::to_string(i), std::make_shared<nn::Module>());
      for (std::int64_t j = 0; j < s.repeats; ++j, ++index) {
        // Only a stage's first block strides; drop-path grows linearly with
        // the block's index over all stages: rate x index / total (timm's builder).
        const std::int64_t stride = j == 0 ? s.stride : 1;
        const double rate = drop_path_rate * static_cast<double>(index) / static_cast<double>(total);
        std::shared_ptr<BlockImpl> block;
        if (s.type == "ds") {
          block = std::make_shared<DepthwiseSeparableImpl>(in, s.channels, s, stride, rate);
        } else {
          block = inverted_residual(in, s.channels, s, stride, rate);
        }
        if (rate > 0 && stride == 1 && in == s.channels) random_ = true;
        stage->register_module(std::to_string(j), block);
        names_.push_back("blocks." + std::to_string(i) + "." + std::to_string(j));
        blocks_.push_back(std::move(block));
        in = s.channels;
      }
    }
    conv_head_ = register_module("conv_head", conv(in, features, 1));
    bn2_ = register_module("bn2", bn(features));
    dropout_ = register_module("dropout", nn::Dropout(dropout));  // no parameters: no state_dict key
    classifier_ = register_module("classifier", models::Linear(features, o.num_classes));

    if (o.initialize) {
      init_goog(*this);
      if (o.zero_init_residual) {
        torch::NoGradGuard no_grad;
        for (auto& b : blocks_) {
          if (auto last = b->residual_bn()) last->weight.zero_();
        }
      }
    }
  }

  torch::Tensor forward(torch::Tensor x) override {
    x = models::conv_bn_act(*conv_stem_, *bn1_, x, Act::SiLU);
    for (auto& b : blocks_) x = b->forward(x);
    x = models::conv_bn_act(*conv_head_, *bn2_, x, Act::SiLU);
    x = x.mean({2, 3});  // timm's SelectAdaptivePool2d('avg', flatten=True)
    return classifier_(dropout_(x));
  }

  bool random_in_training() const override { return random_; }

  std::string emit(GraphEmitter& g, const std::string& input) override {
    auto x = g.silu(g.conv_bn(input, *conv_stem_, "conv_stem", *bn1_, "bn1"));
    for (std::size_t i = 0; i < blocks_.size(); ++i) x = blocks_[i]->emit(g, x, names_[i]);
    x = g.silu(g.conv_bn(x, *conv_head_, "conv_head", *bn2_, "bn2"));
    return g.linear(g.flatten(g.global_avg_pool(x)), *classifier_, "classifier");
  }

 private:
  bool random_ = false;
  Conv2dSame conv_stem_{nullptr}, conv_head_{nullptr};
  BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  std::vector<std::shared_ptr<BlockImpl>> blocks_;
  std::vector<std::string> names_;
  nn::Dropout dropout_{nullptr};
  models::Linear classifier_{nullptr};
};

}  // namespace

Network make_efficientnet(const EfficientNetVariant& variant, const ModelOptions& options) {
  return std::make_shared<EfficientNetImpl>(variant, options);
}

}  // namespace convnets
