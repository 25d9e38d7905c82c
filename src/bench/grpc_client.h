// bench serve's gRPC side: Triton's GRPCInferenceService called as perf_analyzer's `-i grpc` calls it (a channel per client thread, tensors as raw contents or in system shared memory), and the control calls a run makes; no gRPC or protobuf type in this header.
#pragma once

#include "kserve/messages.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace convnets::bench {

// Every distinct request of a run as a ModelInferRequest, built once: each send only serializes it.
class GrpcRequests {
 public:
  // `requests[i]`: the i-th distinct request, its inputs' bytes in `data` or named in shared memory.
  GrpcRequests(const std::string& model, const std::vector<kserve::InferRequest>& requests);
  ~GrpcRequests();
  std::size_t size() const;

 private:
  friend class GrpcClient;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One channel to HOST:PORT, blocking calls: what each client thread owns, and the control connection.
class GrpcClient {
 public:
  explicit GrpcClient(const std::string& target);
  ~GrpcClient();
  // Waits up to `seconds` for the channel to connect; Error naming the target when it does not.
  void connect(double seconds);

  // ModelInfer of request `which`: "" and the answer in `out` (its outputs from raw_output_contents), or the
  // status code's name ("UNAVAILABLE", "RESOURCE_EXHAUSTED", ...) with `out` untouched.
  std::string infer(const GrpcRequests& requests, std::size_t which, kserve::InferResponse* out);

  // The control calls, Error with the server's status and message where one fails. Metadata comes back in the
  // HTTP protocol's JSON form (shapes as numbers), so that the run chooses its input from either the same way.
  nlohmann::json model_metadata(const std::string& model);
  std::vector<std::string> model_names();
  void register_region(const std::string& name, const std::string& key, std::uint64_t offset, std::uint64_t size);
  void unregister_region(const std::string& name);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace convnets::bench
