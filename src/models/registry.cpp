#include "models/registry.h"

#include "core/error.h"
#include "models/arch_names.h"
#include "models/efficientnet.h"
#include "models/gpunet.h"
#include "models/layers.h"
#include "models/resnet.h"

#include <deque>
#include <mutex>

namespace convnets {
namespace {

ArchInfo resnet(std::string name, std::string description, std::string reference, ResNetConfig config) {
  ArchInfo a;
  a.name = std::move(name);
  a.description = std::move(description);
  a.reference = std::move(reference);
  a.build = [config, name = a.name](const ModelOptions& o) {
    if (o.drop_path > 0) {
      throw Error("--drop-path " + std::to_string(o.drop_path) + ": " + name +
                  " has no drop-path; it applies to the distill=false GPUNets");
    }
    return make_resnet(config, o);
  };
  a.key_layouts = {{{"torchvision", "timm"}, {}}, {{"dle"}, resnet_key_from_dle}};
  return a;  // Preprocessing defaults are the ImageNet ones every ResNet recipe uses.
}

// Small-image ResNets take the whole 28-32 px image (no crop) with CIFAR-10's statistics.
ArchInfo small_image_resnet(const std::string& name, const std::string& description, const ResNetConfig& config) {
  auto a = resnet(name, description, "", config);
  a.key_layouts = {{{"torchvision"}, {}}};  // convnets' own: no weights of them are published elsewhere
  a.preprocessing.input_size = 32;
  a.preprocessing.crop_ratio = 1.0;  // CIFAR-sized images are used whole
  a.preprocessing.mean = {0.4914, 0.4822, 0.4465};
  a.preprocessing.std = {0.2470, 0.2435, 0.2616};
  return a;
}

// He et al. 2015, section 4.2: 6n+2 layers, three stages of n BasicBlocks at
// 16/32/64 channels, for 32x32 inputs (28x28 Fashion-MNIST works as is).
ArchInfo cifar_resnet(int n) {
  const int depth = 6 * n + 2;
  return small_image_resnet(
      "resnet" + std::to_string(depth),
      "ResNet-" + std::to_string(depth) + " for small images (He et al. 2015 sec. 4.2, 1x1 projections)",
      {.bottleneck = false, .blocks = {n, n, n}, .widths = {16, 32, 64}, .small_input_stem = true});
}

// The same blocks spent where a CPU computes them cheaply: the 3x3 stem alone
// at full resolution, then four stride-2 stages of one BasicBlock, doubling
// 32 -> 256 channels (28 -> 14 -> 7 -> 4 -> 2 px). The Fashion-MNIST demo's
// net (issue 37), picked on a held-out split among the variants measured in
// docs/PERFORMANCE.md: on 2 CPU cores it trains at 0.7x ResNet-8's speed with
// 16x its parameters. Layer names follow torchvision (layer1, the stage at the
// stem's resolution, is empty).
ArchInfo resnet10s() {
  return small_image_resnet("resnet10s", "ResNet-10s for small images: 3x3 stem, four stride-2 BasicBlocks, 32-256 ch",
                            {.bottleneck = false,
                             .blocks = {0, 1, 1, 1, 1},
                             .widths = {16, 32, 64, 128, 256},
                             .small_input_stem = true});
}

// GPUNet preprocessing as DLE's recipes use it: timm's validation transform
// with bicubic resizing (train.py's --interpolation default comes from the
// model's default_cfg, bicubic), timm's ImageNet mean/std, --crop-pct 1.0 at the
// definition's resolution (P0/P1's 0.875 is set from their variant).
ArchInfo gpunet(std::string name, std::string description, GpunetDefinition d) {
  ArchInfo a;
  a.name = std::move(name);
  a.description = std::move(description);
  a.preprocessing.input_size = d.img_resolution;
  a.preprocessing.crop_ratio = 1.0;
  a.preprocessing.interpolation = "bicubic";
  a.key_names = "dle-gpunet";
  a.key_layouts = {{{"gpunet", "dle"}, {}}};
  a.dropout = kGpunetDropout;
  a.drop_path = d.distill ? 0.0 : kGpunetDropPath;  // distill=true blocks take none
  a.gpunet = std::make_shared<const GpunetDefinition>(std::move(d));
  a.build = [def = a.gpunet, name = a.name](const ModelOptions& o) {
    if (def->distill && o.drop_path > 0) {
      throw Error("--drop-path " + std::to_string(o.drop_path) + ": " + name +
                  " is a distill=true GPUNet, whose blocks have no drop-path (as in DLE)");
    }
    return make_gpunet(*def, o);
  };
  return a;
}

// timm 0.5.4's TF-ported EfficientNets (DLE's GPUNet teachers): timm's own
// key names, so a converted timm .pth loads as is, and timm's
// default_cfg preprocessing. `reference` stays empty: shared/reference has no
// key file for them (tests/python/test_efficientnet.py checks against timm).
ArchInfo efficientnet(const EfficientNetVariant& v) {
  ArchInfo a;
  a.name = v.name;
  a.description = v.description;
  a.preprocessing = v.preprocessing;
  a.key_names = "timm";
  a.key_layouts = {{{"timm"}, {}}};
  a.build = [v](const ModelOptions& o) { return make_efficientnet(v, o); };
  return a;
}

std::vector<ArchInfo> make_registry() {
  return {
      resnet("resnet18", "ResNet-18 (He et al. 2015)", "tv-resnet18", {.bottleneck = false, .blocks = {2, 2, 2, 2}}),
      resnet("resnet34", "ResNet-34 (He et al. 2015)", "tv-resnet34", {.bottleneck = false, .blocks = {3, 4, 6, 3}}),
      resnet("resnet50", "ResNet-50 v1.5 (stride on the 3x3 conv)", "tv-resnet50", {.blocks = {3, 4, 6, 3}}),
      resnet("resnet101", "ResNet-101 v1.5", "tv-resnet101", {.blocks = {3, 4, 23, 3}}),
      resnet("resnet152", "ResNet-152 v1.5", "tv-resnet152", {.blocks = {3, 8, 36, 3}}),
      resnet("resnext50_32x4d", "ResNeXt-50 32x4d (Xie et al. 2017)", "tv-resnext50_32x4d",
             {.blocks = {3, 4, 6, 3}, .groups = 32, .width_per_group = 4}),
      resnet("resnext101_32x4d", "ResNeXt-101 32x4d (DLE)", "dle-resnext101-32x4d",
             {.blocks = {3, 4, 23, 3}, .groups = 32, .width_per_group = 4}),
      resnet("resnext101_32x8d", "ResNeXt-101 32x8d", "tv-resnext101_32x8d",
             {.blocks = {3, 4, 23, 3}, .groups = 32, .width_per_group = 8}),
      resnet("wide_resnet50_2", "Wide ResNet-50-2 (Zagoruyko & Komodakis 2016)", "tv-wide_resnet50_2",
             {.blocks = {3, 4, 6, 3}, .width_per_group = 128}),
      resnet("se_resnext101_32x4d", "SE-ResNeXt-101 32x4d (DLE: SE width 16)", "dle-se-resnext101-32x4d",
             {.blocks = {3, 4, 23, 3}, .groups = 32, .width_per_group = 4, .se_channels = 16}),
      cifar_resnet(1),
      cifar_resnet(3),
      cifar_resnet(9),
      resnet10s(),
  };
}

std::vector<ArchInfo> make_full_registry() {
  auto all = make_registry();
  for (const auto& v : gpunet_variants()) {
    auto a = gpunet(v.name, v.description, v.definition);
    a.preprocessing.crop_ratio = v.crop_pct;
    a.reference = v.name;
    all.push_back(std::move(a));
  }
  for (const auto& v : efficientnet_variants()) all.push_back(efficientnet(v));
  return all;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Archs read from files or checkpoints; a deque keeps references stable.
struct DynamicArchs {
  std::mutex mutex;
  std::deque<ArchInfo> archs;
};
DynamicArchs& dynamic_archs() {
  static DynamicArchs d;
  return d;
}

const ArchInfo& remember(const std::string& name, GpunetDefinition d) {
  auto& dyn = dynamic_archs();
  std::lock_guard<std::mutex> lock(dyn.mutex);
  for (const auto& a : dyn.archs) {
    if (a.name == name && *a.gpunet == d) return a;
  }
  auto a = gpunet(name, "GPUNet from " + name, std::move(d));
  a.from_file = true;
  dyn.archs.push_back(std::move(a));
  return dyn.archs.back();
}

}  // namespace

const std::vector<ArchInfo>& architectures() {
  static const std::vector<ArchInfo> registry = make_full_registry();
  return registry;
}

std::vector<std::string> architecture_names() {
  std::vector<std::string> names;
  for (const auto& a : architectures()) names.push_back(a.name);
  return names;
}

const KeyLayout* find_key_layout(const ArchInfo& arch, const std::string& name) {
  for (const auto& layout : arch.key_layouts) {
    for (const auto& n : layout.names)
      if (n == name) return &layout;
  }
  return nullptr;
}

const ArchInfo& find_architecture(const std::string& spelled) {
  const std::string name = canonical_arch_name(spelled);
  for (const auto& a : architectures()) {
    if (a.name == name) return a;
  }
  if (ends_with(name, ".json")) return remember(name, load_gpunet_file(name));
  throw Error("unknown arch '" + spelled + "'",
              "valid archs: " + join(architecture_names()) + ", or a GPUNet definition file ending in .json");
}

const ArchInfo& architecture_from_definition(const std::string& name, const nlohmann::json& definition,
                                             const std::string& source) {
  return remember(name, parse_gpunet(definition, source));
}

nlohmann::json architecture_meta(const ArchInfo& arch) {
  nlohmann::json m{{"arch", arch.name}};
  if (arch.from_file) m["arch_definition"] = to_json(*arch.gpunet);
  return m;
}

const ArchInfo& architecture_of_checkpoint(const nlohmann::json& meta, const std::string& source) {
  const auto name = meta.at("arch").get<std::string>();
  if (meta.contains("arch_definition")) {
    return architecture_from_definition(name, meta.at("arch_definition"), source + " (arch_definition)");
  }
  return find_architecture(name);
}

bool same_architecture(const ArchInfo& arch, const nlohmann::json& meta) {
  const auto name = meta.value("arch", std::string());
  if (!arch.gpunet) return name == arch.name;
  if (meta.contains("arch_definition")) {
    return parse_gpunet(meta.at("arch_definition"), "checkpoint") == *arch.gpunet;
  }
  for (const auto& a : architectures()) {
    if (a.name == name) return a.gpunet && *a.gpunet == *arch.gpunet;
  }
  return false;
}

nlohmann::ordered_json to_json(const Preprocessing& p) {
  return {{"input_size", p.input_size}, {"crop_ratio", p.crop_ratio}, {"mean", p.mean},
          {"std", p.std},               {"interpolation", p.interpolation}};
}

Preprocessing preprocessing_from_json(const nlohmann::json& j) {
  Preprocessing p;
  p.input_size = j.at("input_size").get<int>();
  p.crop_ratio = j.at("crop_ratio").get<double>();
  p.mean = j.at("mean").get<std::array<double, 3>>();
  p.std = j.at("std").get<std::array<double, 3>>();
  p.interpolation = j.value("interpolation", "bilinear");
  return p;
}

Network build_model(const ArchInfo& arch, const ModelOptions& options) {
  if (options.num_classes < 1) {
    throw Error("--num-classes must be at least 1, got " + std::to_string(options.num_classes));
  }
  return arch.build(options);
}

nlohmann::ordered_json describe_architecture(const ArchInfo& arch, NetworkImpl& net, int64_t num_classes) {
  nlohmann::ordered_json row{{"name", arch.name},
                             {"description", arch.description},
                             {"num_classes", num_classes},
                             {"params", count_parameters(net)},
                             {"gmacs", static_cast<double>(count_macs(net, arch.preprocessing.input_size)) / 1e9}};
  row.update(to_json(arch.preprocessing));
  row["reference"] = arch.reference;
  return row;
}

std::vector<nlohmann::ordered_json> describe_architectures(const ModelOptions& options) {
  std::vector<nlohmann::ordered_json> rows;
  ModelOptions shapes_only = options;
  shapes_only.initialize = false;
  models::ShapesOnly zero_parameters;
  for (const auto& arch : architectures()) {
    auto net = build_model(arch, shapes_only);
    rows.push_back(describe_architecture(arch, *net, options.num_classes));
  }
  return rows;
}

}  // namespace convnets
