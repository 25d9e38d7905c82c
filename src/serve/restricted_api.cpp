#include "serve/restricted_api.h"

#include "core/error.h"

#include <algorithm>
#include <regex>

namespace convnets::serve {
namespace {

constexpr std::array<const char*, kApiGroups> kNames{"health",         "metadata",         "inference",
                                                     "shared-memory",  "model-config",     "model-repository",
                                                     "statistics",     "trace",            "logging"};

std::string names() {
  std::string out;
  for (const char* n : kNames) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

}  // namespace

RestrictedApis::RestrictedApis(std::string flag, std::string noun, std::string key_prefix)
    : flag_(std::move(flag)), noun_(std::move(noun)), key_prefix_(std::move(key_prefix)) {}

void RestrictedApis::add(const std::string& spec) {
  const auto colon = spec.find(':');
  const auto equals = colon == std::string::npos ? std::string::npos : spec.find('=', colon + 1);
  if (colon == std::string::npos || equals == std::string::npos || colon == 0 || equals == colon + 1 ||
      equals + 1 == spec.size()) {
    throw Error(flag_ + " " + spec + ": expected GROUP[,GROUP...]:KEY=VALUE (Triton's '<config name>:<setting>=<value>')",
                "groups: " + names());
  }
  const Rule rule{key_prefix_ + spec.substr(colon + 1, equals - colon - 1), spec.substr(equals + 1)};
  // gRPC sends metadata keys in lower case: Triton takes a KEY with capitals and then refuses every call; say so.
  const auto capital = [](unsigned char c) { return c >= 'A' && c <= 'Z'; };
  if (!key_prefix_.empty() && std::any_of(rule.key.begin(), rule.key.end(), capital)) {
    throw Error(flag_ + " " + spec + ": gRPC metadata keys are lower case, so no client can send '" + rule.key + "'",
                "write KEY in lower case");
  }
  const std::string list = spec.substr(0, colon);
  for (std::size_t start = 0;;) {
    const auto comma = list.find(',', start);
    const std::string name = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const auto* it = std::find(kNames.begin(), kNames.end(), name);
    if (it == kNames.end()) {
      throw Error(flag_ + " " + spec + ": unknown restricted " + noun_ + " '" + name + "'", "groups: " + names());
    }
    auto& slot = rules_[static_cast<std::size_t>(it - kNames.begin())];
    if (slot) {
      throw Error(flag_ + " " + spec + ": restricted " + noun_ + " '" + name +
                  "' can not be specified in multiple config groups");
    }
    slot = rule;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

bool RestrictedApis::any() const {
  return std::any_of(rules_.begin(), rules_.end(), [](const auto& r) { return r.has_value(); });
}

std::string RestrictedApis::refusal(ApiGroup group,
                                    const std::function<const std::string*(const std::string&)>& header) const {
  const auto& rule = rules_[static_cast<std::size_t>(group)];
  if (!rule) return "";
  const std::string* given = header(rule->key);
  if (given && *given == rule->value) return "";
  return "This " + std::string(noun_ == "api" ? "API" : noun_) + " is restricted, expecting header '" + rule->key + "'";
}

std::optional<ApiGroup> http_api_group(const std::string& p) {
  static const std::string model = R"(/v2/models/[^/]+(?:/versions/[^/]+)?)";
  static const std::regex ready(model + "/ready"), config(model + "/config"), infer(model + "/(?:infer|generate|generate_stream)"),
      metadata(model), stats(R"(/v2/models(?:/[^/]+(?:/versions/[^/]+)?)?/stats)"),
      trace(R"(/v2(?:/models/[^/]+)?/trace/setting)"),
      shm(R"(/v2/(?:system|cuda)sharedmemory(?:/region/[^/]+)?/(?:status|register|unregister))"),
      repository(R"(/v2/repository/(?:index|models/[^/]+/(?:load|unload)))");
  if (p == "/v2/health/live" || p == "/v2/health/ready" || std::regex_match(p, ready)) return ApiGroup::Health;
  // Before metadata's, whose pattern takes /v2/models/stats for a model named "stats".
  if (std::regex_match(p, stats)) return ApiGroup::Statistics;
  if (p == "/v2" || std::regex_match(p, metadata)) return ApiGroup::Metadata;
  if (std::regex_match(p, infer)) return ApiGroup::Inference;
  if (std::regex_match(p, config)) return ApiGroup::ModelConfig;
  if (std::regex_match(p, shm)) return ApiGroup::SharedMemory;
  if (std::regex_match(p, repository)) return ApiGroup::ModelRepository;
  if (std::regex_match(p, trace)) return ApiGroup::Trace;
  if (p == "/v2/logging") return ApiGroup::Logging;
  return std::nullopt;
}

}  // namespace convnets::serve
