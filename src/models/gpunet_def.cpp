#include "models/gpunet_def.h"

#include "core/error.h"
#include "core/json.h"
#include "core/limits.h"

#include <cmath>
#include <set>

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
  std::int64_t integer(const std::string& field, std::int64_t min, std::int64_t max) const {
    const std::string expected = "an integer in " + std::to_string(min) + " .. " + std::to_string(max);
    const auto& v = at(field, expected);
    if (!v.is_number_integer() || v.get<std::int64_t>() < min || v.get<std::int64_t>() > max) {
      fail(field, expected, json_kind(v));
    }
    return v.get<std::int64_t>();
  }
  double positive(const std::string& field, double max) const {
    const std::string expected = "a number in (0, " + std::to_string(static_cast<std::int64_t>(max)) + "]";
    const auto& v = at(field, expected);
    if (!v.is_number() || !(v.get<double>() > 0) || !(v.get<double>() <= max)) fail(field, expected, json_kind(v));
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

// Bounds far above any published network (GPUNets use <= 2,048 channels,
// EfficientNet-B7 3,840) that keep a definition from asking LibTorch for
// terabytes: every field is bounded, then the whole model.
constexpr std::int64_t kMaxChannels = 65536;
constexpr std::int64_t kMaxKernel = 31;
constexpr std::int64_t kMaxStride = 64;
constexpr std::int64_t kMaxStage = 1024;
constexpr double kMaxExpansion = 64;
constexpr std::int64_t kMaxResolution = 8192;
constexpr std::size_t kMaxLayers = 4096;
constexpr std::int64_t kMaxParameters = 2'000'000'000;  // 8 GB of fp32 weights

// Weights of one layer as the builders make them, for the model-size limit
// (convs and linears; BN and SE add less than a tenth).
double layer_parameters(const GpunetLayer& l) {
  const double in = double(l.num_in_channels), out = double(l.num_out_channels), k2 = double(l.kernel_size) * l.kernel_size;
  const double mid = in * l.expansion;
  if (l.layer_type == "conv") return k2 * in * out;
  if (l.layer_type == "irb") return in * mid + k2 * mid + mid * out;
  if (l.layer_type == "fused_irb") return k2 * in * mid + mid * out;
  if (l.layer_type == "tail") return in * out + out * double(l.num_classes);
  return 9 * in * out + 9 * out * out;  // head, head_large: a few 3x3 convs
}

}  // namespace

std::int64_t gpunet_se_width(std::int64_t mid, double expansion) {
  return static_cast<std::int64_t>(std::nearbyint(static_cast<double>(mid) * (0.25 / expansion)));
}

GpunetSpatial gpunet_spatial(const GpunetLayer& l, bool distill) {
  const std::int64_t k = l.kernel_size, s = l.stride;
  if (l.layer_type == "head" || l.layer_type == "head_large") return {3, 2, 1};
  if (l.layer_type == "tail") return {};
  if (distill) return {k, s, k / 2};
  if (l.layer_type == "fused_irb") return {k, s, s == 1 && (k - 1) % 2 == 0 ? (k - 1) / 2 : 0};
  return {k, s, ((s - 1) + (k - 1)) / 2};
}

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
    d.img_resolution = static_cast<int>(r.integer("img_resolution", 1, kMaxResolution));
    d.distill = r.boolean("distill");
  }
  const auto& types = fields_for(d.distill);
  const std::string builder = d.distill ? "distill=true" : "distill=false";
  std::int64_t channels = 3;
  std::set<std::string> heads;
  if (config.size() > kMaxLayers + 1) {
    throw Error(source + ": " + std::to_string(config.size() - 1) + " layers; the limit is " +
                std::to_string(kMaxLayers));
  }
  double parameters = 0;
  std::int64_t side = d.img_resolution;
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
    l.num_in_channels = r.integer("num_in_channels", 1, kMaxChannels);
    l.num_out_channels = r.integer("num_out_channels", 1, kMaxChannels);
    const bool block = l.layer_type == "conv" || l.layer_type == "irb" || l.layer_type == "fused_irb";
    if (block) {
      l.kernel_size = r.integer("kernel_size", 1, kMaxKernel);
      l.stride = r.integer("stride", 1, kMaxStride);
      l.stage = r.integer("stage", 0, kMaxStage);
      if (l.kernel_size % 2 == 0) r.fail("kernel_size", "an odd integer", json_kind(j.at("kernel_size")));
    }
    if (l.layer_type == "irb" || l.layer_type == "fused_irb") {
      l.expansion = r.positive("expansion", kMaxExpansion);
      if (d.distill) {
        if (l.expansion != std::floor(l.expansion)) {
          r.fail("expansion", "an integer (the distill builder uses in x expansion channels as is)",
                 json_kind(j.at("expansion")));
        }
        l.groups = r.integer("groups", 1, kMaxChannels);
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
        // timm (and so DLE) would build a 0-channel conv and fail; found by fuzz_gpunet_build.
        const std::int64_t mid = gpunet_make_divisible(static_cast<double>(l.num_in_channels) * l.expansion);
        if (l.use_se && gpunet_se_width(mid, l.expansion) < 1) {
          r.fail("use_se", "false for " + std::to_string(l.num_in_channels) + " input channels (its squeeze-excite "
                 "would have round(" + std::to_string(mid) + " x 0.25 / expansion) = 0 channels)", "true");
        }
      }
    }
    if (!d.distill && (block || (l.layer_type == "head" && j.contains("act")))) l.act = r.activation("act");
    if (l.layer_type == "tail") l.num_classes = r.integer("num_classes", 1, kMaxClasses);
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
    // The image shrinks through the strided convs; an unpadded kernel larger
    // than what is left fails in the forward pass with LibTorch's message,
    // which names no layer (found by fuzz_gpunet_build).
    const GpunetSpatial sp = gpunet_spatial(l, d.distill);
    if (side + 2 * sp.padding < sp.kernel) {
      throw Error(where + " (" + l.layer_type + "): its " + std::to_string(sp.kernel) + "x" + std::to_string(sp.kernel) +
                      " conv (stride " + std::to_string(sp.stride) + ", padding " + std::to_string(sp.padding) +
                      ") needs at least " + std::to_string(sp.kernel - 2 * sp.padding) + " px; the image is " +
                      std::to_string(side) + " px here at img_resolution " + std::to_string(d.img_resolution),
                  "raise img_resolution, or use fewer stride-2 layers before this one");
    }
    side = (side + 2 * sp.padding - sp.kernel) / sp.stride + 1;
    parameters += layer_parameters(l);
    if (parameters > double(kMaxParameters)) {
      throw Error(where + " (" + l.layer_type + ") brings the model to about " +
                  std::to_string(static_cast<long long>(parameters / 1e6)) + " million weights; the limit is " +
                  std::to_string(kMaxParameters / 1000000) + " million (" +
                  std::to_string(kMaxParameters * 4 / 1000000000) + " GB in fp32)");
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
  return parse_gpunet(read_json_file(path, "GPUNet definition"), path);
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

}  // namespace convnets
