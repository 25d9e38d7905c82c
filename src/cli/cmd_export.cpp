// `convnets export`: a checkpoint's network as ONNX, or its weights as safetensors with the reference implementation's key names.
#include "cli/commands.h"
#include "core/json.h"
#include "core/error.h"
#include "export/onnx_export.h"
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
  std::string checkpoint, output, format = "safetensors", key_style = "reference", dtype = "fp32", arch;
  bool ema = false, dynamic_batch = false, fold_bn = false;
  int image_size = 0, opset = 13;
  std::int64_t batch_size = 1;
};

// The classifier's width in a plain weights file: its last parameter (every
// arch registers the classifier last) read from the file.
std::int64_t classes_in_file(const ArchInfo& arch, const train::Checkpoint& ckpt) {
  auto probe = build_model(arch, {});
  const auto key = probe->named_parameters().keys().back();
  for (const auto& [name, t] : ckpt.file.tensors) {
    if ((arch.import_key ? arch.import_key(name) : name) == key) return t.size(0);
  }
  throw Error(ckpt.path + ": no classifier '" + key + "' in it; is it a " + arch.name + "?");
}

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
  const bool trained = ckpt.is_training_checkpoint();
  if (!trained && a.arch.empty()) {
    throw Error("--checkpoint " + a.checkpoint + " is a plain weights file; name its --arch");
  }
  const auto& arch = trained ? architecture_of_checkpoint(ckpt.meta, a.checkpoint) : find_architecture(a.arch);
  if (trained && !a.arch.empty() && !same_architecture(find_architecture(a.arch), ckpt.meta)) {
    throw Error("--arch " + a.arch + " disagrees with --checkpoint " + a.checkpoint + ", a " +
                ckpt.meta.at("arch").get<std::string>());
  }
  if (a.ema && !trained) throw Error("--ema: " + a.checkpoint + " is a plain weights file with no EMA");
  // Through the model, so that what is written is exactly what loads: every
  // tensor present, shapes checked, the arch's order.
  ModelOptions mo;
  mo.num_classes = trained ? ckpt.meta.at("num_classes").get<std::int64_t>() : classes_in_file(arch, ckpt);
  auto model = build_model(arch, mo);
  train::load_weights(*model, ckpt, a.ema ? "ema." : "model.", arch.import_key);
  const Preprocessing pre = trained ? preprocessing_from_json(ckpt.meta.at("preprocessing")) : arch.preprocessing;
  std::map<std::string, std::string> meta{
      {"arch", arch.name},
      {"num_classes", std::to_string(mo.num_classes)},
      {"weights", a.ema ? "ema" : "model"},
      {"preprocessing", dump_json(to_json(pre))},
  };
  if (trained && ckpt.meta.contains("class_names")) meta["class_names"] = dump_json(ckpt.meta.at("class_names"));
  if (arch.from_file) meta["arch_definition"] = to_json(*arch.gpunet).dump();

  if (a.format == "onnx") {
    if (a.key_style != "reference") throw Error("--key-style applies to --format safetensors");
    OnnxOptions o;
    o.image_size = a.image_size > 0 ? a.image_size : pre.input_size;
    o.num_classes = mo.num_classes;
    o.batch = a.batch_size;
    o.dynamic_batch = a.dynamic_batch;
    o.fold_bn = a.fold_bn;
    o.fp16 = a.dtype == "fp16";
    o.opset = a.opset;
    o.metadata = meta;
    const auto nodes = export_onnx(*model, o, a.output);
    std::cout << "export: " << arch.name << " -> " << a.output << " (ONNX opset " << a.opset << ", " << nodes
              << " nodes, input " << (a.dynamic_batch ? std::string("batch") : std::to_string(a.batch_size)) << "x3x"
              << o.image_size << "x" << o.image_size << ", " << a.dtype << (a.fold_bn ? ", BN folded" : "") << ")\n";
    return;
  }
  if (a.fold_bn || a.dynamic_batch) throw Error("--fold-bn and --dynamic-batch apply to --format onnx");
  if (a.key_style == "dle" && !arch.import_key) {
    throw Error("--key-style dle: " + arch.name + " has no DLE naming (DLE's ResNets do; GPUNets already use DLE's names)");
  }
  NamedTensors out;
  for (const auto& [key, t] : state_dict(*model)) {
    auto v = t.contiguous();  // channels-last is a layout; the file holds NCHW
    if (a.dtype == "fp16" && v.is_floating_point()) v = v.to(torch::kHalf);
    out.emplace_back(export_key(key, a.key_style), v);
  }
  meta["format"] = "pt";
  meta["key_style"] = a.key_style == "dle" ? "dle" : arch.key_names;
  save_safetensors(a.output, out, meta);
  std::cout << "export: " << arch.name << " (" << (a.ema ? "EMA" : "model") << " weights, " << out.size()
            << " tensors, " << a.dtype << ", " << meta["key_style"] << " names) -> " << a.output << '\n';
}

}  // namespace

void add_export_command(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  auto* cmd = app.add_subcommand("export", "Export a checkpoint: the network as ONNX, or its weights as safetensors");
  cmd->add_option("--checkpoint", a->checkpoint, "a checkpoint written by `convnets train`, or weights with --arch")
      ->required();
  cmd->add_option("-o,--output", a->output, "the file to write (atomically)")->required();
  cmd->add_option("--format", a->format, "onnx | safetensors")->check(CLI::IsMember({"onnx", "safetensors"}));
  cmd->add_option("--arch", a->arch, "the arch of a plain weights file");
  cmd->add_flag("--dynamic-batch", a->dynamic_batch, "onnx: a symbolic batch dimension (default: static)");
  cmd->add_option("--batch-size", a->batch_size, "onnx: the static batch size (default 1)")->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--fold-bn", a->fold_bn, "onnx: fold each BatchNorm into the preceding conv");
  cmd->add_option("--image-size", a->image_size, "onnx: input height and width (default: the checkpoint's)")
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--opset", a->opset, "onnx: opset version (13 or newer; default 13)");
  cmd->add_option("--key-style", a->key_style,
                  "reference: torchvision's names for ResNets, DLE's for GPUNets | dle: DLE's ResNet names (layers.N)")
      ->check(CLI::IsMember({"reference", "dle"}));
  cmd->add_option("--dtype", a->dtype, "fp32 | fp16 (weights; for onnx the whole graph)")->check(CLI::IsMember({"fp32", "fp16"}));
  cmd->add_flag("--ema", a->ema, "export the checkpoint's EMA weights");
  cmd->callback([a] { run(*a); });
  cmd->footer(
      "Loading the file in PyTorch (torchvision ResNets; DLE's GPUNet builder for GPUNets):\n"
      "  from safetensors.torch import load_file\n"
      "  model = torchvision.models.resnet50(num_classes=N)\n"
      "  model.load_state_dict(load_file(\"model.safetensors\"))");
}

}  // namespace convnets::cli
