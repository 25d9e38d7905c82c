// `bench infer`: inference images/s and per-batch latency (and, on CUDA, the GPU's own time) per batch size and engine, of an arch's random weights or of a checkpoint, weights file or ONNX export.
#pragma once

#include "bench/model_bench.h"
#include "deploy/inference.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace convnets::bench {

struct InferBenchOptions : ModelBenchOptions {
  std::vector<std::int64_t> graph_batch_sizes;  // on CUDA: declared graph sizes (empty: each on first use)
  double graph_memory_mb = 4096;
  bool fused_conv = true;  // on CUDA graphs with fold_bn: conv+bias+act as one cuDNN graph (--no-fused-conv)
  bool fold_bn = false;    // BatchNorm folded into the convs first (fold_batchnorm)
  // The engines to time side by side, each resolved (deploy::resolve_engine: torch, openvino); OpenVINO always
  // folds BN.
  std::vector<std::string> engines{"torch"};
  // Time this checkpoint, weights file or exported ONNX (a QAT checkpoint or an INT8 export as INT8) instead of
  // random weights of `arch`; `checkpoint_options` open it (the engine is set per row), and arch, image_size and
  // num_classes are its own (set_checkpoint).
  std::string checkpoint;
  deploy::InferenceOptions checkpoint_options;
  bool quantized = false;
};

struct InferBenchRow : BenchRow {
  std::string engine = "torch";
  double p50_ms = 0, p90_ms = 0, p95_ms = 0, p99_ms = 0;  // per forward, each synchronised
  // On CUDA: the GPU's time per forward pass, CUDA events around it (the copy into the graph's input, the replay,
  // the logits' copy), as trtexec's "GPU Compute Time"; and which graphs the engine held.
  double gpu_mean_ms = 0, gpu_p50_ms = 0, gpu_p90_ms = 0, gpu_p99_ms = 0;
  std::string graphs;
};

// Opens `path` once with `io` (engine: the first of `options.engines`) and
// takes its arch, input size, class count and whether it is INT8 into
// `options`; a file an engine cannot run fails here, naming it.
void set_checkpoint(InferBenchOptions& options, const std::string& path, deploy::InferenceOptions io);

// For each engine, a row per batch size (out-of-memory probed).
std::vector<InferBenchRow> run_infer_bench(const InferBenchOptions& options);

// The DLE-README-style table (with the GPU's own times on CUDA), and the JSON record (with device and versions).
std::string format_table(const InferBenchOptions& options, const std::vector<InferBenchRow>& rows);
nlohmann::ordered_json to_json(const InferBenchOptions& options, const std::vector<InferBenchRow>& rows);

}  // namespace convnets::bench
