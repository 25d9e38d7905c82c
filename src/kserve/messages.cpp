#include "kserve/messages.h"

#include "core/json.h"

#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

namespace convnets::kserve {
namespace {

constexpr std::array<std::pair<const char*, DataType>, 13> kTypes{{{"BOOL", DataType::Bool},
                                                                   {"UINT8", DataType::UInt8},
                                                                   {"UINT16", DataType::UInt16},
                                                                   {"UINT32", DataType::UInt32},
                                                                   {"UINT64", DataType::UInt64},
                                                                   {"INT8", DataType::Int8},
                                                                   {"INT16", DataType::Int16},
                                                                   {"INT32", DataType::Int32},
                                                                   {"INT64", DataType::Int64},
                                                                   {"FP16", DataType::Fp16},
                                                                   {"FP32", DataType::Fp32},
                                                                   {"FP64", DataType::Fp64},
                                                                   {"BYTES", DataType::Bytes}}};

[[noreturn]] void bad(const std::string& what) { throw ProtocolError(400, what); }
[[noreturn]] void too_large(const std::string& what) { throw ProtocolError(413, what); }

template <typename T>
void append(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // x86-64 and aarch64 are little-endian, as the protocol is
  out.append(bytes, sizeof(T));
}

template <typename T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// IEEE half to float, for an FP16 output sent as JSON.
float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
  if (exp == 0) return (sign ? -1.0f : 1.0f) * std::ldexp(static_cast<float>(mant), -24);
  std::uint32_t bits = exp == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((exp + 112) << 23) | (mant << 13));
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Float to IEEE half, rounded to nearest even, for an FP16 output a response gave as JSON numbers.
std::uint16_t float_to_half(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u);  // NaN, infinity
  if (abs >= 0x477ff000u) return sign | 0x7c00u;                                    // rounds past 65504
  if (abs < 0x38800000u) {                                                           // a subnormal half, or 0
    const float scaled = std::fabs(f) * 16777216.0f;                                 // 2^24: units of 2^-24
    return sign | static_cast<std::uint16_t>(std::nearbyint(scaled));
  }
  const std::uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return sign | static_cast<std::uint16_t>((rounded - 0x38000000u) >> 13);
}

// Calls f(value) for each of a fixed-size tensor's elements, typed as its datatype reads (FP16 as float), or with
// each string of a BYTES tensor.
template <typename F>
void for_each_element(const Tensor& t, F&& f) {
  if (t.datatype == DataType::Bytes) {
    for (const auto& e : t.elements) f(e);
    return;
  }
  const std::size_t size = element_size(t.datatype);
  for (std::size_t k = 0; k + size <= t.data.size(); k += size) {
    const char* p = t.data.data() + k;
    switch (t.datatype) {
      case DataType::Bool: f(p[0] != 0); break;
      case DataType::UInt8: f(load<std::uint8_t>(p)); break;
      case DataType::UInt16: f(load<std::uint16_t>(p)); break;
      case DataType::UInt32: f(load<std::uint32_t>(p)); break;
      case DataType::UInt64: f(load<std::uint64_t>(p)); break;
      case DataType::Int8: f(load<std::int8_t>(p)); break;
      case DataType::Int16: f(load<std::int16_t>(p)); break;
      case DataType::Int32: f(load<std::int32_t>(p)); break;
      case DataType::Int64: f(load<std::int64_t>(p)); break;
      case DataType::Fp16: f(half_to_float(load<std::uint16_t>(p))); break;
      case DataType::Fp32: f(load<float>(p)); break;
      case DataType::Fp64: f(load<double>(p)); break;
      case DataType::Bytes: break;
    }
  }
}

// A body of either direction: the JSON, then `tail` where any tensor went binary (even one of no bytes), with
// `header_length` the JSON's length then and reset otherwise.
std::string framed(const nlohmann::json& j, const std::string& tail, bool any_binary,
                   std::optional<std::size_t>& header_length) {
  std::string text = dump_json(j);
  if (!any_binary) {
    header_length.reset();
    return text;
  }
  header_length = text.size();
  return text + tail;
}

template <typename T>
void append_integer(std::string& out, const nlohmann::json& v, const std::string& tensor) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) bad(tensor + ": " + v.dump() + " is out of range");
    append<T>(out, static_cast<T>(u));
  } else if (v.is_number_integer()) {
    const auto i = v.get<std::int64_t>();
    if constexpr (std::is_unsigned_v<T>) {
      if (i < 0) bad(tensor + ": " + v.dump() + " is out of range");
      if (static_cast<std::uint64_t>(i) > std::numeric_limits<T>::max()) bad(tensor + ": " + v.dump() + " is out of range");
    } else {
      if (i < std::numeric_limits<T>::min() || i > std::numeric_limits<T>::max()) {
        bad(tensor + ": " + v.dump() + " is out of range");
      }
    }
    append<T>(out, static_cast<T>(i));
  } else {
    bad(tensor + ": expected integers, got " + std::string(v.type_name()));
  }
}

// One JSON element into the tensor.
void append_element(Tensor& t, const nlohmann::json& v, const std::string& where) {
  switch (t.datatype) {
    case DataType::Bool:
      if (!v.is_boolean()) bad(where + ": BOOL data must be true or false, got " + std::string(v.type_name()));
      t.data.push_back(v.get<bool>() ? 1 : 0);
      return;
    case DataType::UInt8: return append_integer<std::uint8_t>(t.data, v, where);
    case DataType::UInt16: return append_integer<std::uint16_t>(t.data, v, where);
    case DataType::UInt32: return append_integer<std::uint32_t>(t.data, v, where);
    case DataType::UInt64: return append_integer<std::uint64_t>(t.data, v, where);
    case DataType::Int8: return append_integer<std::int8_t>(t.data, v, where);
    case DataType::Int16: return append_integer<std::int16_t>(t.data, v, where);
    case DataType::Int32: return append_integer<std::int32_t>(t.data, v, where);
    case DataType::Int64: return append_integer<std::int64_t>(t.data, v, where);
    case DataType::Fp16:
      bad(where + ": FP16 data has no JSON form; send it as binary data (Triton's binary tensor extension)");
    case DataType::Fp32: {
      if (!v.is_number()) bad(where + ": FP32 data must be numbers, got " + std::string(v.type_name()));
      const double d = v.get<double>();
      if (std::abs(d) > std::numeric_limits<float>::max()) bad(where + ": " + v.dump() + " is out of FP32's range");
      append<float>(t.data, static_cast<float>(d));
      return;
    }
    case DataType::Fp64:
      if (!v.is_number()) bad(where + ": FP64 data must be numbers, got " + std::string(v.type_name()));
      append<double>(t.data, v.get<double>());
      return;
    case DataType::Bytes:
      if (!v.is_string()) bad(where + ": BYTES data must be strings, got " + std::string(v.type_name()));
      t.elements.push_back(v.get<std::string>());
      return;
  }
}

// "data", flat or nested row-major (the protocol allows both), element by element; parse_json bounded the depth.
// Nested data must nest as the shape does: each array at depth d holds shape[d] items, scalars only at the last.
void read_json_data(Tensor& t, const nlohmann::json& data, std::int64_t expected, const std::string& where) {
  std::int64_t count = 0;
  if (!data.is_array()) bad(where + ": \"data\" must be an array");
  const bool nested = !data.empty() && data.front().is_array();
  const auto rank = t.shape.size();
  const auto check = [&](const nlohmann::json& array, std::size_t depth) {
    if (!nested) return;
    if (depth >= rank || static_cast<std::int64_t>(array.size()) != t.shape[depth]) {
      bad(where + ": nested \"data\" does not follow the shape " + nlohmann::json(t.shape).dump() + " at depth " +
          std::to_string(depth));
    }
  };
  check(data, 0);
  std::vector<std::pair<const nlohmann::json*, std::size_t>> stack{{&data, 0}};
  while (!stack.empty()) {
    auto& [array, next] = stack.back();
    if (next == array->size()) {
      stack.pop_back();
      continue;
    }
    const nlohmann::json& v = (*array)[next++];
    const std::size_t depth = stack.size();  // v's depth, when it is an array
    if (v.is_array()) {
      if (!nested) bad(where + ": \"data\" mixes arrays and values");
      check(v, depth);
      stack.emplace_back(&v, 0);
      continue;
    }
    if (nested && depth != rank) {
      bad(where + ": nested \"data\" does not follow the shape " + nlohmann::json(t.shape).dump() + " at depth " +
          std::to_string(depth - 1));
    }
    if (++count > expected) bad(where + ": \"data\" holds more than the shape's " + std::to_string(expected) + " elements");
    append_element(t, v, where);
  }
  if (count != expected) {
    bad(where + ": \"data\" holds " + std::to_string(count) + " elements, the shape " + std::to_string(expected));
  }
}

std::string name_of(const nlohmann::json& j, const Limits& limits, const std::string& where) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) bad(where + ": expected an object with a \"name\"");
  auto name = j["name"].get<std::string>();
  check_name(name, limits, where);
  return name;
}

// A parameters object's value of one type, or none; anything else under that key is an error naming it.
template <typename T>
std::optional<T> parameter(const nlohmann::json& parent, const char* key, const std::string& where) {
  if (!parent.contains("parameters")) return std::nullopt;
  const auto& p = parent["parameters"];
  if (!p.is_object()) bad(where + ": \"parameters\" must be an object");
  if (!p.contains(key)) return std::nullopt;
  const auto& v = p[key];
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) bad(where + ": parameter \"" + key + "\" must be true or false");
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) bad(where + ": parameter \"" + key + "\" must be a string");
  } else {
    if (!v.is_number_integer()) bad(where + ": parameter \"" + key + "\" must be an integer");
  }
  return v.get<T>();
}

}  // namespace

std::optional<DataType> datatype_of(std::string_view name) {
  for (const auto& [n, t] : kTypes) {
    if (name == n) return t;
  }
  return std::nullopt;
}

const char* datatype_name(DataType t) {
  for (const auto& [n, type] : kTypes) {
    if (type == t) return n;
  }
  return "?";
}

std::size_t element_size(DataType t) {
  switch (t) {
    case DataType::Bool: case DataType::UInt8: case DataType::Int8: return 1;
    case DataType::UInt16: case DataType::Int16: case DataType::Fp16: return 2;
    case DataType::UInt32: case DataType::Int32: case DataType::Fp32: return 4;
    case DataType::UInt64: case DataType::Int64: case DataType::Fp64: return 8;
    case DataType::Bytes: return 0;
  }
  return 0;
}

std::int64_t Tensor::element_count() const {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

std::string in_quotes(const std::string& name) {
  std::string text = "'";
  text += utf8_escaped(name);
  text += '\'';
  return text;
}

std::string raw_bytes(const Tensor& t) {
  if (t.datatype != DataType::Bytes) return t.data;
  std::string bytes;
  for (const auto& e : t.elements) {
    append<std::uint32_t>(bytes, static_cast<std::uint32_t>(e.size()));
    bytes += e;
  }
  return bytes;
}

std::optional<SharedMemoryRef> shared_memory_ref(std::optional<std::string> region, std::optional<std::int64_t> byte_size,
                                                 std::optional<std::int64_t> offset, const Limits& limits,
                                                 const std::string& where) {
  if (!region) {
    if (byte_size || offset) bad(where + ": shared_memory_byte_size or shared_memory_offset without shared_memory_region");
    return std::nullopt;
  }
  check_name(*region, limits, where + "'s shared_memory_region");
  if (!byte_size) bad(where + ": shared_memory_region without shared_memory_byte_size");
  if (*byte_size < 0) bad(where + ": shared_memory_byte_size must be 0 or more");
  // What the body would have carried is bounded as a body is (--max-request-bytes): a region may be larger.
  if (static_cast<std::uint64_t>(*byte_size) > limits.max_body_bytes) {
    too_large(where + ": shared_memory_byte_size " + std::to_string(*byte_size) + " is over the limit of " +
              std::to_string(limits.max_body_bytes) + " bytes a request may hold");
  }
  if (offset && *offset < 0) bad(where + ": shared_memory_offset must be 0 or more");
  return SharedMemoryRef{*region, static_cast<std::uint64_t>(offset.value_or(0)), static_cast<std::uint64_t>(*byte_size)};
}

void refuse_shared_memory_output(const std::string& where) {
  bad(where + ": outputs are not written into shared memory (regions are opened read-only); ask for it in the "
      "response instead");
}

void read_binary_data(Tensor& t, std::string_view bytes, std::int64_t expected, const std::string& where) {
  if (t.datatype != DataType::Bytes) {
    const auto need = static_cast<std::uint64_t>(expected) * element_size(t.datatype);
    if (bytes.size() != need) {
      bad(where + ": " + std::to_string(bytes.size()) + " bytes of data are not the shape's " + std::to_string(expected) +
          " elements of " + std::to_string(element_size(t.datatype)) + " bytes (" + std::to_string(need) + ")");
    }
    t.data.assign(bytes.data(), bytes.size());
    return;
  }
  // BYTES: each element a 4-byte little-endian length, then that many bytes.
  std::size_t at = 0;
  while (at < bytes.size()) {
    if (static_cast<std::int64_t>(t.elements.size()) == expected) {
      bad(where + ": the binary data holds more than the shape's " + std::to_string(expected) + " elements");
    }
    if (bytes.size() - at < 4) bad(where + ": the binary data ends inside an element's 4-byte length");
    const std::uint32_t n = load<std::uint32_t>(bytes.data() + at);
    at += 4;
    if (n > bytes.size() - at) {
      bad(where + ": element " + std::to_string(t.elements.size()) + " claims " + std::to_string(n) + " bytes, " +
          std::to_string(bytes.size() - at) + " remain");
    }
    t.elements.emplace_back(bytes.data() + at, n);
    at += n;
  }
  if (static_cast<std::int64_t>(t.elements.size()) != expected) {
    bad(where + ": the binary data holds " + std::to_string(t.elements.size()) + " elements, the shape " +
        std::to_string(expected));
  }
}

void check_counts(std::size_t inputs, std::size_t outputs, const Limits& limits) {
  if (inputs == 0) bad("the request has no inputs");
  if (inputs > limits.max_inputs) {
    too_large(std::to_string(inputs) + " inputs, over the limit of " + std::to_string(limits.max_inputs));
  }
  if (outputs > limits.max_outputs) {
    too_large(std::to_string(outputs) + " outputs requested, over the limit of " + std::to_string(limits.max_outputs));
  }
}

std::int64_t checked_timeout(std::int64_t us) {
  if (us < 0) bad("parameter \"timeout\" must be 0 or more microseconds");
  return us;
}

std::int64_t checked_classification(std::int64_t k, const std::string& where) {
  if (k < 0) bad(where + ": classification must be 0 or more");
  return k;
}

void check_name(const std::string& name, const Limits& limits, const std::string& where) {
  if (name.empty() || name.size() > limits.max_name_bytes) {
    bad(where + ": a name of 1.." + std::to_string(limits.max_name_bytes) + " bytes, got " + std::to_string(name.size()));
  }
}

std::int64_t declare_input(Tensor& t, const std::string& name, std::string_view datatype,
                           const std::vector<std::int64_t>& shape, const Limits& limits, const std::vector<Tensor>& earlier) {
  return declare_tensor(t, "input", name, datatype, shape, limits, earlier);
}

std::int64_t declare_tensor(Tensor& t, const std::string& kind, const std::string& name, std::string_view datatype,
                            const std::vector<std::int64_t>& shape, const Limits& limits,
                            const std::vector<Tensor>& earlier) {
  check_name(name, limits, "an " + kind);
  const std::string where = kind + " " + in_quotes(name);
  for (const auto& other : earlier) {
    if (other.name == name) bad(where + " appears twice");
  }
  const auto type = datatype_of(datatype);
  if (!type) {
    bad(where + ": unknown datatype " + in_quotes(std::string(datatype)) +
        " (BOOL, UINT8..UINT64, INT8..INT64, FP16, FP32, FP64, BYTES)");
  }
  if (static_cast<int>(shape.size()) > limits.max_dims) {
    too_large(where + ": " + std::to_string(shape.size()) + " dimensions, over the limit of " + std::to_string(limits.max_dims));
  }
  std::int64_t elements = 1;
  for (const auto dim : shape) {
    if (dim < 0) bad(where + ": shape entries must be integers of 0 or more");
    if (dim > limits.max_elements || (dim > 0 && elements > limits.max_elements / dim)) {
      too_large(where + ": the shape " + nlohmann::json(shape).dump() + " holds more than " +
                std::to_string(limits.max_elements) + " elements");
    }
    elements *= dim;
  }
  t.name = name;
  t.datatype = *type;
  t.shape = shape;
  return elements;
}

std::size_t parse_header_length(std::string_view value) {
  if (value.empty() || value.size() > 18) bad("Inference-Header-Content-Length: expected a byte count, got '" + std::string(value) + "'");
  std::size_t n = 0;
  for (const char c : value) {
    if (c < '0' || c > '9') bad("Inference-Header-Content-Length: expected a byte count, got '" + std::string(value) + "'");
    n = n * 10 + static_cast<std::size_t>(c - '0');
  }
  return n;
}

InferRequest parse_infer_request(std::string_view body, std::optional<std::size_t> header_length, const Limits& limits) {
  if (body.size() > limits.max_body_bytes) {
    too_large("the request body is " + std::to_string(body.size()) + " bytes, over the limit of " +
              std::to_string(limits.max_body_bytes));
  }
  if (header_length && *header_length > body.size()) {
    bad("Inference-Header-Content-Length " + std::to_string(*header_length) + " is past the body's " +
        std::to_string(body.size()) + " bytes");
  }
  const std::string_view header = header_length ? body.substr(0, *header_length) : body;
  std::string_view binary = header_length ? body.substr(*header_length) : std::string_view{};
  nlohmann::json j;
  try {
    j = parse_json(header, "the request");
  } catch (const Error& e) {
    bad(std::string("failed to parse the request JSON: ") + e.what());
  }
  if (!j.is_object()) bad("the request must be a JSON object");
  InferRequest r;
  if (j.contains("id")) {
    if (!j["id"].is_string()) bad("\"id\" must be a string");
    r.id = j["id"].get<std::string>();
  }
  r.binary_data_output = parameter<bool>(j, "binary_data_output", "the request").value_or(false);
  if (auto t = parameter<std::int64_t>(j, "timeout", "the request")) r.timeout_us = checked_timeout(*t);
  if (!j.contains("inputs") || !j["inputs"].is_array()) bad("\"inputs\" must be an array");
  if (j.contains("outputs") && !j["outputs"].is_array()) bad("\"outputs\" must be an array");
  check_counts(j["inputs"].size(), j.contains("outputs") ? j["outputs"].size() : 0, limits);
  for (const auto& in : j["inputs"]) {
    const std::string name = name_of(in, limits, "an input");
    const std::string where = "input " + in_quotes(name);
    if (!in.contains("datatype") || !in["datatype"].is_string()) bad(where + ": no \"datatype\"");
    if (!in.contains("shape") || !in["shape"].is_array()) bad(where + ": no \"shape\" array");
    if (static_cast<int>(in["shape"].size()) > limits.max_dims) {
      too_large(where + ": " + std::to_string(in["shape"].size()) + " dimensions, over the limit of " + std::to_string(limits.max_dims));
    }
    std::vector<std::int64_t> shape;
    for (const auto& d : in["shape"]) {
      if (!d.is_number_integer()) bad(where + ": shape entries must be integers of 0 or more");
      shape.push_back(d.get<std::int64_t>());
    }
    Tensor t;
    const std::int64_t elements = declare_input(t, name, in["datatype"].get<std::string>(), shape, limits, r.inputs);
    const auto binary_size = parameter<std::int64_t>(in, "binary_data_size", where);
    t.shared_memory = shared_memory_ref(parameter<std::string>(in, "shared_memory_region", where),
                                        parameter<std::int64_t>(in, "shared_memory_byte_size", where),
                                        parameter<std::int64_t>(in, "shared_memory_offset", where), limits, where);
    if (t.shared_memory) {
      if (binary_size || in.contains("data")) bad(where + ": both shared_memory_region and the tensor's data");
    } else if (binary_size) {
      if (!header_length) bad(where + ": binary_data_size without an Inference-Header-Content-Length header");
      if (in.contains("data")) bad(where + ": both \"data\" and binary_data_size");
      if (*binary_size < 0 || static_cast<std::uint64_t>(*binary_size) > binary.size()) {
        bad(where + ": binary_data_size " + std::to_string(*binary_size) + " is past the " + std::to_string(binary.size()) +
            " bytes of binary data left");
      }
      read_binary_data(t, binary.substr(0, static_cast<std::size_t>(*binary_size)), elements, where);
      binary.remove_prefix(static_cast<std::size_t>(*binary_size));
    } else {
      if (!in.contains("data")) bad(where + ": no \"data\" and no binary_data_size");
      read_json_data(t, in["data"], elements, where);
    }
    r.inputs.push_back(std::move(t));
  }
  if (!binary.empty()) bad(std::to_string(binary.size()) + " bytes of binary data after the last input's");
  if (j.contains("outputs")) {
    for (const auto& out : j["outputs"]) {
      RequestedOutput o;
      o.name = name_of(out, limits, "a requested output");
      const std::string where = "output " + in_quotes(o.name);
      if (parameter<std::string>(out, "shared_memory_region", where)) refuse_shared_memory_output(where);
      o.binary = parameter<bool>(out, "binary_data", where).value_or(r.binary_data_output);
      o.classification = checked_classification(parameter<std::int64_t>(out, "classification", where).value_or(0), where);
      r.outputs.push_back(std::move(o));
    }
  }
  return r;
}

std::string write_infer_response(const InferResponse& r, std::optional<std::size_t>& header_length) {
  nlohmann::json j{{"model_name", r.model_name}, {"model_version", r.model_version}};
  if (!r.id.empty()) j["id"] = r.id;
  std::string tail;
  bool any_binary = false;  // a binary output of no elements still makes the body binary, header length and all
  j["outputs"] = nlohmann::json::array();
  for (std::size_t i = 0; i < r.outputs.size(); ++i) {
    const Tensor& t = r.outputs[i];
    nlohmann::json o{{"name", t.name}, {"datatype", datatype_name(t.datatype)}, {"shape", t.shape}};
    if (i < r.binary.size() && r.binary[i]) {
      const std::string bytes = raw_bytes(t);
      o["parameters"] = {{"binary_data_size", bytes.size()}};
      tail += bytes;
      any_binary = true;
    } else {
      nlohmann::json data = nlohmann::json::array();
      for_each_element(t, [&data](const auto& v) { data.push_back(v); });
      o["data"] = std::move(data);
    }
    j["outputs"].push_back(std::move(o));
  }
  return framed(j, tail, any_binary, header_length);
}

std::string write_infer_request(const InferRequest& r, std::optional<std::size_t>& header_length) {
  nlohmann::json j = nlohmann::json::object();
  if (!r.id.empty()) j["id"] = r.id;
  if (r.binary_data_output) j["parameters"]["binary_data_output"] = true;
  if (r.timeout_us) j["parameters"]["timeout"] = *r.timeout_us;
  std::string tail;
  bool any_binary = false;
  j["inputs"] = nlohmann::json::array();
  for (const auto& t : r.inputs) {
    nlohmann::json in{{"name", t.name}, {"datatype", datatype_name(t.datatype)}, {"shape", t.shape}};
    if (t.shared_memory) {
      in["parameters"] = {{"shared_memory_region", t.shared_memory->region},
                          {"shared_memory_byte_size", t.shared_memory->byte_size}};
      if (t.shared_memory->offset != 0) in["parameters"]["shared_memory_offset"] = t.shared_memory->offset;
    } else {
      const std::string bytes = raw_bytes(t);
      in["parameters"] = {{"binary_data_size", bytes.size()}};
      tail += bytes;
      any_binary = true;
    }
    j["inputs"].push_back(std::move(in));
  }
  if (!r.outputs.empty()) {
    j["outputs"] = nlohmann::json::array();
    for (const auto& o : r.outputs) {
      nlohmann::json out{{"name", o.name}, {"parameters", {{"binary_data", o.binary}}}};
      if (o.classification > 0) out["parameters"]["classification"] = o.classification;
      j["outputs"].push_back(std::move(out));
    }
  }
  return framed(j, tail, any_binary, header_length);
}

InferResponse read_infer_response(std::string_view body, std::optional<std::size_t> header_length,
                                  const Limits& limits) {
  if (header_length && *header_length > body.size()) {
    bad("Inference-Header-Content-Length " + std::to_string(*header_length) + " is past the body's " +
        std::to_string(body.size()) + " bytes");
  }
  std::string_view binary = header_length ? body.substr(*header_length) : std::string_view{};
  nlohmann::json j;
  try {
    j = parse_json(header_length ? body.substr(0, *header_length) : body, "the response");
  } catch (const Error& e) {
    bad(std::string("failed to parse the response JSON: ") + e.what());
  }
  if (!j.is_object()) bad("the response must be a JSON object");
  if (j.contains("error")) bad("the server answered an error: " + j["error"].dump());
  InferResponse r;
  for (auto [key, field] : {std::pair{"model_name", &r.model_name}, std::pair{"model_version", &r.model_version},
                            std::pair{"id", &r.id}}) {
    if (!j.contains(key)) continue;
    if (!j[key].is_string()) bad(std::string("\"") + key + "\" must be a string");
    *field = j[key].get<std::string>();
  }
  if (!j.contains("outputs") || !j["outputs"].is_array()) bad("\"outputs\" must be an array");
  if (j["outputs"].size() > limits.max_outputs) {
    too_large(std::to_string(j["outputs"].size()) + " outputs, over the limit of " + std::to_string(limits.max_outputs));
  }
  for (const auto& out : j["outputs"]) {
    const std::string name = name_of(out, limits, "an output");
    const std::string where = "output " + in_quotes(name);
    if (!out.contains("datatype") || !out["datatype"].is_string()) bad(where + ": no \"datatype\"");
    if (!out.contains("shape") || !out["shape"].is_array()) bad(where + ": no \"shape\" array");
    if (static_cast<int>(out["shape"].size()) > limits.max_dims) {
      too_large(where + ": " + std::to_string(out["shape"].size()) + " dimensions, over the limit of " +
                std::to_string(limits.max_dims));
    }
    std::vector<std::int64_t> shape;
    for (const auto& d : out["shape"]) {
      if (!d.is_number_integer()) bad(where + ": shape entries must be integers of 0 or more");
      shape.push_back(d.get<std::int64_t>());
    }
    Tensor t;
    const std::int64_t elements =
        declare_tensor(t, "output", name, out["datatype"].get<std::string>(), shape, limits, r.outputs);
    const auto binary_size = parameter<std::int64_t>(out, "binary_data_size", where);
    if (binary_size) {
      if (out.contains("data")) bad(where + ": both \"data\" and binary_data_size");
      if (*binary_size < 0 || static_cast<std::uint64_t>(*binary_size) > binary.size()) {
        bad(where + ": binary_data_size " + std::to_string(*binary_size) + " is past the " +
            std::to_string(binary.size()) + " bytes of binary data left");
      }
      read_binary_data(t, binary.substr(0, static_cast<std::size_t>(*binary_size)), elements, where);
      binary.remove_prefix(static_cast<std::size_t>(*binary_size));
    } else {
      if (!out.contains("data")) bad(where + ": no \"data\" and no binary_data_size");
      if (t.datatype == DataType::Fp16) {
        // As numbers in the JSON: read as FP32, stored as the halves they were written from.
        Tensor wide = t;
        wide.datatype = DataType::Fp32;
        read_json_data(wide, out["data"], elements, where);
        for_each_element(wide, [&t](const auto& v) {
          if constexpr (std::is_arithmetic_v<std::decay_t<decltype(v)>>) append<std::uint16_t>(t.data, float_to_half(v));
        });
      } else {
        read_json_data(t, out["data"], elements, where);
      }
    }
    r.binary.push_back(binary_size.has_value());
    r.outputs.push_back(std::move(t));
  }
  if (!binary.empty()) bad(std::to_string(binary.size()) + " bytes of binary data after the last output's");
  return r;
}

std::vector<double> tensor_values(const Tensor& t) {
  if (t.datatype == DataType::Bytes) throw Error("tensor " + in_quotes(t.name) + ": BYTES elements are not numbers");
  std::vector<double> values;
  for_each_element(t, [&values](const auto& v) {
    if constexpr (std::is_arithmetic_v<std::decay_t<decltype(v)>>) values.push_back(static_cast<double>(v));
  });
  return values;
}

int http_status_of(const Error& e) {
  const auto* p = dynamic_cast<const ProtocolError*>(&e);
  return p ? p->status() : 400;
}

std::string error_body(const std::string& message) { return dump_json(nlohmann::json{{"error", message}}); }

}  // namespace convnets::kserve
