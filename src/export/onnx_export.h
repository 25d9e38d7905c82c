// ONNX export of a network's inference graph through ONNX's own protobuf schema and checker (libonnx).
#pragma once

#include "models/network.h"
#include "quant/qdq.h"

#include <map>
#include <string>

namespace convnets {

struct OnnxOptions {
  int image_size = 224;       // the input's static height and width
  std::int64_t num_classes = 1000;
  std::int64_t batch = 1;     // static batch size, unless dynamic_batch
  bool dynamic_batch = false; // input and output batch dimension named "batch"
  bool fold_bn = false;       // BN folded into the preceding conv's weights and bias
  bool fp16 = false;          // fp16 weights, input and output (the whole graph in half)
  int opset = 13;
  // INT8: a QDQ graph with these calibrated ranges (quant/qdq.h: placement,
  // per-channel int8 weights, BN folded); null: float.
  const quant::Plan* int8 = nullptr;
  // model metadata_props: preprocessing, arch, class names, ...
  std::map<std::string, std::string> metadata;
};

// Whether this build has ONNX (Debian's libonnx-dev at configure time).
bool onnx_export_available();

// Builds the graph from the network's emit() (eval mode), runs
// onnx::checker::check_model on it and writes it atomically. An op the
// exporter cannot express is an Error naming the layer; nothing is written.
// Returns the number of graph nodes.
std::size_t export_onnx(NetworkImpl& model, const OnnxOptions& options, const std::string& path);

// What a runtime needs to know of an ONNX file convnets (or anyone) wrote:
// its metadata_props and its input's static side (0 when not static).
struct OnnxInfo {
  std::map<std::string, std::string> metadata;
  std::int64_t input_size = 0;
};
// Throws Error naming `name` when the bytes are not an ONNX model.
OnnxInfo read_onnx_info(const std::string& bytes, const std::string& name);

// The same model, serialised, for a runtime that reads it from memory (the
// OpenVINO engine); `nodes` (optional) receives the node count.
std::string onnx_model_bytes(NetworkImpl& model, const OnnxOptions& options, std::size_t* nodes = nullptr);

}  // namespace convnets
