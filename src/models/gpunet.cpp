#include "models/gpunet.h"

#include "core/error.h"
#include "models/graph.h"
#include "models/layers.h"

#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

namespace convnets {

bool GpunetLayer::operator==(const GpunetLayer& o) const {
  return layer_type == o.layer_type && num_in_channels == o.num_in_channels &&
         num_out_channels == o.num_out_channels && kernel_size == o.kernel_size && stride == o.stride &&
         expansion == o.expansion && act == o.act && use_se == o.use_se && stage == o.stage && groups == o.groups &&
         num_classes == o.num_classes;
}

bool GpunetDefinition::operator==(const GpunetDefinition& o) const {
  return img_resolution == o.img_resolution && distill == o.distill && layers == o.layers;
}

std::int64_t gpunet_make_divisible(double v) {
  constexpr std::int64_t divisor = 8;
  std::int64_t r = std::max<std::int64_t>(divisor, static_cast<std::int64_t>(v + divisor / 2.0) / divisor * divisor);
  if (static_cast<double>(r) < 0.9 * v) r += divisor;
  return r;
}

namespace {

// ---------------------------------------------------------------- parsing

// The fields each layer type reads, per builder (GPUNET_SPEC.md sections 3
// and 4): a missing one is an error, others are ignored.
struct TypeFields {
  const char* type;
  std::vector<const char*> required;
};

const std::vector<TypeFields>& fields_for(bool distill) {
  static const std::vector<TypeFields> plain = {
      {"head", {"num_in_channels", "num_out_channels"}},  // act optional: swish
      {"conv", {"num_in_channels", "num_out_channels", "stride", "kernel_size", "act", "stage"}},
      {"irb",
       {"num_in_channels", "num_out_channels", "stride", "expansion", "kernel_size", "act", "use_se", "stage"}},
      {"fused_irb",
       {"num_in_channels", "num_out_channels", "stride", "expansion", "kernel_size", "act", "use_se", "stage"}},
      {"tail", {"num_in_channels", "num_out_channels", "num_classes"}},
  };
  static const std::vector<TypeFields> distilled = {
      {"head", {"num_in_channels", "num_out_channels"}},
      {"head_large", {"num_in_channels", "num_out_channels"}},
      {"irb", {"num_in_channels", "num_out_channels", "stride", "expansion", "kernel_size", "groups", "stage"}},
      {"fused_irb", {"num_in_channels", "num_out_channels", "stride", "expansion", "kernel_size", "groups", "stage"}},
      {"tail", {"num_in_channels", "num_out_channels", "num_classes"}},
  };
  return distill ? distilled : plain;
}

std::string json_kind(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "the integer " + v.dump();
  if (v.is_number()) return "the number " + v.dump();
  if (v.is_string()) return "the string " + v.dump();
  if (v.is_array()) return "a list";
  return "an object";
}

class LayerReader {
 public:
  LayerReader(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& expected, const std::string& got) const {
    throw Error(where_ + ": field '" + field + "' is " + got + "; expected " + expected);
  }

  const nlohmann::json& at(const std::string& field, const std::string& expected) const {
    if (!j_.contains(field)) fail(field, expected, "missing");
    return j_.at(field);
  }
  std::int64_t integer(const std::string& field, std::int64_t min) const {
    const std::string expected = "an integer >= " + std::to_string(min);
    const auto& v = at(field, expected);
    if (!v.is_number_integer() || v.get<std::int64_t>() < min) fail(field, expected, json_kind(v));
    return v.get<std::int64_t>();
  }
  double positive(const std::string& field) const {
    const auto& v = at(field, "a number > 0");
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>())) {
      fail(field, "a number > 0", json_kind(v));
    }
    return v.get<double>();
  }
  bool boolean(const std::string& field) const {
    const auto& v = at(field, "true or false");
    if (!v.is_boolean()) fail(field, "true or false", json_kind(v));
    return v.get<bool>();
  }
  std::string activation(const std::string& field) const {
    const std::string expected = "\"relu\" or \"swish\"";
    const auto& v = at(field, expected);
    if (!v.is_string() || (v != "relu" && v != "swish")) fail(field, expected, json_kind(v));
    return v.get<std::string>();
  }
  const std::string& where() const { return where_; }

 private:
  const nlohmann::json& j_;
  std::string where_;
};

}  // namespace

GpunetDefinition parse_gpunet(const nlohmann::json& config, const std::string& source) {
  if (!config.is_array()) {
    throw Error(source + ": the top level is " + json_kind(config) +
                    "; expected a list of layer objects starting with {\"layer_type\": \"data\", ...}",
                "see shared/reference/GPUNET_SPEC.md or `convnets models --arch gpunet-0 --definition`");
  }
  if (config.empty()) throw Error(source + ": the layer list is empty; expected a \"data\" entry, a head, ..., a tail");
  GpunetDefinition d;
  {
    const auto& data = config[0];
    const std::string where = source + ": layer 0";
    if (!data.is_object() || data.value("layer_type", nlohmann::json()) != "data") {
      throw Error(where + " must be {\"layer_type\": \"data\", \"img_resolution\": N, \"distill\": false|true}, got " +
                  data.dump());
    }
    LayerReader r(data, where + " (data)");
    d.img_resolution = static_cast<int>(r.integer("img_resolution", 1));
    d.distill = r.boolean("distill");
  }
  const auto& types = fields_for(d.distill);
  const std::string builder = d.distill ? "distill=true" : "distill=false";
  std::int64_t channels = 3;
  std::set<std::string> heads;
  for (std::size_t i = 1; i < config.size(); ++i) {
    const auto& j = config[i];
    const std::string where = source + ": layer " + std::to_string(i);
    if (!j.is_object()) throw Error(where + " is " + json_kind(j) + "; expected a layer object");
    if (!j.contains("layer_type") || !j.at("layer_type").is_string()) {
      throw Error(where + ": field 'layer_type' is " +
                  (j.contains("layer_type") ? json_kind(j.at("layer_type")) : std::string("missing")) +
                  "; expected a string");
    }
    GpunetLayer l;
    l.layer_type = j.at("layer_type").get<std::string>();
    const TypeFields* tf = nullptr;
    std::vector<std::string> names;
    for (const auto& t : types) {
      names.push_back(t.type);
      if (l.layer_type == t.type) tf = &t;
    }
    if (!tf) {
      throw Error(where + ": unknown layer_type \"" + l.layer_type + "\"; the " + builder + " builder accepts " +
                  join(names) + (l.layer_type == "data" ? " (\"data\" belongs at index 0 only)" : ""));
    }
    const LayerReader r(j, where + " (" + l.layer_type + ")");
    for (const char* f : tf->required) r.at(f, "present");
    l.num_in_channels = r.integer("num_in_channels", 1);
    l.num_out_channels = r.integer("num_out_channels", 1);
    const bool block = l.layer_type == "conv" || l.layer_type == "irb" || l.layer_type == "fused_irb";
    if (block) {
      l.kernel_size = r.integer("kernel_size", 1);
      l.stride = r.integer("stride", 1);
      l.stage = r.integer("stage", 0);
      if (l.kernel_size % 2 == 0) r.fail("kernel_size", "an odd integer", json_kind(j.at("kernel_size")));
    }
    if (l.layer_type == "irb" || l.layer_type == "fused_irb") {
      l.expansion = r.positive("expansion");
      if (d.distill) {
        if (l.expansion != std::floor(l.expansion)) {
          r.fail("expansion", "an integer (the distill builder uses in x expansion channels as is)",
                 json_kind(j.at("expansion")));
        }
        l.groups = r.integer("groups", 1);
        const std::int64_t mid = l.num_in_channels * static_cast<std::int64_t>(l.expansion);
        if (l.layer_type == "irb") {
          for (const auto& [what, n] : {std::pair<const char*, std::int64_t>{"num_in_channels", l.num_in_channels},
                                        {"num_in_channels x expansion", mid},
                                        {"num_out_channels", l.num_out_channels}}) {
            if (n % l.groups != 0) {
              r.fail("groups", "a divisor of " + std::string(what) + " (" + std::to_string(n) + ")",
                     json_kind(j.at("groups")));
            }
          }
        }
      } else {
        l.use_se = r.boolean("use_se");
      }
    }
    if (!d.distill && (block || (l.layer_type == "head" && j.contains("act")))) l.act = r.activation("act");
    if (l.layer_type == "tail") l.num_classes = r.integer("num_classes", 1);
    if (l.layer_type == "head" || l.layer_type == "head_large") {
      // The distill builder names every head "head:"; DLE would silently keep the last.
      if (d.distill && !heads.insert("head:").second) {
        throw Error(where + ": a second head; the distill=true builder names every head \"head:\", so one would "
                            "replace the other");
      }
    }
    if (l.num_in_channels != channels) {
      throw Error(where + " (" + l.layer_type + "): field 'num_in_channels' is " +
                  std::to_string(l.num_in_channels) + "; expected " + std::to_string(channels) +
                  (i == 1 ? " (the RGB input)" : ", the num_out_channels of layer " + std::to_string(i - 1)));
    }
    if (!d.layers.empty() && d.layers.back().layer_type == "tail") {
      throw Error(where + " (" + l.layer_type + ") follows the tail; expected the tail (global pooling and the "
                                                "classifier) to be the last layer");
    }
    channels = l.num_out_channels;
    d.layers.push_back(std::move(l));
  }
  if (d.layers.empty() || d.layers.back().layer_type != "tail") {
    throw Error(source + ": layer " + std::to_string(config.size() - 1) +
                " is the last and not a \"tail\"; expected the list to end with a tail (pooling and classifier)");
  }
  return d;
}

GpunetDefinition load_gpunet_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(system_error("cannot open GPUNet definition", path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  return parse_gpunet(j, path);
}

nlohmann::ordered_json to_json(const GpunetDefinition& d) {
  auto out = nlohmann::ordered_json::array();
  out.push_back({{"layer_type", "data"}, {"img_resolution", d.img_resolution}, {"distill", d.distill}});
  for (const auto& l : d.layers) {
    nlohmann::ordered_json j{{"layer_type", l.layer_type},
                             {"num_in_channels", l.num_in_channels},
                             {"num_out_channels", l.num_out_channels}};
    const bool block = l.layer_type == "conv" || l.layer_type == "irb" || l.layer_type == "fused_irb";
    if (block) j["stride"] = l.stride;
    if (l.layer_type == "irb" || l.layer_type == "fused_irb") {
      if (l.expansion == std::floor(l.expansion)) {
        j["expansion"] = static_cast<std::int64_t>(l.expansion);
      } else {
        j["expansion"] = l.expansion;
      }
    }
    if (block) j["kernel_size"] = l.kernel_size;
    if (!l.act.empty()) j["act"] = l.act;
    if (!d.distill && (l.layer_type == "irb" || l.layer_type == "fused_irb")) j["use_se"] = l.use_se;
    if (d.distill && (l.layer_type == "irb" || l.layer_type == "fused_irb")) j["groups"] = l.groups;
    if (l.stage >= 0) j["stage"] = l.stage;
    if (l.layer_type == "tail") j["num_classes"] = l.num_classes;
    out.push_back(std::move(j));
  }
  return out;
}

// ---------------------------------------------------------------- modules

namespace {

namespace nn = torch::nn;
using layers::BatchNorm2d;
using layers::Conv2d;

constexpr double kBnEpsPlain = 1e-3;    // DLE's non-distill blocks (TF EfficientNet's BN)
constexpr double kBnEpsDistill = 1e-5;  // PyTorch's default, the distill head/irb/tail

Conv2d conv(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride, std::int64_t pad,
            std::int64_t groups = 1, bool bias = false) {
  return Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(pad).groups(groups).bias(bias));
}

BatchNorm2d bn(std::int64_t c, double eps) { return BatchNorm2d(nn::BatchNormOptions(c).eps(eps)); }

torch::Tensor activate(const torch::Tensor& x, bool swish) { return swish ? torch::silu(x) : torch::relu(x); }

using Value = GraphEmitter::Value;

Value emit_activation(GraphEmitter& g, const Value& x, bool swish) { return swish ? g.silu(x) : g.relu(x); }

class BlockImpl : public nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
  // forward() in eval mode as graph ops; `name` is the block's state_dict path.
  virtual Value emit(GraphEmitter& g, const Value& x, const std::string& name) = 0;
};

// A Sequential of convs, BNs and stateless layers under `net` or `body`:
// DLE's Prologue/PrologueD/PrologueLargeD/Epilogue/EpilogueD and the distill
// Inverted_Residual_Block, whose state_dict keys are positional (net.0, net.1, ...).
class SequentialBlockImpl : public BlockImpl {
 public:
  SequentialBlockImpl(const std::string& child, nn::Sequential seq, bool residual)
      : child_(child), seq_(register_module(child, std::move(seq))), residual_(residual) {}
  torch::Tensor forward(const torch::Tensor& x) override {
    auto y = seq_->forward(x);
    return residual_ ? y + x : y;
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
  ConvBnActImpl(const GpunetLayer& l, std::int64_t pad) : swish_(l.act == "swish") {
    conv_ = register_module("conv", conv(l.num_in_channels, l.num_out_channels, l.kernel_size, l.stride, pad));
    bn1_ = register_module("bn1", bn(l.num_out_channels, kBnEpsPlain));
  }
  torch::Tensor forward(const torch::Tensor& x) override { return activate(bn1_(conv_(x)), swish_); }
  Value emit(GraphEmitter& g, const Value& x, const std::string& name) override {
    return emit_activation(g, g.conv_bn(x, *conv_, name + ".conv", *bn1_, name + ".bn1"), swish_);
  }

 private:
  bool swish_;
  Conv2d conv_{nullptr};
  BatchNorm2d bn1_{nullptr};
};

// timm's SqueezeExcite as DLE configures it: 1x1 convs with bias on the
// spatial mean, the block's activation, a sigmoid gate.
class SqueezeExciteImpl : public nn::Module {
 public:
  SqueezeExciteImpl(std::int64_t channels, std::int64_t reduced, bool swish) : swish_(swish) {
    conv_reduce_ = register_module("conv_reduce", conv(channels, reduced, 1, 1, 0, 1, /*bias=*/true));
    conv_expand_ = register_module("conv_expand", conv(reduced, channels, 1, 1, 0, 1, /*bias=*/true));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto s = x.mean({2, 3}, /*keepdim=*/true);
    s = conv_expand_(activate(conv_reduce_(s), swish_));
    return x * torch::sigmoid(s);
  }
  Value emit(GraphEmitter& g, const Value& x, const std::string& name) {
    auto s = g.conv(g.global_avg_pool(x), *conv_reduce_, name + ".conv_reduce");
    s = g.conv(emit_activation(g, s, swish_), *conv_expand_, name + ".conv_expand");
    return g.mul(x, g.sigmoid(s));
  }

 private:
  bool swish_;
  Conv2d conv_reduce_{nullptr}, conv_expand_{nullptr};
};
TORCH_MODULE(SqueezeExcite);

// SE width from the expanded tensor, as DLE passes se_ratio = 0.25 / expansion
// to timm: Python's round(), i.e. ties to even.
std::int64_t se_width(std::int64_t mid, double expansion) {
  return static_cast<std::int64_t>(std::nearbyint(static_cast<double>(mid) * (0.25 / expansion)));
}

// MBConv (Sandler et al. 2018) with optional SE (Hu et al. 2018): timm's InvertedResidual.
class InvertedResidualImpl : public BlockImpl {
 public:
  InvertedResidualImpl(const GpunetLayer& l, double drop_path_rate)
      : swish_(l.act == "swish"),
        residual_(l.stride == 1 && l.num_in_channels == l.num_out_channels),
        drop_path_(drop_path_rate) {
    const std::int64_t mid = gpunet_make_divisible(static_cast<double>(l.num_in_channels) * l.expansion);
    const std::int64_t pad = ((l.stride - 1) + (l.kernel_size - 1)) / 2;
    conv_pw_ = register_module("conv_pw", conv(l.num_in_channels, mid, 1, 1, 0));
    bn1_ = register_module("bn1", bn(mid, kBnEpsPlain));
    conv_dw_ = register_module("conv_dw", conv(mid, mid, l.kernel_size, l.stride, pad, mid));
    bn2_ = register_module("bn2", bn(mid, kBnEpsPlain));
    if (l.use_se) se_ = register_module("se", SqueezeExcite(mid, se_width(mid, l.expansion), swish_));
    conv_pwl_ = register_module("conv_pwl", conv(mid, l.num_out_channels, 1, 1, 0));
    bn3_ = register_module("bn3", bn(l.num_out_channels, kBnEpsPlain));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    auto y = activate(bn1_(conv_pw_(x)), swish_);
    y = activate(bn2_(conv_dw_(y)), swish_);
    if (se_) y = se_(y);
    y = bn3_(conv_pwl_(y));
    return residual_ ? drop_path(y, drop_path_, is_training()) + x : y;
  }
  Value emit(GraphEmitter& g, const Value& x, const std::string& name) override {
    auto y = emit_activation(g, g.conv_bn(x, *conv_pw_, name + ".conv_pw", *bn1_, name + ".bn1"), swish_);
    y = emit_activation(g, g.conv_bn(y, *conv_dw_, name + ".conv_dw", *bn2_, name + ".bn2"), swish_);
    if (se_) y = se_->emit(g, y, name + ".se");
    y = g.conv_bn(y, *conv_pwl_, name + ".conv_pwl", *bn3_, name + ".bn3");
    return residual_ ? g.add(y, x) : y;
  }

 private:
  bool swish_, residual_;
  double drop_path_;
  Conv2d conv_pw_{nullptr}, conv_dw_{nullptr}, conv_pwl_{nullptr};
  BatchNorm2d bn1_{nullptr}, bn2_{nullptr}, bn3_{nullptr};
  SqueezeExcite se_{nullptr};
};

// FusedMBConv (Gupta & Tan 2019, EfficientNet-EdgeTPU): timm's EdgeResidual.
// DLE asks for TF "same" padding on the k x k conv but its helper builds a
// plain conv with padding 0 whenever stride > 1: those convs are unpadded.
class EdgeResidualImpl : public BlockImpl {
 public:
  EdgeResidualImpl(const GpunetLayer& l, double drop_path_rate)
      : swish_(l.act == "swish"),
        residual_(l.stride == 1 && l.num_in_channels == l.num_out_channels),
        drop_path_(drop_path_rate) {
    const std::int64_t mid = gpunet_make_divisible(static_cast<double>(l.num_in_channels) * l.expansion);
    const std::int64_t pad = (l.stride == 1 && (l.kernel_size - 1) % 2 == 0) ? (l.kernel_size - 1) / 2 : 0;
    conv_exp_ = register_module("conv_exp", conv(l.num_in_channels, mid, l.kernel_size, l.stride, pad));
    bn1_ = register_module("bn1", bn(mid, kBnEpsPlain));
    if (l.use_se) se_ = register_module("se", SqueezeExcite(mid, se_width(mid, l.expansion), swish_));
    conv_pwl_ = register_module("conv_pwl", conv(mid, l.num_out_channels, 1, 1, 0));
    bn2_ = register_module("bn2", bn(l.num_out_channels, kBnEpsPlain));
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    auto y = activate(bn1_(conv_exp_(x)), swish_);
    if (se_) y = se_(y);
    y = bn2_(conv_pwl_(y));
    return residual_ ? drop_path(y, drop_path_, is_training()) + x : y;
  }
  Value emit(GraphEmitter& g, const Value& x, const std::string& name) override {
    auto y = emit_activation(g, g.conv_bn(x, *conv_exp_, name + ".conv_exp", *bn1_, name + ".bn1"), swish_);
    if (se_) y = se_->emit(g, y, name + ".se");
    y = g.conv_bn(y, *conv_pwl_, name + ".conv_pwl", *bn2_, name + ".bn2");
    return residual_ ? g.add(y, x) : y;
  }

 private:
  bool swish_, residual_;
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
    s->push_back(bn(out, eps));
    s->push_back(activation_module(swish));
    if (t == "head_large") {
      for (int i = 0; i < 2; ++i) {
        s->push_back(conv(out, out, 3, 1, 1));
        s->push_back(bn(out, eps));
        s->push_back(nn::ReLU());
      }
    }
    return std::make_shared<SequentialBlockImpl>("net", s, false);
  }
  if (t == "tail") {
    nn::Sequential s;
    const std::int64_t wide = d.distill ? 1152 : out;  // DLE's EpilogueD hard-codes 1152
    s->push_back(conv(in, wide, 1, 1, 0));
    s->push_back(bn(wide, eps));
    s->push_back(nn::ReLU());
    s->push_back(nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions({1, 1})));
    if (d.distill) {
      s->push_back(conv(wide, out, 1, 1, 0));
      s->push_back(nn::ReLU());
    }
    s->push_back(nn::Flatten());
    s->push_back(nn::Dropout(dropout));
    s->push_back(layers::Linear(out, num_classes));
    return std::make_shared<SequentialBlockImpl>("net", s, false);
  }
  if (!d.distill) {
    if (t == "conv") return std::make_shared<ConvBnActImpl>(l, ((l.stride - 1) + (l.kernel_size - 1)) / 2);
    if (t == "irb") return std::make_shared<InvertedResidualImpl>(l, drop_path_rate);
    return std::make_shared<EdgeResidualImpl>(l, drop_path_rate);
  }
  const std::int64_t mid = in * static_cast<std::int64_t>(l.expansion);
  const std::int64_t k = l.kernel_size, pad = k / 2;
  nn::Sequential s;
  if (t == "irb") {
    s->push_back(conv(in, mid, 1, 1, 0, l.groups));
    s->push_back(bn(mid, eps));
    s->push_back(nn::ReLU());
    s->push_back(conv(mid, mid, k, l.stride, pad, mid));
    s->push_back(bn(mid, eps));
    s->push_back(nn::ReLU());
    s->push_back(conv(mid, out, 1, 1, 0, l.groups));
    s->push_back(bn(out, eps));
  } else {  // distill fused_irb: padded, BN eps 1e-3, groups unused (as DLE)
    s->push_back(conv(in, mid, k, l.stride, pad));
    s->push_back(bn(mid, kBnEpsPlain));
    s->push_back(nn::ReLU());
    s->push_back(conv(mid, out, 1, 1, 0));
    s->push_back(bn(out, kBnEpsPlain));
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
    const auto rates = gpunet_drop_path_rates(d, o.drop_path >= 0 ? o.drop_path : 0.2);
    const double dropout = o.dropout >= 0 ? o.dropout : 0.2;
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

torch::Tensor drop_path(const torch::Tensor& branch, double p, bool training) {
  if (!training || p <= 0) return branch;
  const double keep = 1.0 - p;
  auto mask = torch::empty({branch.size(0), 1, 1, 1}, branch.options()).bernoulli_(keep).div_(keep);
  return branch * mask;
}

Network make_gpunet(const GpunetDefinition& d, const ModelOptions& options) {
  TORCH_CHECK(!d.layers.empty(), "make_gpunet: an empty definition (parse_gpunet validates them)");
  return std::make_shared<GpunetImpl>(d, options);
}

}  // namespace convnets
