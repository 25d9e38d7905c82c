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
  // Blocks per stage. A first stage of 0 blocks leaves the stem's resolution
  // to the stem alone (the next stage still strides): ResNet-10s.
  std::vector<int> blocks;
  int64_t groups = 1;                // cardinality (ResNeXt)
  int64_t width_per_group = 64;      // inner width = planes * width_per_group / 64 * groups
  int64_t se_channels = 0;           // DLE SE-ResNeXt: absolute reduced width (16), 0 = no SE
  std::vector<int64_t> widths{64, 128, 256, 512};  // planes per stage (before expansion)
  // CIFAR-style stem (He et al. 2015, "Deep Residual Learning", section 4.2):
  // one 3x3 stride-1 conv of widths[0] and no max-pool, for 28-32 px inputs.
  // Shortcuts stay torchvision's 1x1 projections (the paper's option B), not option A's zero padding.
  bool small_input_stem = false;
};

Network make_resnet(const ResNetConfig& config, const ModelOptions& options);

// DLE keeps the four stages in one Sequential `layers.{s}`; torchvision calls
// them `layer{s+1}`. NGC checkpoints may use either. Returns key unchanged if it is not DLE-style.
std::string resnet_key_from_dle(const std::string& key);

}  // namespace convnets
