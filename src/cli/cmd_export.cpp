// `convnets export`: a checkpoint's network as ONNX or as a Triton model repository entry, or its weights as safetensors with the reference implementation's key names.
#include "cli/commands.h"
#include "codec/image.h"
#include "core/options.h"
#include "deploy/export.h"

#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>

namespace convnets::cli {

void add_export_command(CLI::App& app) {
  auto a = std::make_shared<deploy::ExportOptions>();
  auto* cmd = app.add_subcommand(
      "export", "Export a checkpoint: the network as ONNX or as a Triton model repository, or its weights as safetensors");
  cmd->add_option("--checkpoint", a->checkpoint, "a checkpoint written by `convnets train`, or weights with --arch")
      ->required();
  cmd->add_option("-o,--output", a->output, "the file to write (atomically); triton: the repository folder")->required();
  cmd->add_option("--format", a->format, "onnx | safetensors | triton (a Triton Inference Server model repository entry)")
      ->check(CLI::IsMember({"onnx", "safetensors", "triton"}));
  cmd->add_option("--arch", a->arch, "the arch of a plain weights file");
  add_key_layout_option(cmd, a->key_layout);
  cmd->add_flag("--dynamic-batch", a->dynamic_batch, "onnx: a symbolic batch dimension (default: static)");
  cmd->add_option("--batch-size", a->batch_size, "onnx: the static batch size (default 1)")->check(CLI::Range(1, 1 << 20));
  add_fold_bn_option(cmd, a->fold_bn, "onnx, triton: ");
  cmd->add_option("--image-size", a->image_size, "onnx, triton: input height and width (default: the checkpoint's)")
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--opset", a->opset, "onnx, triton: opset version (13 or newer; default 13)");
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
  cmd->add_option("--calibration-method", a->calibration_method,
                                 "int8: minmax | percentile (99.99% of |x|; default) | entropy (TensorRT's KL)")
                     ->check(CLI::IsMember(options::calibration_method.values));
  cmd->add_option("--int8-activations", a->activations,
                               "int8: uint8 (asymmetric, ReLU folded: ONNX Runtime's and OpenVINO's CPU form; default) "
                               "| int8 (symmetric: TensorRT's explicit quantization)")
                   ->check(CLI::IsMember(options::int8_activations.values));
  cmd->add_option("--int8-silu", a->silu,
                               "int8: ops (a SiLU quantized as its Sigmoid and Mul: ONNX Runtime's integer kernels; "
                               "default) | float (in float after its conv, quantized once: OpenVINO fuses it)")
                   ->check(CLI::IsMember(options::int8_silu.values));
  cmd->add_flag("--int8-reduce-range", a->reduce_range,
                "int8: 7-bit weights, for ONNX Runtime on x86 CPUs without VNNI (its U8S8 kernels saturate with 8-bit weights)");
  cmd->add_option("--calibration-batch-size", a->calibration_batch, "int8: calibration batch (default 32)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--device", a->device, "int8: where calibration runs: cpu (default) or cuda");
  cmd->add_option("--workers", a->workers, "int8: calibration data loader threads (default 2)")->check(CLI::Range(0, 256));
  // Triton: DLE's deployer's spellings (its triton/ folders' deployer.py).
  auto& t = a->triton;
  cmd->add_option("--model-name", t.name, "triton: the model's name and folder (default: the arch)");
  add_batching_options(cmd, t.batching, "triton: ");
  cmd->add_option("--instance-kind", t.instance_kind, "triton: gpu (default) | cpu")
      ->check(CLI::IsMember({"gpu", "cpu"}));
  cmd->add_option("--backend", t.backend,
                  "triton: onnxruntime (default) | openvino: the Triton backend that runs 1/model.onnx (openvino: "
                  "--instance-kind cpu)")
      ->check(CLI::IsMember({"onnxruntime", "openvino"}));
  cmd->add_option("--backend-accelerator", t.accelerator,
                  "triton: none (default) | trt: ONNX Runtime's TensorRT execution provider")
      ->check(CLI::IsMember({"none", "trt"}));
  cmd->add_option("--trt-precision", t.trt_precision, "triton: TensorRT's precision with trt: fp16 (default) | fp32")
      ->check(CLI::IsMember({"fp16", "fp32"}));
  cmd->add_option("--preprocessing", t.preprocessing,
                  "triton: dali (default): also NAME_preprocessing, the eval transform in Triton's DALI backend, and "
                  "NAME_ensemble, encoded images in and logits out | none")
      ->check(CLI::IsMember({"dali", "none"}));
  cmd->add_option("--max-image-pixels", a->max_image_pixels, codec::kMaxImagePixelsHelp)->check(CLI::NonNegativeNumber);
  cmd->callback([a] {
    const auto say = [](const std::string& line) { std::cout << line << '\n' << std::flush; };
    say(deploy::export_checkpoint(*a, say));
  });
  cmd->footer(
      "Loading the file in PyTorch (torchvision ResNets; DLE's GPUNet builder for GPUNets):\n"
      "  from safetensors.torch import load_file\n"
      "  model = torchvision.models.resnet50(num_classes=N)\n"
      "  model.load_state_dict(load_file(\"model.safetensors\"))");
}

}  // namespace convnets::cli
