// Flags several commands take with the same spelling and check: --precision and --key-layout.
#include "cli/commands.h"
#include "core/error.h"
#include "core/options.h"
#include "deploy/graph_engine.h"

#include <CLI/CLI.hpp>

#include <cctype>
#include <string>

namespace convnets::cli {

std::string lower_case(std::string value) {
  for (auto& c : value) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return value;
}

CLI::Option* add_precision_option(CLI::App* cmd, std::string& target) {
  return cmd->add_option("--precision", target, options::precision.listed() + " (any case: DLE's AMP, FP32)")
      ->transform([](std::string value) {
        value = lower_case(std::move(value));
        if (value == "fp16") {
          throw CLI::ValidationError("FP16 (pure fp16 weights) is not offered; --precision amp runs fp16 "
                                     "compute with fp32 weights, DLE's AMP");
        }
        if (!options::precision.allows(value)) {
          throw CLI::ValidationError(value + ": expected " + options::precision.listed());
        }
        return value;
      });
}

void add_dle_model_refusals(CLI::App* cmd) {
  cmd->add_flag_callback(
      "--pretrained",
      [] {
        throw Error("--pretrained: convnets downloads nothing (DLE's flag fetches NGC's weights)",
                    "download the weights file yourself and pass it with --pretrained-from-file FILE");
      },
      "DLE: NGC's pretrained weights, downloaded; refused (convnets downloads nothing): --pretrained-from-file");
  cmd->add_flag_callback(
      "--trt",
      [] {
        throw Error("--trt: convnets builds no TensorRT-ready variant of the network (DLE's SE blocks for TensorRT)",
                    "export the trained network with `convnets export --format onnx` (or triton) for TensorRT");
      },
      "DLE: the SE blocks' TensorRT form; refused: `convnets export --format onnx`");
}

CLI::Option* add_key_layout_option(CLI::App* cmd, std::string& target) {
  return cmd
      ->add_option("--key-layout", target,
                   "how a plain weights file names its tensors: " + options::key_layout.listed() +
                       " (auto: the arch's layout most of them fit; torchvision = timm's ResNets; dle: DLE's "
                       "ResNets, layers.N; gpunet: DLE's GPUNets)")
      ->check(CLI::IsMember(options::key_layout.values));
}

void add_graph_options(CLI::App* cmd, bool& cuda_graph, std::vector<std::int64_t>& sizes, double& memory_mb,
                       bool& fused_conv) {
  cmd->add_flag_callback("--no-cuda-graph", [&cuda_graph] { cuda_graph = false; },
                         "on CUDA, run each forward pass eagerly instead of replaying a CUDA graph of its batch size");
  cmd->add_option_function<std::string>(
      "--graph-batch-sizes", [&sizes](const std::string& text) { sizes = deploy::parse_graph_sizes(text); },
      "on CUDA, the batch sizes to capture a CUDA graph of (each on first use); a batch is padded up to the "
      "smallest that holds it (default: each new batch size captured on first use, up to --graph-memory-mb)");
  cmd->add_option("--graph-memory-mb", memory_mb, "on CUDA, the CUDA graphs' memory together, in MiB")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag_callback("--no-fused-conv", [&fused_conv] { fused_conv = false; },
                         "on CUDA graphs with --fold-bn, keep each conv, its bias and activation as separate kernels "
                         "instead of one cuDNN graph");
}

}  // namespace convnets::cli
