// The model registry: every architecture convnets builds by name, with its preprocessing and reference.
#pragma once

#include "models/network.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

namespace convnets {

struct ArchInfo {
  std::string name;
  std::string description;
  Preprocessing preprocessing;
  // Reference implementation whose state_dict this arch reproduces, named as
  // in shared/reference/models/<reference>.keys.json (e.g. "tv-resnet50");
  // empty for convnets' own small-image archs, which have no published weights.
  std::string reference;
  std::function<Network(const ModelOptions&)> build;
  // Maps a key of a foreign checkpoint (e.g. DLE's `layers.0.`) to ours.
  std::function<std::string(const std::string&)> import_key;
};

const std::vector<ArchInfo>& architectures();
std::vector<std::string> architecture_names();

// Throws convnets::Error listing the valid names when `name` is unknown.
const ArchInfo& find_architecture(const std::string& name);

// Preprocessing as checkpoints and `convnets models --json` store it:
// input_size, crop_ratio, mean, std, interpolation.
nlohmann::ordered_json to_json(const Preprocessing& p);
Preprocessing preprocessing_from_json(const nlohmann::json& j);

// Validates the options (num_classes >= 1) and builds.
Network build_model(const ArchInfo& arch, const ModelOptions& options);

}  // namespace convnets
