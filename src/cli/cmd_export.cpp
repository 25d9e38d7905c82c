// `convnets export`: a checkpoint's weights as a plain safetensors file with the reference implementation's key names.
#include "cli/commands.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "io/state_dict.h"
#include "models/registry.h"
#include "models/resnet.h"
#include "train/checkpoint.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <iostream>
#include <memory>

namespace convnets::cli {
namespace {

struct ExportArgs {
  std::string checkpoint, output, format = "safetensors", key_style = "reference", dtype = "fp32";
  bool ema = false;
};

// What the file's weights are named after. torchvision and DLE's GPUNet are
// our own names; DLE's ResNets keep the four stages in `layers.{s}`.
std::string export_key(const std::string& key, const std::string& style) {
  if (style != "dle") return key;
  if (key.rfind("layer", 0) == 0 && key.size() > 6 && std::isdigit(static_cast<unsigned char>(key[5])) &&
      key[6] == '.') {
    return "layers." + std::to_string(key[5] - '1') + key.substr(6);
  }
  return key;
}

void run(const ExportArgs& a) {
  const auto ckpt = train::load_checkpoint(a.checkpoint);
  if (!ckpt.is_training_checkpoint()) {
    throw Error("--checkpoint " + a.checkpoint + " is already a plain weights file",
                "export reads checkpoints written by `convnets train`");
  }
  const auto& arch = architecture_of_checkpoint(ckpt.meta, a.checkpoint);
  if (a.key_style == "dle" && !arch.import_key) {
    throw Error("--key-style dle: " + arch.name + " has no DLE naming (DLE's ResNets do; GPUNets already use DLE's names)");
  }
  // Through the model, so that what is written is exactly what loads: every
  // tensor present, shapes checked, the arch's order.
  ModelOptions mo;
  mo.num_classes = ckpt.meta.at("num_classes").get<std::int64_t>();
  auto model = build_model(arch, mo);
  train::load_weights(*model, ckpt, a.ema ? "ema." : "model.", arch.import_key);
  NamedTensors out;
  for (const auto& [key, t] : state_dict(*model)) {
    auto v = t.contiguous();  // channels-last is a layout; the file holds NCHW
    if (a.dtype == "fp16" && v.is_floating_point()) v = v.to(torch::kHalf);
    out.emplace_back(export_key(key, a.key_style), v);
  }
  std::map<std::string, std::string> meta{
      {"format", "pt"},
      {"arch", arch.name},
      {"num_classes", std::to_string(mo.num_classes)},
      {"weights", a.ema ? "ema" : "model"},
      {"key_style", a.key_style == "dle" ? "dle" : (arch.gpunet ? "dle-gpunet" : "torchvision")},
      {"preprocessing", to_json(preprocessing_from_json(ckpt.meta.at("preprocessing"))).dump()},
  };
  if (ckpt.meta.contains("class_names")) meta["class_names"] = ckpt.meta.at("class_names").dump();
  if (arch.from_file) meta["arch_definition"] = to_json(*arch.gpunet).dump();
  save_safetensors(a.output, out, meta);
  std::cout << "export: " << arch.name << " (" << (a.ema ? "EMA" : "model") << " weights, " << out.size()
            << " tensors, " << a.dtype << ", " << meta["key_style"] << " names) -> " << a.output << '\n';
}

}  // namespace

void add_export_command(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  auto* cmd = app.add_subcommand("export", "Write a checkpoint's weights for other tools (safetensors)");
  cmd->add_option("--checkpoint", a->checkpoint, "a checkpoint written by `convnets train`")->required();
  cmd->add_option("-o,--output", a->output, "the file to write (atomically)")->required();
  cmd->add_option("--format", a->format, "safetensors (ONNX is not built yet)")
      ->check(CLI::IsMember({"safetensors"}));
  cmd->add_option("--key-style", a->key_style,
                  "reference: torchvision's names for ResNets, DLE's for GPUNets | dle: DLE's ResNet names (layers.N)")
      ->check(CLI::IsMember({"reference", "dle"}));
  cmd->add_option("--dtype", a->dtype, "fp32 | fp16 (floating-point tensors)")->check(CLI::IsMember({"fp32", "fp16"}));
  cmd->add_flag("--ema", a->ema, "export the checkpoint's EMA weights");
  cmd->callback([a] { run(*a); });
  cmd->footer(
      "Loading the file in PyTorch (torchvision ResNets; DLE's GPUNet builder for GPUNets):\n"
      "  from safetensors.torch import load_file\n"
      "  model = torchvision.models.resnet50(num_classes=N)\n"
      "  model.load_state_dict(load_file(\"model.safetensors\"))");
}

}  // namespace convnets::cli
