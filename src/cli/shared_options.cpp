// Flags several commands take with the same spelling and check: --precision, --key-layout, the CUDA graphs' and Triton's dynamic batching.
#include "cli/commands.h"
#include "core/error.h"
#include "core/options.h"
#include "deploy/engine.h"
#include "deploy/graph_engine.h"
#include "deploy/inference_options.h"
#include "deploy/triton_config.h"

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

CLI::Option* add_fold_bn_option(CLI::App* cmd, bool& target, const std::string& prefix) {
  return cmd->add_flag("--fold-bn", target,
                       prefix + "fold each BatchNorm into the preceding conv (faster; the same results to rounding)");
}

void add_inference_options(CLI::App* cmd, deploy::InferenceOptions& io) {
  cmd->add_option("--device", io.device, options::device.listed())->check(CLI::IsMember(options::device.values));
  add_precision_option(cmd, io.precision);
  add_key_layout_option(cmd, io.key_layout);
  cmd->add_option("--memory-format", io.memory_format, options::memory_format.listed())
      ->check(CLI::IsMember(options::memory_format.values));
  cmd->add_option("--engine", io.engine, deploy::kEngineHelp)->check(CLI::IsMember(options::engine.values));
  cmd->add_flag("--ema", io.ema, "the checkpoint's EMA weights");
  add_fold_bn_option(cmd, io.fold_bn);
  add_graph_options(cmd, io.cuda_graph, io.graph_batch_sizes, io.graph_memory_mb, io.fused_conv);
  cmd->add_flag("--float", io.as_float,
                "a QAT checkpoint: its float weights (default: the INT8 network: INT8 kernels with --engine openvino, "
                "fake-quantized with torch)");
}

void add_batching_options(CLI::App* cmd, deploy::DynamicBatching& b, const std::string& prefix) {
  cmd->add_option("--max-batch-size", b.max_batch_size, prefix + "rows per forward pass; a request may hold no more")
      ->capture_default_str();
  cmd->add_option("--max-queue-delay-us", b.max_queue_delay_us,
                  prefix + "how long the oldest queued request waits for others to fill its batch")
      ->capture_default_str();
  cmd->add_option("--preferred-batch-sizes", b.preferred_batch_sizes,
                  prefix + "the largest of these batch sizes that the queue can fill leaves at once, as Triton's "
                           "(default: none, up to --max-batch-size)")
      ->delimiter(',');
  cmd->add_option("--instances,--engine-count-per-device", b.instances,
                  prefix + "forward passes run at once (instance_group count per device)")
      ->capture_default_str();
  cmd->add_option("--max-queue-size", b.max_queue_size,
                  prefix + "requests that may wait; one more is answered 503 at once")
      ->capture_default_str();
}

}  // namespace convnets::cli
