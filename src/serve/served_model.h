// One served model: its engine, eval transform and batcher, the inputs a request may give it (encoded images, tensors or pixels), its answers (logits or Triton's classification), its metadata and model configuration, and the reader that names the models a `serve` command line asks for.
#pragma once

#include "deploy/inference.h"
#include "serve/batcher.h"
#include "kserve/messages.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace convnets::data {
class Transform;
}

namespace convnets::serve {

// The server speaks the protocol kserve/messages.h reads and writes.
using namespace kserve;

// Triton's per-model counters (its metrics' names) that the batcher does not keep.
struct ModelCounters {
  std::atomic<std::int64_t> success{0}, failure{0}, request_us{0}, input_us{0}, output_us{0};
};

class ServedModel {
 public:
  // Loads the model as classify does, then runs one pass (on CUDA graphs, one per batch size the batcher will
  // form) before the port opens: a model that cannot run fails at startup, and the first request does not pay for
  // the engine's first allocation. `max_image_pixels` bounds an encoded image (codec's default when 0).
  ServedModel(std::string name, std::string path, const deploy::InferenceOptions& inference,
              const BatchingOptions& batching, std::int64_t max_image_pixels);
  ~ServedModel();

  const std::string& name() const { return name_; }
  const std::string& path() const { return path_; }
  const deploy::InferenceModel& model() const { return model_; }
  Batcher& batcher() { return *batcher_; }
  const Batcher& batcher() const { return *batcher_; }
  ModelCounters& counters() { return counters_; }
  std::int64_t side() const { return model_.preprocessing().input_size; }

  // The rows a request's one input gives: decoded and transformed images, or its tensor checked against the
  // model's shape. ProtocolError naming the input or output: 400, or 413 for an image that exhausts memory.
  at::Tensor rows_of(const InferRequest& r) const;
  // The response to `r` given its logits: the logits tensor, or Triton's classification strings.
  InferResponse respond(const InferRequest& r, const at::Tensor& logits) const;
  std::string metadata() const;  // GET /v2/models/NAME, JSON
  std::string config() const;    // Triton's model configuration, JSON (deploy/triton_config.h)
  // The startup line's account of it: arch, classes, input, engine, and its own batch sizes where CUDA graphs
  // chose them.
  std::string describe(const BatchingOptions& asked) const;

 private:
  at::Tensor decode_images(const Tensor& t) const;
  Tensor classification(const std::string& name, const at::Tensor& logits, std::int64_t k) const;

  std::string name_, path_;
  deploy::InferenceModel model_;
  std::unique_ptr<data::Transform> transform_;
  std::unique_ptr<Batcher> batcher_;
  ModelCounters counters_;
};

// The (name, path) pairs `serve`'s MODEL arguments name: NAME=PATH, PATH (named after the file, less its
// extension), or a Triton model repository folder, whose NAME/VERSION/model.onnx models are served under their
// folders' names (the highest version of each). Throws Error naming the argument: a path that does not exist, a
// folder with no model, a name Triton would refuse, two models of one name.
std::vector<std::pair<std::string, std::string>> served_model_paths(const std::vector<std::string>& specs);

}  // namespace convnets::serve
