// GPUNet: the JSON layer-list format (parsing, validation, writing) and the network it describes.
#pragma once

#include "models/network.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace convnets {

// One element of a GPUNet config after the leading "data" entry. Field names
// are the JSON's; fields a layer type does not read keep their defaults.
// Reproduces NVIDIA DeepLearningExamples' GPUNet (Wang et al. 2022, "Searching
// the Deployable Convolution Neural Networks for GPUs"; models/gpunet_builder.py
// at DLE 729963dd), as shared/reference/GPUNET_SPEC.md describes it.
struct GpunetLayer {
  std::string layer_type;  // head | head_large | conv | irb | fused_irb | tail
  std::int64_t num_in_channels = 0;
  std::int64_t num_out_channels = 0;
  std::int64_t kernel_size = 0;
  std::int64_t stride = 1;
  double expansion = 0;
  std::string act;         // "relu" | "swish"; empty where the type has a fixed one
  bool use_se = false;
  std::int64_t stage = -1; // -1: absent (heads and tails)
  std::int64_t groups = 1;
  std::int64_t num_classes = 0;
  bool operator==(const GpunetLayer& o) const;
};

struct GpunetDefinition {
  int img_resolution = 224;
  // DLE has two builders: distill=false (EfficientNet-style blocks, BN eps
  // 1e-3, make-divisible widths, SE, drop-path) and distill=true (ReLU
  // everywhere, BN eps 1e-5, exact widths, grouped 1x1 convs, a wide tail).
  bool distill = false;
  std::vector<GpunetLayer> layers;  // JSON elements 1.., the data entry excluded
  bool operator==(const GpunetDefinition& o) const;
};

// Validates a config as DLE's builder reads it: a list whose element 0 is
// {"layer_type": "data", "img_resolution": N, "distill": bool}, then layer
// objects. Stricter than DLE where DLE would build a broken network: each
// layer's num_in_channels must equal the previous layer's num_out_channels
// (3 for the first), the list must end with its only tail, widths must divide
// by groups. Errors name `source`, the layer index in the list, the field and
// what was expected. Unknown extra fields are ignored, as DLE does.
GpunetDefinition parse_gpunet(const nlohmann::json& config, const std::string& source);
// Reads and parses a JSON file; a syntax error names the file.
GpunetDefinition load_gpunet_file(const std::string& path);
// The definition in DLE's JSON format: parse_gpunet(to_json(d)) == d.
nlohmann::ordered_json to_json(const GpunetDefinition& d);

// DLE's mid-channel rounding for the non-distill irb/fused_irb (timm's
// make_divisible, divisor 8, round_limit 0.9): 736.32 -> 736, 5596.8 -> 5600.
std::int64_t gpunet_make_divisible(double v);

// The network: one child `network` holding one child per layer, under DLE's
// names ("head: 2", "stage: 3 layer7", " layer15", "stage: 1 irb4", "tail:"),
// so state_dict keys equal the published checkpoints'. num_classes comes from
// `options` (the tail's num_classes field is the published default). Convs,
// BN and Linear keep PyTorch's default initialisation, as DLE applies none.
// Drop-path on the residual branches (non-distill only) at
// options.drop_path * j / (list length - 1) for element j (0.2 by default),
// dropout before the classifier at options.dropout (0.2 by default).
Network make_gpunet(const GpunetDefinition& d, const ModelOptions& options);

// Drop-path rate of each of d.layers: drop_path * j / (list length - 1) for
// JSON element j (DLE's linear rule; only residual branches use it); all 0
// for distill=true, whose blocks take none.
std::vector<double> gpunet_drop_path_rates(const GpunetDefinition& d, double drop_path);

// Stochastic depth as timm's drop_path: in training, each sample's `branch`
// is zeroed with probability p and the survivors scaled by 1 / (1 - p), so
// the expectation is unchanged; the identity in eval or at p = 0.
torch::Tensor drop_path(const torch::Tensor& branch, double p, bool training);

}  // namespace convnets

namespace convnets {

// The seven published GPUNets (DLE configs/batch1/GV100), as convnets' own
// definitions: `reference_file` names DLE's JSON for the same network.
struct GpunetVariant {
  std::string name;            // gpunet-0, ..., gpunet-d2
  std::string description;
  std::string reference_file;  // e.g. "0.65ms.json"
  GpunetDefinition definition;
  // Eval centre-crop fraction of its train.params (--crop-pct): 1.0, or 0.875 for P0/P1.
  double crop_pct = 1.0;
};
const std::vector<GpunetVariant>& gpunet_variants();

}  // namespace convnets
