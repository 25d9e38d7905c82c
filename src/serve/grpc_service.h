// Triton's gRPC inference service (KServe v2 over gRPC, what tritonclient.grpc speaks), a front on the serving core as the HTTP routes are: its start and its stop.
#pragma once

#include "kserve/messages.h"
#include "serve/restricted_api.h"

#include <memory>
#include <string>

namespace convnets::serve {

// The server speaks the protocol kserve/messages.h reads and writes.
using namespace kserve;

class ServingCore;

struct GrpcOptions {
  std::string host = "127.0.0.1";
  int port = 8001;  // 0: a free one
  Limits limits;    // limits.max_body_bytes bounds a message (larger: RESOURCE_EXHAUSTED, before it is parsed)
  RestrictedApis restricted{"--grpc-restricted-protocol", "protocol", "triton-grpc-protocol-"};
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

}  // namespace convnets::serve
