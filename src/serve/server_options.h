// What `convnets serve` is asked for: the models and how they load, batching, the request limits, the ports and the connection deadlines; the core and both fronts read it.
#pragma once

#include "deploy/inference_options.h"
#include "deploy/triton_config.h"
#include "kserve/messages.h"
#include "serve/repository_control.h"
#include "serve/restricted_api.h"

#include <cstdint>
#include <string>
#include <vector>

namespace convnets::serve {

// The server speaks the protocol kserve/messages.h reads and writes.
using namespace kserve;

struct ServerOptions {
  // Each NAME=PATH or PATH (named after the file, less its extension). PATH: a checkpoint, a weights file or an
  // exported ONNX file, as `classify` takes them; or a folder laid out as a Triton model repository, whose
  // NAME/VERSION/model.onnx models are served under their folders' names (the highest version of each).
  std::vector<std::string> models;
  // Triton's model control: none (every model loaded once), explicit (--load-model's at startup, then load and
  // unload on request), poll (every model, reloaded when its file changes, every repository_poll_secs; 0: never).
  ModelControl model_control = ModelControl::None;
  int repository_poll_secs = 15;
  std::vector<std::string> load_models;  // explicit: the names loaded at startup ("*": all)
  deploy::InferenceOptions inference;
  deploy::DynamicBatching batching = [] {
    deploy::DynamicBatching b;
    b.known_arrivals = true;  // --batch-delay-policy arrivals: every request is announced from its arrival
    return b;
  }();
  Limits limits;  // per request; limits.max_body_bytes also bounds the HTTP body before it is read
  std::size_t max_json_bytes = std::size_t{16} << 20;  // a request's JSON part; tensors beyond come as binary data
  std::int64_t max_image_pixels = 0;  // an encoded image larger than this is refused (codec's default when 0)

  std::string host = "127.0.0.1";  // loopback unless asked: a server is reachable only where it is meant to be
  int http_port = 8000;            // 0: a free port (the startup line names it)
  int metrics_port = 8002;         // Triton's; 0: a free port; -1: /metrics on the HTTP port only
  int grpc_port = 8001;            // Triton's gRPC service; 0: a free port; -1: none
  bool grpc_asked = false;         // --grpc-port given: a build without gRPC refuses it rather than serve HTTP alone
  int max_connections = 1024;      // sockets open at once (idle ones cost no thread); more wait in the backlog
  int idle_timeout_s = 5;          // a keep-alive connection with no request for this long is closed
  int header_timeout_s = 10;       // a request whose headers are not complete this long after its first byte: closed
  int body_timeout_s = 30;         // a body not received in full this long after its headers gets 408
  int log_verbose = 0;             // 1: a stderr line for each connection a deadline or a limit ends; 2: idle ones too
  // Triton's endpoint restriction: the groups answered only to requests carrying a KEY: VALUE header (HTTP) or
  // triton-grpc-protocol-KEY metadata (gRPC); nothing restricted by default, as in Triton.
  RestrictedApis http_restricted{"--http-restricted-api", "api"};
  RestrictedApis grpc_restricted{"--grpc-restricted-protocol", "protocol", "triton-grpc-protocol-"};
  int drain_timeout_s = 30;        // SIGTERM: how long requests in flight may take before the server stops
                                   // (past it and the connection timeouts, the process exits 1 regardless)
};

}  // namespace convnets::serve
