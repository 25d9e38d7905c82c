// The names users give archs: convnets' own, and DLE's and timm's spellings of the same networks (torch-free).
#pragma once

#include <string>

namespace convnets {

// convnets' name for an arch as DLE's main.py and classify.py spell it
// (resnext101-32x4d) or timm's validate.py and train.py (gpunet_0); other
// names unchanged. find_architecture reads both spellings.
std::string canonical_arch_name(const std::string& name);

}  // namespace convnets
