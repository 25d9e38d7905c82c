// How a trained network is loaded for inference (weights, device, precision, engine, CUDA graphs): the options classify, eval, serve and bench share, without the network's headers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace convnets::deploy {

struct InferenceOptions {
  bool ema = false;  // the checkpoint's EMA weights
  std::string device = "auto", precision = "fp32", memory_format = "nhwc";
  bool fold_bn = false;
  int image_size = 0;  // the input's side; 0: the checkpoint's
  // torch, openvino or auto (deploy/engine.h: OpenVINO on the CPU where built).
  std::string engine = "auto";
  // A QAT checkpoint runs as the INT8 network it exports to (fake-quantized
  // with its ranges, as its validation did) unless `as_float` asks for its
  // float weights.
  bool as_float = false;
  // A plain weights file needs its arch; for a training checkpoint a given
  // arch must agree with the one it records.
  std::string arch;
  // A plain weights file's classifier width (required for one); a training
  // checkpoint records its own.
  std::optional<std::int64_t> num_classes;
  // How a plain weights file names its tensors (options::key_layout): auto
  // detects it among the arch's layouts.
  std::string key_layout = "auto";
  // The torch engine on CUDA replays a captured CUDA graph per batch size (deploy/graph_engine.h): these sizes
  // declared (empty: each captured on first use), their memory bounded; false: every pass eager.
  bool cuda_graph = true;
  std::vector<std::int64_t> graph_batch_sizes;
  double graph_memory_mb = 4096;
  // With fold_bn, the graphs' convolutions with their bias, activation and skip as one cuDNN graph each.
  bool fused_conv = true;
};

}  // namespace convnets::deploy
