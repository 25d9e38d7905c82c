#include "models/fusion_mode.h"

#include "core/error.h"

namespace convnets::models {

const std::vector<FusionPath>& all_fusion_paths() {
  static const std::vector<FusionPath> paths{FusionPath::Unfused, FusionPath::Bn, FusionPath::BnFold,
                                             FusionPath::NormConv};
  return paths;
}

const char* path_name(FusionPath path) {
  switch (path) {
    case FusionPath::Unfused: return "none";
    case FusionPath::Bn: return "bn";
    case FusionPath::BnFold: return "bn+fold";
    default: return "normconv";
  }
}

const char* mode_name(FusionMode mode) {
  switch (mode) {
    case FusionMode::Auto: return "auto";
    case FusionMode::None: return "none";
    case FusionMode::Bn: return "bn";
    default: return "normconv";
  }
}

FusionMode parse_fusion_mode(const std::string& text, const std::string& flag) {
  for (const auto mode : {FusionMode::Auto, FusionMode::None, FusionMode::Bn, FusionMode::NormConv}) {
    if (text == mode_name(mode)) return mode;
  }
  throw Error(flag + " " + text + ": expected auto, none, bn or normconv",
              "auto times each residual block's verified paths on the GPU and keeps the fastest; the others force "
              "one for every block");
}

std::vector<FusionPath> admitted_paths(FusionMode mode) {
  switch (mode) {
    case FusionMode::None: return {FusionPath::Unfused};
    case FusionMode::Bn: return {FusionPath::Bn, FusionPath::BnFold};
    case FusionMode::NormConv: return {FusionPath::NormConv};
    default: return all_fusion_paths();
  }
}

}  // namespace convnets::models
