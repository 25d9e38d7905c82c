#include "models/arch_names.h"

#include <map>

namespace convnets {

std::string canonical_arch_name(const std::string& name) {
  static const std::map<std::string, std::string> dle_archs = {{"resnext101-32x4d", "resnext101_32x4d"},
                                                               {"se-resnext101-32x4d", "se_resnext101_32x4d"}};
  if (auto it = dle_archs.find(name); it != dle_archs.end()) return it->second;
  std::string out = name;
  const bool definition_file = out.size() > 5 && out.compare(out.size() - 5, 5, ".json") == 0;
  if (out.rfind("gpunet_", 0) == 0 && !definition_file) out[6] = '-';  // timm's model names are convnets' with '-'
  return out;
}

}  // namespace convnets
