#include "train/resolve.h"

#include "core/error.h"
#include "models/registry.h"

#include <algorithm>

namespace convnets::train {
namespace {

// DLE's launch.py --platform DGXA100: configs.yml's DGXA100 block for the --model, which is what the built-in
// <arch>-250ep recipes hold (model block: 250 epochs, mixup 0.2; DGXA100: the per-GPU batch). The other
// platforms' batch sizes and worker counts are not carried.
void check_platform(const std::string& platform) {
  if (platform != "DGXA100") {
    throw Error("--platform " + platform + ": convnets carries DLE's DGXA100 configurations only (its built-in "
                "recipes *-250ep), not " + platform + "'s",
                "use --platform DGXA100, or --recipe resnet50-250ep with the --batch-size and --workers your GPU takes");
  }
}

std::string platform_recipe(const nlohmann::json& flags) {
  const std::string arch = flags.value("arch", std::string("resnet50"));
  std::string recipe = arch;
  std::replace(recipe.begin(), recipe.end(), '_', '-');
  recipe += "-250ep";
  const auto known = builtin_recipes();
  if (std::find(known.begin(), known.end(), recipe) == known.end()) {
    throw Error("--platform DGXA100 --model " + arch + ": DLE's configs.yml has no configuration for it",
                "its models: resnet50, resnext101-32x4d, se-resnext101-32x4d; or name a --recipe");
  }
  return recipe;
}

// timm's train.py hands --drop and --drop-connect to create_model; DLE's gpunet_* constructors take **kwargs and
// build from the JSON definition without reading them, so on a GPUNet they change nothing, here as there.
void apply_timm_model_options(const ConfigSources& s, ResolvedConfig& r) {
  if (!s.timm_drop && !s.timm_drop_connect) return;
  if (find_architecture(r.config.arch).gpunet) {
    r.notes.push_back("--drop/--drop-connect are ignored for " + r.config.arch +
                      ", as DLE's GPUNet train.py ignores them (its gpunet_* build from the JSON definition); "
                      "--dropout and --drop-path set them");
    return;
  }
  nlohmann::json options = nlohmann::json::object();
  if (s.timm_drop && !s.flags.contains("dropout")) options["dropout"] = *s.timm_drop;
  if (s.timm_drop_connect && !s.flags.contains("drop_path")) options["drop_path"] = *s.timm_drop_connect;
  if (!options.empty()) apply_json(r.config, options, "flags");
}

}  // namespace

ResolvedConfig resolve_config(const ConfigSources& s) {
  ResolvedConfig r;
  TrainConfig& config = r.config;
  auto* resume = s.resume != nullptr && s.resume->has_value() ? &**s.resume : nullptr;
  if (resume) {
    if (!resume->is_training_checkpoint() && !resume->torch_save) {
      throw Error("--resume " + s.resume_path + " is a weights file, not a training checkpoint",
                  "use --fine-tune to start a new run from weights");
    }
    if (resume->is_training_checkpoint()) apply_json(config, resume->meta.at("config"), s.resume_path + " (config)");
  }
  if (!s.platform.empty()) check_platform(s.platform);
  const std::string recipe_name = s.recipe.empty() && !s.platform.empty() ? platform_recipe(s.flags) : s.recipe;
  nlohmann::json recipe = nlohmann::json::object();
  if (!recipe_name.empty()) {
    recipe = load_recipe(recipe_name);
    apply_json(config, recipe, "--recipe " + recipe_name);
  }
  nlohmann::json overrides = s.flags;
  if (!s.data.empty()) overrides["data"] = s.data;
  if (s.dynamic_loss_scale) overrides["static_loss_scale"] = 0;  // convnets' 0: dynamic
  for (const auto& [field, value] : s.mode_defaults.items())
    if (!overrides.contains(field)) overrides[field] = value;
  if (!s.platform.empty()) {
    // A DGX A100 is 8 GPUs: configs.yml's optimizer batch is 8 x the per-GPU batch, which DLE accumulates to on
    // fewer GPUs (so the LR is 8 GPUs' too); its TF32 block leaves main.py's NCHW, only AMP's sets NHWC.
    if (!overrides.contains("optimizer_batch_size")) overrides["optimizer_batch_size"] = 8 * config.batch_size;
    const std::string precision = overrides.value("precision", config.precision);
    if (!overrides.contains("memory_format") && precision != "amp") overrides["memory_format"] = "nchw";
  }
  // DLE's --lr is absolute: a recipe's per-reference-batch LR does not scale an LR given on the command line
  // unless --lr-reference-batch is given too.
  if (overrides.contains("lr") && !overrides.contains("lr_reference_batch")) overrides["lr_reference_batch"] = 0;
  if (!resume) {
    for (const auto& [field, value] : s.timm_defaults.items())
      if (!overrides.contains(field) && !recipe.contains(field)) overrides[field] = value;
  }
  if (s.enable_distill && !*s.enable_distill) {
    // GPUNet's --enable-distill False: no teacher, whatever else names one.
    overrides["teacher"] = overrides["teacher_checkpoint"] = "";
    overrides["teacher_img_size"] = 0;
    overrides["teacher_two_res"] = overrides["test_teacher"] = false;
  }
  const double planned_epochs = config.epochs;
  apply_json(config, overrides, "flags");
  // A resumed run's --prof limited its training; evaluating its checkpoint covers the whole set unless this
  // command line limits it (DLE's --evaluate --prof N: N batches).
  if (config.evaluate && resume && !overrides.contains("prof")) config.prof = 0;
  if (resume && resume->torch_save) {
    *s.resume = runtime::import_dle_checkpoint(*resume, find_architecture(config.arch));
    const auto& imported = **s.resume;
    r.said.push_back("resume: " + s.resume_path + " is DLE's checkpoint after epoch " +
                     imported.meta.at("epoch").dump() + " (best top-1 " + imported.meta.at("best_top1").dump() +
                     "); its weights, momentum" + (imported.has_ema() ? ", EMA" : "") + " continue as " + config.arch);
  }
  r.evaluation_log = config.evaluate && overrides.contains("raport_file");
  if (!s.flags.contains("warmup")) {
    if (const auto note = fit_warmup(config, planned_epochs); !note.empty()) r.notes.push_back(note);
  }
  apply_timm_model_options(s, r);
  r.optimizer_batch_given = overrides.contains("optimizer_batch_size");
  return r;
}

}  // namespace convnets::train
