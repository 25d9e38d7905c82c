// The model registry: every architecture convnets builds by name, with its preprocessing and reference.
#pragma once

#include "models/gpunet.h"
#include "models/network.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

namespace convnets {

// One naming of an arch's state-dict keys in the files users bring:
// torchvision's (timm's ResNets are the same), DLE's ResNets with their stages
// in `layers.N`, DLE's GPUNet names, timm's EfficientNets. `map` takes a
// file's key, DataParallel's "module." already dropped, to the model's; empty:
// the file uses the model's own names.
struct KeyLayout {
  std::vector<std::string> names;  // as --key-layout takes them
  std::function<std::string(const std::string&)> map;
};

struct ArchInfo {
  std::string name;
  std::string description;
  Preprocessing preprocessing;
  // Reference implementation whose state_dict this arch reproduces, named as
  // in shared/reference/models/<reference>.keys.json (e.g. "tv-resnet50");
  // empty for convnets' own small-image archs, which have no published weights.
  std::string reference;
  // Whose naming its state_dict keys follow, as exports label them:
  // torchvision (ResNets), dle-gpunet (GPUNets), timm (the EfficientNets).
  std::string key_names = "torchvision";
  std::function<Network(const ModelOptions&)> build;
  // The namings its weights files come in, its own first; --key-layout auto
  // picks the one under which most of a file's tensors are the model's.
  std::vector<KeyLayout> key_layouts;
  // GPUNets: the layer list the network is built from; null for the ResNets.
  std::shared_ptr<const GpunetDefinition> gpunet;
  // Set for an arch read from a user's JSON file (`--arch path/model.json`):
  // checkpoints then carry the definition itself, not just the name.
  bool from_file = false;
  // The rates a run gets when it names none (ModelOptions' negative values):
  // what a config or report then shows.
  double dropout = 0, drop_path = 0;
};

const std::vector<ArchInfo>& architectures();
std::vector<std::string> architecture_names();

// A registered name, or a path ending in ".json" to a GPUNet definition
// (read, validated and kept for the process's lifetime). Throws
// convnets::Error listing the valid names when `name` is unknown. DLE's and
// timm's spellings of a name are read too (models/arch_names.h).
const ArchInfo& find_architecture(const std::string& name);

// The layout of `arch` that --key-layout `name` means; null when it has none
// of that name ("auto" is not one).
const KeyLayout* find_key_layout(const ArchInfo& arch, const std::string& name);

// An arch built from a GPUNet definition held in memory (a checkpoint's
// "arch_definition"), named `name`; `source` names it in errors.
const ArchInfo& architecture_from_definition(const std::string& name, const nlohmann::json& definition,
                                             const std::string& source);

// What a checkpoint records of its arch: {"arch": name} and, for a user's
// JSON file, "arch_definition" so the checkpoint rebuilds without the file.
nlohmann::json architecture_meta(const ArchInfo& arch);
// The arch a checkpoint's metadata describes (see architecture_meta).
const ArchInfo& architecture_of_checkpoint(const nlohmann::json& meta, const std::string& source);
// Whether `meta` (a checkpoint's) describes the same network as `arch`: the
// same name, or for GPUNets the same layer list under any name.
bool same_architecture(const ArchInfo& arch, const nlohmann::json& meta);

// Preprocessing as checkpoints and `convnets models --json` store it:
// input_size, crop_ratio, mean, std, interpolation.
nlohmann::ordered_json to_json(const Preprocessing& p);
Preprocessing preprocessing_from_json(const nlohmann::json& j);

// Validates the options (num_classes >= 1) and builds.
Network build_model(const ArchInfo& arch, const ModelOptions& options);

// One row of `convnets models`: name, description, num_classes, params,
// GMACs at its input size, its preprocessing and reference, for `net` built
// from `arch`.
nlohmann::ordered_json describe_architecture(const ArchInfo& arch, NetworkImpl& net, int64_t num_classes);
// Every registered arch built with `options`, described.
std::vector<nlohmann::ordered_json> describe_architectures(const ModelOptions& options);

}  // namespace convnets
