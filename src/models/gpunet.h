// GPUNet: the network a layer list (models/gpunet_def.h) describes, and the published variants.
#pragma once

#include "models/gpunet_def.h"
#include "models/network.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace convnets {

// The network: one child `network` holding one child per layer, under DLE's
// names ("head: 2", "stage: 3 layer7", " layer15", "stage: 1 irb4", "tail:"),
// so state_dict keys equal the published checkpoints'. num_classes comes from
// `options` (the tail's num_classes field is the published default). Convs,
// BN and Linear keep PyTorch's default initialisation, as DLE applies none.
// Drop-path on the residual branches (non-distill only) at
// options.drop_path * j / (list length - 1) for element j (0.2 by default),
// dropout before the classifier at options.dropout (0.2 by default).
Network make_gpunet(const GpunetDefinition& d, const ModelOptions& options);

// DLE's rates where a run names none (its gpunet_* builders: drop_rate and
// drop_connect_rate 0.2).
inline constexpr double kGpunetDropout = 0.2, kGpunetDropPath = 0.2;

// Drop-path rate of each of d.layers: drop_path * j / (list length - 1) for
// JSON element j (DLE's linear rule; only residual branches use it); all 0
// for distill=true, whose blocks take none.
std::vector<double> gpunet_drop_path_rates(const GpunetDefinition& d, double drop_path);

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
