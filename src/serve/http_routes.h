// Triton's HTTP/REST endpoints (KServe v2 and its extensions) on the serving core, a front as thin as the gRPC service: the routes, the refusals a request's headers earn before its body is read, and /metrics on its own port.
#pragma once

#include <memory>
#include <utility>

namespace convnets::serve {

class ServingCore;
struct ServerOptions;

class HttpService {
 public:
  HttpService(ServingCore& core, const ServerOptions& options);
  ~HttpService();

  // Binds --port and, unless --metrics-port is -1, --metrics-port; returns both ports (the metrics one -1 when
  // /metrics is on the HTTP port). Throws Error naming the flag of a port that cannot be bound.
  std::pair<int, int> bind();
  // Serves on the calling thread (the metrics port on one of its own) until stop().
  void run();
  // From any thread: both fronts stop accepting, close their connections, and run() returns.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace convnets::serve
