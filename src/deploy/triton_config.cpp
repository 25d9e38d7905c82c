#include "deploy/triton_config.h"

#include "core/error.h"
#include "core/json.h"

#include <nlohmann/json.hpp>

#include <sstream>

namespace convnets::deploy {

void DynamicBatching::validate() const {
  if (max_batch_size < 1 || max_batch_size > (std::int64_t{1} << 20)) {
    throw Error("--max-batch-size must be 1 .. 1048576, got " + std::to_string(max_batch_size));
  }
  if (max_queue_delay_us < 0 || max_queue_delay_us > 60'000'000) {
    throw Error("--max-queue-delay-us must be 0 .. 60000000 (a minute), got " + std::to_string(max_queue_delay_us));
  }
  for (const auto s : preferred_batch_sizes) {
    if (s < 1 || s > max_batch_size) {
      throw Error("--preferred-batch-sizes: " + std::to_string(s) + " is outside 1.." + std::to_string(max_batch_size) +
                  " (--max-batch-size)");
    }
  }
  if (instances < 1 || instances > 64) {
    throw Error("--instances (--engine-count-per-device) must be 1 .. 64, got " + std::to_string(instances));
  }
  if (max_queue_size < 1) throw Error("--max-queue-size must be at least 1, got " + std::to_string(max_queue_size));
}

namespace {

// A protobuf text-format string literal.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out + '"';
}

std::string list(const std::vector<std::int64_t>& values) {
  std::string out = "[ ";
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + " ]";
}

void tensors(std::ostringstream& o, const char* field, const std::vector<ConfigTensor>& ts) {
  if (ts.empty()) return;
  o << field << " [\n";
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const auto& t = ts[i];
    o << "  {\n    name: " << quoted(t.name) << "\n    data_type: " << t.data_type << "\n";
    if (!t.format.empty()) o << "    format: " << t.format << "\n";
    o << "    dims: " << list(t.dims) << "\n";
    if (!t.label_filename.empty()) o << "    label_filename: " << quoted(t.label_filename) << "\n";
    o << "  }" << (i + 1 < ts.size() ? "," : "") << "\n";
  }
  o << "]\n";
}

nlohmann::ordered_json tensors_json(const std::vector<ConfigTensor>& ts) {
  auto out = nlohmann::ordered_json::array();
  for (const auto& t : ts) {
    nlohmann::ordered_json j{{"name", t.name}, {"data_type", t.data_type}};
    if (!t.format.empty()) j["format"] = t.format;
    j["dims"] = t.dims;
    if (!t.label_filename.empty()) j["label_filename"] = t.label_filename;
    out.push_back(std::move(j));
  }
  return out;
}

nlohmann::ordered_json map_json(const std::vector<std::pair<std::string, std::string>>& pairs) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [k, v] : pairs) j[k] = v;
  return j;
}

}  // namespace

std::string config_pbtxt(const ModelConfig& c) {
  std::ostringstream o;
  for (const auto& line : c.comment) o << "# " << line << "\n";
  o << "name: " << quoted(c.name) << "\n";
  if (!c.platform.empty()) o << "platform: " << quoted(c.platform) << "\n";
  if (!c.backend.empty()) o << "backend: " << quoted(c.backend) << "\n";
  if (!c.default_model_filename.empty()) o << "default_model_filename: " << quoted(c.default_model_filename) << "\n";
  o << "max_batch_size: " << c.max_batch_size << "\n";
  tensors(o, "input", c.inputs);
  tensors(o, "output", c.outputs);
  if (c.dynamic_batching) {
    const auto& b = *c.dynamic_batching;
    o << "dynamic_batching {\n";
    if (!b.preferred_batch_sizes.empty()) o << "  preferred_batch_size: " << list(b.preferred_batch_sizes) << "\n";
    o << "  max_queue_delay_microseconds: " << b.max_queue_delay_us << "\n"
      << "  default_queue_policy {\n    max_queue_size: " << b.max_queue_size << "\n  }\n}\n";
  }
  if (c.instance_group) {
    o << "instance_group [\n  {\n    count: " << c.instance_group->first << "\n    kind: " << c.instance_group->second
      << "\n  }\n]\n";
  }
  if (!c.gpu_accelerators.empty()) {
    o << "optimization {\n  execution_accelerators {\n    gpu_execution_accelerator: [\n";
    for (std::size_t i = 0; i < c.gpu_accelerators.size(); ++i) {
      const auto& a = c.gpu_accelerators[i];
      o << "      {\n        name: " << quoted(a.name) << "\n";
      for (const auto& [k, v] : a.parameters) o << "        parameters { key: " << quoted(k) << " value: " << quoted(v) << " }\n";
      o << "      }" << (i + 1 < c.gpu_accelerators.size() ? "," : "") << "\n";
    }
    o << "    ]\n  }\n}\n";
  }
  if (!c.ensemble_steps.empty()) {
    o << "ensemble_scheduling {\n  step [\n";
    for (std::size_t i = 0; i < c.ensemble_steps.size(); ++i) {
      const auto& s = c.ensemble_steps[i];
      o << "    {\n      model_name: " << quoted(s.model_name) << "\n      model_version: -1\n";
      for (const auto& [k, v] : s.input_map) o << "      input_map { key: " << quoted(k) << " value: " << quoted(v) << " }\n";
      for (const auto& [k, v] : s.output_map) o << "      output_map { key: " << quoted(k) << " value: " << quoted(v) << " }\n";
      o << "    }" << (i + 1 < c.ensemble_steps.size() ? "," : "") << "\n";
    }
    o << "  ]\n}\n";
  }
  for (const auto& [k, v] : c.parameters) {
    o << "parameters {\n  key: " << quoted(k) << "\n  value: { string_value: " << quoted(v) << " }\n}\n";
  }
  return o.str();
}

std::string config_json(const ModelConfig& c) {
  nlohmann::ordered_json j{{"name", c.name}};
  if (!c.platform.empty()) j["platform"] = c.platform;
  if (!c.backend.empty()) j["backend"] = c.backend;
  if (!c.default_model_filename.empty()) j["default_model_filename"] = c.default_model_filename;
  j["max_batch_size"] = c.max_batch_size;
  j["input"] = tensors_json(c.inputs);
  j["output"] = tensors_json(c.outputs);
  if (c.dynamic_batching) {
    const auto& b = *c.dynamic_batching;
    j["dynamic_batching"] = {{"preferred_batch_size", b.preferred_batch_sizes},
                             {"max_queue_delay_microseconds", b.max_queue_delay_us},
                             {"default_queue_policy", {{"max_queue_size", b.max_queue_size}}}};
  }
  if (c.instance_group) {
    j["instance_group"] = nlohmann::ordered_json::array(
        {{{"count", c.instance_group->first}, {"kind", c.instance_group->second}}});
  }
  if (!c.gpu_accelerators.empty()) {
    auto accelerators = nlohmann::ordered_json::array();
    for (const auto& a : c.gpu_accelerators) {
      accelerators.push_back({{"name", a.name}, {"parameters", map_json(a.parameters)}});
    }
    j["optimization"] = {{"execution_accelerators", {{"gpu_execution_accelerator", accelerators}}}};
  }
  if (!c.ensemble_steps.empty()) {
    auto steps = nlohmann::ordered_json::array();
    for (const auto& s : c.ensemble_steps) {
      steps.push_back({{"model_name", s.model_name},
                       {"model_version", -1},
                       {"input_map", map_json(s.input_map)},
                       {"output_map", map_json(s.output_map)}});
    }
    j["ensemble_scheduling"] = {{"step", steps}};
  }
  if (!c.parameters.empty()) {
    nlohmann::ordered_json p = nlohmann::ordered_json::object();
    for (const auto& [k, v] : c.parameters) p[k] = {{"string_value", v}};
    j["parameters"] = std::move(p);
  }
  return dump_json(j);
}

}  // namespace convnets::deploy
