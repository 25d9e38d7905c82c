// A trained network ready for inference: a checkpoint's weights on a device with its preprocessing and class names, and the classification of image files that `classify`, `eval` and the Python package share.
#pragma once

#include "deploy/engine.h"
#include "deploy/inference_options.h"
#include "models/network.h"
#include "models/registry.h"
#include "runtime/checkpoint.h"
#include "runtime/runtime.h"

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace convnets::deploy {

// One file's top-k, or why it could not be classified.
struct Prediction {
  std::string path;
  std::string error;                                  // empty: classified
  std::vector<std::pair<std::int64_t, double>> top;  // class index, probability (softmax), best first
};

// A model's class names: its own, or ImageNet-1k's for 1000 classes without names of its own; empty when
// neither fits num_classes. classify, eval and the Triton export's labels agree by calling this.
std::vector<std::string> class_names_or_imagenet(std::vector<std::string> own, std::int64_t num_classes);

class InferenceModel {
 public:
  // `checkpoint`: a training checkpoint or weights file (safetensors), or an
  // ONNX file `convnets export` wrote (float, fp16 or INT8 QDQ; it carries its
  // arch, preprocessing and class names), which only the OpenVINO engine runs.
  // Throws Error naming the file for anything unreadable, a disagreeing
  // arch or class count, or a precision the device lacks.
  InferenceModel(const std::string& checkpoint, const InferenceOptions& options);

  const std::string& checkpoint() const { return path_; }
  const ArchInfo& arch() const { return *arch_; }
  const Preprocessing& preprocessing() const { return pre_; }
  // The checkpoint's class names; "0", "1", ... when it has none.
  const std::vector<std::string>& class_names() const { return names_; }
  bool has_class_names() const { return named_; }
  std::int64_t num_classes() const { return num_classes_; }
  bool quantized() const { return quantized_; }
  bool trained() const { return trained_; }
  const runtime::Runtime& runtime() const { return rt_; }
  // Null for an ONNX file (its graph is not a LibTorch network).
  NetworkImpl* network_or_null() const { return model_.get(); }
  // The engine that runs it, "torch" or "openvino" by name.
  const Engine& engine() const { return *engine_; }
  const std::string& engine_name() const { return engine_name_; }
  // One line for the user: engine, version, precision, device, and how an
  // INT8 network runs ("openvino 2026.4.1, fp32 on cpu (2 threads), INT8 kernels").
  std::string describe_engine() const;
  NetworkImpl& network() const;
  const InferenceOptions& options() const { return options_; }

  // Logits (float32, on the model's device) of a batch: uint8 [B, H, W, 1|3]
  // pixels as the loader yields them (normalised with the checkpoint's mean
  // and std), or a float [B, 3, H, W] batch already normalised.
  at::Tensor logits(const at::Tensor& batch) const;

  // The top_k classes of each file through the checkpoint's eval
  // preprocessing; a file that cannot be read or decoded gets its error and
  // the others are still classified.
  std::vector<Prediction> classify(const std::vector<std::string>& paths, std::int64_t top_k, std::int64_t batch_size,
                                   std::int64_t max_image_pixels) const;
  // `convnets classify --json`'s document for these predictions.
  nlohmann::ordered_json to_json(const std::vector<Prediction>& predictions) const;

 private:
  void open_onnx();
  // "0", "1", ... unless names_ holds one name per class.
  void name_classes();

  std::string path_;
  InferenceOptions options_;
  const ArchInfo* arch_ = nullptr;
  Preprocessing pre_;
  std::vector<std::string> names_;
  std::int64_t num_classes_ = 0;
  bool quantized_ = false, trained_ = false, named_ = false;
  runtime::Runtime rt_;
  Network model_;
  std::shared_ptr<const quant::Plan> plan_;  // a quantized network's
  std::string engine_name_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace convnets::deploy
