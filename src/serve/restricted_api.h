// Triton's endpoint restriction (--http-restricted-api, --grpc-restricted-protocol): which API groups a request reaches only with a KEY: VALUE header, the flags' syntax, and the refusal a request without it earns.
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <string>

namespace convnets::serve {

// Triton's endpoint groups (its restricted_features.h), in its order; convnets serves the routes of the first six.
enum class ApiGroup { Health, Metadata, Inference, SharedMemory, ModelConfig, ModelRepository, Statistics, Trace, Logging };
inline constexpr std::size_t kApiGroups = 9;

class RestrictedApis {
 public:
  // `flag`: --http-restricted-api or --grpc-restricted-protocol, for the messages; `noun`: "api" or "protocol", as
  // Triton words each; `key_prefix`: what a header's name carries before KEY (gRPC: "triton-grpc-protocol-").
  RestrictedApis(std::string flag, std::string noun, std::string key_prefix = "");

  // One value of the flag, "GROUP[,GROUP...]:KEY=VALUE", split as Triton splits it: at the first ':', then at the
  // first '=' after it (VALUE may hold either), names not trimmed. Throws Error naming the flag for a value of
  // another shape, an unknown group, or a group already restricted by this flag.
  void add(const std::string& spec);
  bool any() const;

  // "" where a request to `group` may go on, else Triton's refusal. `header(name)`: the request's value of a
  // header or metadata key, null where it has none.
  std::string refusal(ApiGroup group, const std::function<const std::string*(const std::string&)>& header) const;

 private:
  struct Rule {
    std::string key, value;  // key with the prefix
  };
  std::string flag_, noun_, key_prefix_;
  std::array<std::optional<Rule>, kApiGroups> rules_;
};

// The group of an HTTP route by its path alone (Triton checks the restriction before the method), or none for a
// path no route has.
std::optional<ApiGroup> http_api_group(const std::string& path);

}  // namespace convnets::serve
