// Triton's gRPC inference service (KServe v2 over gRPC, what tritonclient.grpc speaks) on the models, batcher, limits, metrics and drain of `convnets serve`: what it asks of the server, its start and its stop, and the request conversion the fuzzer reaches.
#pragma once

#include "serve/kserve.h"
#include "serve/shared_memory.h"

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace convnets::serve {

// The server as the gRPC service sees it; its HTTP routes answer from the same. JSON texts are the HTTP
// protocol's bodies (Triton's own), which the service turns into the gRPC messages of the same fields.
class ServingCore {
 public:
  virtual ~ServingCore() = default;
  virtual bool ready() const = 0;                 // false while draining
  virtual std::string server_metadata() const = 0;  // GET /v2
  virtual std::string repository_index() const = 0;  // POST /v2/repository/index
  // "" when `name` (at `version`, "" or "1") is served, else the 404 message naming it.
  virtual std::string find_model(const std::string& name, const std::string& version) const = 0;
  virtual std::string model_metadata(const std::string& name) const = 0;  // GET /v2/models/NAME
  virtual std::string model_config(const std::string& name) const = 0;    // GET /v2/models/NAME/config
  // Triton's system shared-memory regions, which both protocols register, list and read inputs from.
  virtual SharedMemoryRegions& shared_memory() = 0;
  // Runs a request: `done` gets status 200 and the response, or the HTTP status (400, 404, 413, 503) and the
  // message the HTTP front end would send; on any thread, once.
  using InferDone = std::function<void(int status, const std::string& error, InferResponse response)>;
  virtual void infer(const std::string& name, const std::string& version, InferRequest request, InferDone done) = 0;
};

struct GrpcOptions {
  std::string host = "127.0.0.1";
  int port = 8001;  // 0: a free one
  Limits limits;    // limits.max_body_bytes bounds a message (larger: RESOURCE_EXHAUSTED, before it is parsed)
};

class GrpcService {
 public:
  // Binds and starts answering; throws Error naming --grpc-port when it cannot.
  GrpcService(ServingCore& core, const GrpcOptions& options);
  ~GrpcService();
  int port() const;
  // Stops taking calls and returns when those in progress have been answered.
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A serialized ModelInferRequest as the service reads it: the model it names, and the request in the form the
// HTTP front end parses its body into (the same checks, ProtocolError the same way). For the fuzzer.
struct GrpcInfer {
  std::string model, version;
  InferRequest request;
};
GrpcInfer parse_grpc_infer_request(std::string_view serialized, const Limits& limits);

}  // namespace convnets::serve
