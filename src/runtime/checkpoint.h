// Training checkpoints: model, EMA, optimizer and loss-scale state plus run metadata in one safetensors file.
#pragma once

#include "io/safetensors.h"

#include <torch/nn/module.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>

namespace convnets {
struct ArchInfo;
}

namespace convnets::runtime {

// Tensor names: "model.<key>", "ema.<key>", "optimizer.momentum.<param>",
// "loss_scale.*", "rng.torch_cpu"; metadata key "convnets" holds the JSON
// (format, arch, num_classes, class_names, preprocessing, config, epoch,
// step, step_in_epoch, best_top1, seed, ...). Every other metadata key is
// left for tools.
inline constexpr const char* kCheckpointFormat = "convnets-checkpoint/1";

struct Checkpoint {
  TensorFile file;
  nlohmann::json meta;  // empty object for a plain weights file
  std::string path;

  bool is_training_checkpoint() const { return meta.contains("format"); }
  // The tensors under `prefix` with the prefix stripped ("model." -> state_dict).
  // A plain weights file (no metadata) is returned whole for "model.".
  TensorFile section(const std::string& prefix) const;
};

// Throws Error naming the file for anything unreadable or malformed,
// including metadata that is not JSON or names another format.
Checkpoint load_checkpoint(const std::string& path);

// The classifier's width in a plain weights file for `arch`: its last
// parameter (every arch registers the classifier last), read from the file.
// Throws Error naming the file when it has no such tensor.
std::int64_t classes_in_weights(const ArchInfo& arch, const Checkpoint& ckpt);

// Strict load of the `prefix` section ("model." or "ema.") into `model`; an
// empty section or any mismatch throws Error naming the file.
void load_weights(torch::nn::Module& model, const Checkpoint& ckpt, const std::string& prefix,
                  const std::function<std::string(const std::string&)>& import_key = {});

// Atomic (temp file, fsync, rename): an interrupted save leaves the old file.
void save_checkpoint(const std::string& path, const NamedTensors& tensors, const nlohmann::json& meta);

}  // namespace convnets::runtime
