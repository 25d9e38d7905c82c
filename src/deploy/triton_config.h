// Triton's model configuration (model_config.proto) as one description, written as a repository's config.pbtxt or as the JSON a server's model-configuration endpoint answers, and the dynamic-batching settings both carry, checked once.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace convnets::deploy {

// Triton's max_batch_size, dynamic_batching and instance_group count, with Triton's meanings, as `serve` batches by
// them and `export --format triton` writes them (DLE's deployer spells the flags so).
struct DynamicBatching {
  std::int64_t max_batch_size = 8;      // rows per forward pass; a request may not hold more
  std::int64_t max_queue_delay_us = 0;  // how long the oldest request waits for others to join its batch
  // As Triton: when the queue holds enough rows for one of these sizes, the largest such batch leaves at once.
  std::vector<std::int64_t> preferred_batch_sizes;
  int instances = 1;                 // forward passes that may run at once (instance_group count)
  std::int64_t max_queue_size = 64;  // requests waiting; one more is refused at once (default_queue_policy)
  // convnets serve's batcher only (--batch-delay-policy; no Triton setting, not written into a config): the server
  // announces each request from its arrival to its answer, so a queue that holds every request the server has
  // leaves at once instead of waiting out max_queue_delay_us for requests that are not on their way.
  bool known_arrivals = false;

  // Throws Error naming the flag: a size, delay, preferred size, instance count or queue bound Triton would refuse
  // or convnets serve cannot honour (a delay over a minute, over 64 instances).
  void validate() const;
};

// One input or output of a model configuration.
struct ConfigTensor {
  std::string name;
  std::string data_type;  // Triton's: TYPE_FP32, TYPE_UINT8, TYPE_STRING ...
  std::vector<std::int64_t> dims;
  std::string format;          // "" or FORMAT_NCHW
  std::string label_filename;  // "" : none
};

// A step of an ensemble (ensemble_scheduling): the model it runs and how its tensors are named in the ensemble.
struct EnsembleStep {
  std::string model_name;
  std::vector<std::pair<std::string, std::string>> input_map, output_map;  // the model's name -> the ensemble's
};

// A GPU execution accelerator (ONNX Runtime's TensorRT provider) with its string parameters.
struct GpuAccelerator {
  std::string name;
  std::vector<std::pair<std::string, std::string>> parameters;
};

struct ModelConfig {
  std::vector<std::string> comment;  // config.pbtxt's leading lines ("# " each); not in the JSON
  std::string name;
  std::string platform, backend;       // one of the two
  std::string default_model_filename;  // "" : the backend's own
  std::int64_t max_batch_size = 0;
  std::vector<ConfigTensor> inputs, outputs;
  std::optional<DynamicBatching> dynamic_batching;  // none: no dynamic_batching (instances: below)
  std::optional<std::pair<int, std::string>> instance_group;  // count and kind (KIND_GPU | KIND_CPU)
  std::vector<GpuAccelerator> gpu_accelerators;  // optimization.execution_accelerators
  std::vector<EnsembleStep> ensemble_steps;      // ensemble_scheduling
  std::vector<std::pair<std::string, std::string>> parameters;  // key -> string_value
};

// config.pbtxt: protobuf text format, as Triton reads a repository.
std::string config_pbtxt(const ModelConfig& c);
// The same fields as JSON, as Triton's HTTP model-configuration extension answers (and its gRPC ModelConfig
// message reads with protobuf's JSON mapping).
std::string config_json(const ModelConfig& c);

}  // namespace convnets::deploy
