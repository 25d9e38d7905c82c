// GPUNet's JSON layer-list format: parsing, validation and writing, without LibTorch (the fuzz targets build it alone).
#pragma once

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

// The k x k convolution that sets a layer's output size, as DLE's builder
// makes it: heads are 3x3 stride 2 padding 1; the non-distill conv and irb
// pad ((s-1)+(k-1))/2; the non-distill fused_irb pads (k-1)/2 at stride 1
// and not at all at stride > 1 (DLE's "same" helper builds an unpadded conv
// there); distill blocks pad k/2. A tail (1x1 then pooling) has kernel 1.
struct GpunetSpatial {
  std::int64_t kernel = 1, stride = 1, padding = 0;
};
GpunetSpatial gpunet_spatial(const GpunetLayer& l, bool distill);

// Squeeze-excite width of a non-distill irb/fused_irb whose expanded width is
// `mid`: timm's round(mid x 0.25 / expansion), the input width x 0.25.
std::int64_t gpunet_se_width(std::int64_t mid, double expansion);

// DLE's mid-channel rounding for the non-distill irb/fused_irb (timm's
// make_divisible, divisor 8, round_limit 0.9): 736.32 -> 736, 5596.8 -> 5600.
std::int64_t gpunet_make_divisible(double v);

}  // namespace convnets
