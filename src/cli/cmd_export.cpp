// `convnets export`: a checkpoint's network as ONNX, or its weights as safetensors with the reference implementation's key names.
#include "cli/commands.h"
#include "codec/image.h"
#include "core/error.h"
#include "core/json.h"
#include "data/dataset.h"
#include "export/onnx_export.h"
#include "io/safetensors.h"
#include "io/state_dict.h"
#include "models/registry.h"
#include "models/resnet.h"
#include "quant/eager.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"

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
  // INT8
  bool int8 = false, reduce_range = false;
  std::string calibration, calibration_method = "percentile", activations = "uint8", device = "cpu";
  std::int64_t calibration_images = 512, calibration_batch = 32, max_image_pixels = codec::kDefaultMaxImagePixels;
  int workers = 2;
  bool method_given = false, activations_given = false;
};

// The INT8 ranges: a QAT checkpoint's own, or calibrated on --calibration
// images through the checkpoint's eval preprocessing.
quant::Plan int8_plan(const ExportArgs& a, NetworkImpl& model, const train::Checkpoint& ckpt, const Preprocessing& pre) {
  if (ckpt.meta.contains("quantization")) {
    if (!a.calibration.empty()) {
      throw Error("--calibration: " + a.checkpoint + " was trained with --qat and carries its ranges; "
                  "calibrating again would discard what QAT learned with them",
                  "export it without --calibration");
    }
    auto plan = quant::plan_from_json(ckpt.meta.at("quantization"), a.checkpoint);
    if (a.method_given || (a.reduce_range && !plan.reduce_range) ||
        (a.activations_given && quant::parse_activations(a.activations, "--int8-activations") != plan.activations)) {
      throw Error("--calibration-method/--int8-activations/--int8-reduce-range: " + a.checkpoint +
                  " was trained with --qat with " + quant::to_string(plan.activations) + " activations" +
                  (plan.reduce_range ? ", 7-bit weights" : "") + ", calibrated by " + quant::to_string(plan.method),
                  "export it without those flags: its graph is the one it was trained as");
    }
    return plan;
  }
  if (a.calibration.empty()) {
    throw Error("--int8 needs calibration images: add --calibration DATA (a few hundred training images; "
                "a folder, list file or IDX folder as for train)");
  }
  const auto activations = quant::parse_activations(a.activations, "--int8-activations");
  const auto method = quant::parse_method(a.calibration_method, "--calibration-method");
  const auto rt = train::resolve_runtime(a.device, "fp32", "nchw");
  train::prepare_model(model, rt);
  const auto ds = data::spread(data::open_dataset(a.calibration, "train"), static_cast<std::size_t>(a.calibration_images));
  data::LoaderOptions lo;
  lo.batch_size = a.calibration_batch;
  lo.workers = a.workers;
  const auto loader = train::make_eval_loader(ds, pre, a.max_image_pixels, lo);
  std::cout << "export: calibrating on " << ds->description() << " (" << quant::to_string(method) << ", "
            << quant::to_string(activations) << " activations)\n";
  auto plan = quant::calibrate(model, *loader, rt, pre, activations, method, a.reduce_range, "calibration");
  model.to(torch::kCPU);
  return plan;
}

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
    std::optional<quant::Plan> plan;
    if (a.int8) {
      plan = int8_plan(a, *model, ckpt, pre);
      meta["quantization"] = dump_json(quant::to_json(*plan));
    } else if (!a.calibration.empty()) {
      throw Error("--calibration applies to --int8");
    }
    OnnxOptions o;
    o.int8 = plan ? &*plan : nullptr;
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
              << o.image_size << "x" << o.image_size << ", "
              << (plan ? "INT8 QDQ, " + quant::to_string(plan->activations) + " activations, " +
                             std::to_string(plan->points.size()) + " quantized tensors, BN folded"
                       : a.dtype + (a.fold_bn ? ", BN folded" : ""))
              << ")\n";
    return;
  }
  if (a.int8) throw Error("--int8 applies to --format onnx");
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
  cmd->add_flag("--int8", a->int8,
                "onnx: an INT8 QDQ graph (per-channel int8 weights, per-tensor activations, BN folded); needs "
                "--calibration unless the checkpoint was trained with --qat");
  cmd->add_option("--calibration", a->calibration,
                  "int8: images to calibrate the activation ranges on (folder, list file, IDX folder; its training "
                  "split), read with the checkpoint's eval preprocessing");
  cmd->add_option("--calibration-images", a->calibration_images, "int8: images used, spread over the data (default 512)")
      ->check(CLI::Range(1, 1 << 24));
  auto* method = cmd->add_option("--calibration-method", a->calibration_method,
                                 "int8: minmax | percentile (99.99% of |x|; default) | entropy (TensorRT's KL)")
                     ->check(CLI::IsMember({"minmax", "percentile", "entropy"}));
  auto* acts = cmd->add_option("--int8-activations", a->activations,
                               "int8: uint8 (asymmetric, ReLU folded: ONNX Runtime's and OpenVINO's CPU form; default) "
                               "| int8 (symmetric: TensorRT's explicit quantization)")
                   ->check(CLI::IsMember({"uint8", "int8"}));
  cmd->add_flag("--int8-reduce-range", a->reduce_range,
                "int8: 7-bit weights, for ONNX Runtime on x86 CPUs without VNNI (its U8S8 kernels saturate with 8-bit weights)");
  cmd->add_option("--calibration-batch-size", a->calibration_batch, "int8: calibration batch (default 32)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--device", a->device, "int8: where calibration runs: cpu (default) or cuda[:N]");
  cmd->add_option("--workers", a->workers, "int8: calibration data loader threads (default 2)")->check(CLI::Range(0, 256));
  cmd->add_option("--max-image-pixels", a->max_image_pixels, codec::kMaxImagePixelsHelp)->check(CLI::NonNegativeNumber);
  cmd->parse_complete_callback([a, method, acts] {
    a->method_given = method->count() > 0;
    a->activations_given = acts->count() > 0;
  });
  cmd->callback([a] { run(*a); });
  cmd->footer(
      "Loading the file in PyTorch (torchvision ResNets; DLE's GPUNet builder for GPUNets):\n"
      "  from safetensors.torch import load_file\n"
      "  model = torchvision.models.resnet50(num_classes=N)\n"
      "  model.load_state_dict(load_file(\"model.safetensors\"))");
}

}  // namespace convnets::cli
