// A run's configuration from its sources, in the precedence DLE's and timm's command lines give them: the resumed checkpoint's, the recipe (or --platform's), the flags, --mode's preset, timm's implied defaults, GPUNet's --enable-distill.
#pragma once

#include "runtime/checkpoint.h"
#include "train/config.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace convnets::train {

struct ConfigSources {
  // The run --resume continues (its config comes first), or none. A DLE checkpoint.pth.tar is read once the
  // configuration names its arch (DLE's main.py keeps none): resolve_config replaces it with that import.
  std::optional<runtime::Checkpoint>* resume = nullptr;
  std::string resume_path;  // as messages name it
  std::string recipe;       // --recipe: a built-in name or a JSON file
  std::string platform;     // DLE launch.py's --platform (DGXA100)
  std::string data;         // DATA
  nlohmann::json flags = nlohmann::json::object();  // the fields the command line set, each of its field's type
  bool dynamic_loss_scale = false;  // DLE's --dynamic-loss-scale: wins over --static-loss-scale
  nlohmann::json mode_defaults = nlohmann::json::object();  // --mode's preset: the fields no flag set
  // timm's train.py defaults that its flags imply (--sched, --model-ema): the fields no resumed run, recipe or flag
  // set.
  nlohmann::json timm_defaults = nlohmann::json::object();
  std::optional<bool> enable_distill;                  // GPUNet's --enable-distill True|False
  std::optional<double> timm_drop, timm_drop_connect;  // timm's --drop, --drop-connect
};

struct ResolvedConfig {
  TrainConfig config;
  bool optimizer_batch_given = false;  // --optimizer-batch-size among the flags (train/world_change.h)
  bool evaluation_log = false;         // --evaluate with --raport-file: DLE's benchmark log
  std::vector<std::string> said;       // lines for stdout ("resume: ...")
  std::vector<std::string> notes;      // lines for stderr, each after "convnets: note: "
};

// Throws Error naming the source (the checkpoint, the recipe, the flag) of any value that does not fit.
ResolvedConfig resolve_config(const ConfigSources& sources);

}  // namespace convnets::train
