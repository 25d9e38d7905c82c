// A Triton Inference Server model repository: config.pbtxt for convnets' ONNX graph, the DALI preprocessing model and the ensemble that joins them, and the checks on the settings.
#pragma once

#include "deploy/triton_config.h"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace convnets::deploy {

// The settings of one model in a repository, as `export --format triton` takes
// them (DLE's Triton deployer spells the flags so: --max-batch-size,
// --preferred-batch-sizes, --max-queue-delay-us, --engine-count-per-device,
// --backend-accelerator trt).
struct TritonSettings {
  std::string name;  // the model's folder and name
  // max_batch_size: the graph's batch dimension is symbolic, Triton batches up to it; preferred sizes empty:
  // Triton's default (max_batch_size); instances: instance_group count per device.
  DynamicBatching batching = [] {
    DynamicBatching b;
    b.max_batch_size = 64;
    b.max_queue_delay_us = 100;
    return b;
  }();
  std::string instance_kind = "gpu";     // gpu | cpu
  // onnxruntime | openvino: the Triton backend that runs 1/model.onnx (OpenVINO's reads ONNX as it is; CPU only).
  std::string backend = "onnxruntime";
  std::string accelerator = "none";      // none | trt (ONNX Runtime's TensorRT execution provider)
  std::string trt_precision = "fp16";    // fp16 | fp32: TensorRT's precision_mode
  // dali: also NAME_preprocessing (Triton's DALI backend: the eval transform from
  // encoded image bytes) and NAME_ensemble (bytes in, logits out) | none
  std::string preprocessing = "dali";
};

// The graph's side of the config: what export_onnx wrote.
struct TritonGraph {
  bool fp16 = false;            // input and output in half
  int image_size = 224;         // input 3 x image_size x image_size
  std::int64_t num_classes = 1000;
  bool labels = false;          // labels.txt beside config.pbtxt
  std::string preprocessing;    // the model's eval preprocessing (JSON), for clients that decode themselves
  std::string arch;
  // The eval transform's numbers, for the DALI pipeline.
  double crop_ratio = 0.875;
  std::array<double, 3> mean{}, std{};
  std::string interpolation = "bilinear";  // bilinear | bicubic
};

// A model name Triton's repository and URLs take: letters, digits, '_', '-' or '.', not starting with '.', at most
// 200 bytes. `export --format triton` and `serve` both hold names to it.
bool valid_triton_model_name(const std::string& name);

// Throws Error naming the flag for a setting Triton would refuse or that
// contradicts another, before anything is written.
void check_triton_settings(const TritonSettings& s);

// config.pbtxt in protobuf text format (Triton's ModelConfig, model_config.proto):
// the onnxruntime or openvino backend, input "input" and output "logits" as
// export_onnx names them, the batch dimension left to max_batch_size.
std::string triton_config_text(const TritonSettings& s, const TritonGraph& g);

// With preprocessing "dali": the DALI model's config.pbtxt, its 1/dali.py, and
// the ensemble's config.pbtxt (input INPUT: one encoded image per batch item,
// output LOGITS with the labels).
std::string triton_dali_config_text(const TritonSettings& s, const TritonGraph& g);
std::string triton_dali_pipeline(const TritonSettings& s, const TritonGraph& g);
std::string triton_ensemble_config_text(const TritonSettings& s, const TritonGraph& g);
std::string triton_preprocessing_name(const TritonSettings& s);
std::string triton_ensemble_name(const TritonSettings& s);

}  // namespace convnets::deploy
