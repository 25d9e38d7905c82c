// What a model repository call carries and answers, in Triton's terms, shared by the HTTP and gRPC fronts and the repository (torch-free).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace convnets::serve {

// Triton's --model-control-mode: none loads every model once; explicit loads and unloads on request only; poll
// reloads a model whose file changed, loads a new one and unloads a removed one every --repository-poll-secs.
enum class ModelControl { None, Explicit, Poll };

// POST /v2/repository/models/NAME/load's parameters (gRPC: RepositoryModelLoad's).
struct LoadRequest {
  bool has_config = false;
  std::string config;  // "config": a model configuration as JSON text, used instead of the served one's settings
  // "file:PATH": a file of the model's folder and its bytes (HTTP sends them base64, gRPC raw); with any of them the
  // model loads from these files alone, laid out as a repository's NAME/PATH, and "config" is required.
  std::vector<std::pair<std::string, std::string>> files;
};

// 200 and "", or Triton's HTTP status for the failure (400, 500, 503) and its message.
struct ControlResult {
  int status = 200;
  std::string message;
};

// Triton's answer to a load or unload outside explicit mode (its text names polling in none mode too).
inline ControlResult control_not_allowed() {
  return {503, "explicit model load / unload is not allowed if polling is enabled"};
}

}  // namespace convnets::serve
