// The ResNet family (ResNet, ResNeXt, Wide ResNet, DLE's SE-ResNeXt) with torchvision's module names.
#pragma once

#include "models/network.h"

#include <string>
#include <vector>

namespace convnets {

// One ResNet configuration. Reproduces torchvision.models.resnet (0.14) and
// NVIDIA DeepLearningExamples' ConvNets ResNets, which are the same network
// ("v1.5": the stride of a downsampling bottleneck sits on its 3x3 conv) apart
// from DLE's SE unit; see shared/reference/DLE_RESNET_NOTES.md.
struct ResNetConfig {
  bool bottleneck = true;            // Bottleneck (expansion 4) vs BasicBlock (expansion 1)
  std::vector<int> blocks;           // blocks per stage, 4 stages
  int64_t groups = 1;                // cardinality (ResNeXt)
  int64_t width_per_group = 64;      // inner width = planes * width_per_group / 64 * groups
  int64_t se_channels = 0;           // DLE SE-ResNeXt: absolute reduced width (16), 0 = no SE
};

Network make_resnet(const ResNetConfig& config, const ModelOptions& options);

// DLE keeps the four stages in one Sequential `layers.{s}`; torchvision calls
// them `layer{s+1}`. NGC checkpoints may use either. Returns key unchanged if it is not DLE-style.
std::string resnet_key_from_dle(const std::string& key);

}  // namespace convnets
