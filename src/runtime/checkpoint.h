// Training checkpoints: model, EMA, optimizer and loss-scale state plus run metadata in one safetensors file.
#pragma once

#include "io/safetensors.h"
#include "io/state_dict.h"

#include <torch/nn/module.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace convnets {
struct ArchInfo;
struct KeyLayout;
struct TorchSaveContents;
}

namespace convnets::runtime {

// Tensor names: "model.<key>", "ema.<key>", "optimizer.momentum.<param>",
// "loss_scale.*", "rng.torch_cpu"; metadata key "convnets" holds the JSON
// (format, arch, num_classes, class_names, preprocessing, config, epoch,
// step, step_in_epoch, best_top1, seed, ...). Every other metadata key is
// left for tools.
inline constexpr const char* kCheckpointFormat = "convnets-checkpoint/1";
// The record's "checksums" value: save_checkpoint summed every tensor's bytes and header entry (io/safetensors.h).
inline constexpr const char* kCheckpointChecksums = "crc32c bytes and header";

struct Checkpoint {
  TensorFile file;
  nlohmann::json meta;  // empty object for a plain weights file
  std::string path;
  // A torch.save file's whole contents (its EMA and optimizer state beside
  // the weights in `file`); null for safetensors files.
  std::shared_ptr<const TorchSaveContents> torch_save;
  // --key-layout: how a plain weights file names its tensors (KeyLayout in
  // models/registry.h), or "auto" to detect it from the names.
  std::string key_layout = "auto";

  bool is_training_checkpoint() const { return meta.contains("format"); }
  // The tensors under `prefix` with the prefix stripped ("model." -> state_dict).
  // A plain weights file (no metadata) is returned whole for "model.", and a
  // torch.save file's state_dict_ema for "ema.".
  TensorFile section(const std::string& prefix) const;
  bool has_ema() const;  // whether section("ema.") holds any tensor
};

// Throws Error naming the file for anything unreadable or malformed,
// including metadata that is not JSON or names another format. `key_layout`
// (options::key_layout, checked here) is kept as the checkpoint's.
Checkpoint load_checkpoint(const std::string& path, const std::string& key_layout = "auto");

// A DLE main.py training checkpoint (checkpoint.pth.tar: epoch, best_prec1,
// state_dict, optimizer, state_dict_ema where --use-ema) as the convnets
// training checkpoint of `arch` that --resume continues: weights under
// "model." and "ema.", torch.optim.SGD's momentum buffers (or, for DLE's
// --optimizer rmsprop, torch.optim.RMSprop's square_avg and momentum, the
// config's optimizer then rmsprop) under each parameter's convnets name,
// "epoch" the next epoch to train (DLE's too) and
// "best_top1" from best_prec1. DLE numbers its parameters through its two
// param groups, the parameters whose names hold "bn" and then the rest
// (image_classification/optimizers.py), or through one group with
// --bn-weight-decay; both are read. Throws Error naming the file for anything
// else: no epoch or optimizer (a weights file), another optimizer's state,
// groups that are not DLE's.
Checkpoint import_dle_checkpoint(const Checkpoint& file, const ArchInfo& arch);

// The classifier's width in a plain weights file for `arch`: its last
// parameter (every arch registers the classifier last), read from the file.
// Throws Error naming the file when it has no such tensor.
std::int64_t classes_in_weights(const ArchInfo& arch, const Checkpoint& ckpt);

// The file's key layout for `arch`: the one ckpt.key_layout names, or under
// "auto" the arch's layout under which the most of `tensors` are among
// `model_keys` (its own names on a tie). Throws Error naming --key-layout and
// the arch's layouts for a name it has none of. `tried`, when given, gets one
// line per layout: how many of the file's tensors it matched.
const KeyLayout& key_layout_of(const Checkpoint& ckpt, const ArchInfo& arch, const NamedTensors& tensors,
                               const std::vector<std::string>& model_keys, std::string* tried = nullptr);

// Strict load of the `prefix` section ("model." or "ema.") into `model`, its
// keys read in the layout key_layout_of picks; an empty section or any
// mismatch throws Error naming the file, the first unmatched keys and, where
// the layout was detected, how each of the arch's layouts matched.
void load_weights(torch::nn::Module& model, const Checkpoint& ckpt, const std::string& prefix, const ArchInfo& arch);

// The same without `strict`: what fits is copied, the report says the rest
// (--fine-tune onto another class count).
LoadReport load_fitting_weights(torch::nn::Module& model, const Checkpoint& ckpt, const std::string& prefix,
                                const ArchInfo& arch);

// Atomic (temp file, fsync, rename): an interrupted save leaves the old file.
void save_checkpoint(const std::string& path, const NamedTensors& tensors, const nlohmann::json& meta);

}  // namespace convnets::runtime
