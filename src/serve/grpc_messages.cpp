#include "serve/grpc_messages.h"

#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>

namespace convnets::serve {
namespace {

[[noreturn]] void bad(const std::string& what) { throw ProtocolError(400, what); }

// `values` (a typed contents field) packed as the tensor's little-endian elements, each checked to fit the type.
template <typename T, typename Values>
void pack(Tensor& t, const Values& values, const std::string& where) {
  t.data.resize(static_cast<std::size_t>(values.size()) * sizeof(T));
  char* out = t.data.data();
  for (const auto v : values) {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      using V = std::decay_t<decltype(v)>;
      const bool fits = std::is_signed_v<V> == std::is_signed_v<T>
                            ? v >= static_cast<V>(std::numeric_limits<T>::min()) && v <= static_cast<V>(std::numeric_limits<T>::max())
                            : v <= static_cast<V>(std::numeric_limits<T>::max());
      if (!fits) bad(where + ": the value " + std::to_string(v) + " does not fit its datatype");
    }
    const T e = static_cast<T>(v);
    std::memcpy(out, &e, sizeof(T));
    out += sizeof(T);
  }
}

// An input's typed contents (the protocol's alternative to raw bytes) as the tensor's elements.
void read_contents(Tensor& t, const inference::InferTensorContents& c, std::int64_t expected, const std::string& where) {
  std::int64_t n = 0;
  switch (t.datatype) {
    case DataType::Bool: n = c.bool_contents_size(), pack<std::uint8_t>(t, c.bool_contents(), where); break;
    case DataType::UInt8: n = c.uint_contents_size(), pack<std::uint8_t>(t, c.uint_contents(), where); break;
    case DataType::UInt16: n = c.uint_contents_size(), pack<std::uint16_t>(t, c.uint_contents(), where); break;
    case DataType::UInt32: n = c.uint_contents_size(), pack<std::uint32_t>(t, c.uint_contents(), where); break;
    case DataType::UInt64: n = c.uint64_contents_size(), pack<std::uint64_t>(t, c.uint64_contents(), where); break;
    case DataType::Int8: n = c.int_contents_size(), pack<std::int8_t>(t, c.int_contents(), where); break;
    case DataType::Int16: n = c.int_contents_size(), pack<std::int16_t>(t, c.int_contents(), where); break;
    case DataType::Int32: n = c.int_contents_size(), pack<std::int32_t>(t, c.int_contents(), where); break;
    case DataType::Int64: n = c.int64_contents_size(), pack<std::int64_t>(t, c.int64_contents(), where); break;
    case DataType::Fp32: n = c.fp32_contents_size(), pack<float>(t, c.fp32_contents(), where); break;
    case DataType::Fp64: n = c.fp64_contents_size(), pack<double>(t, c.fp64_contents(), where); break;
    case DataType::Fp16: bad(where + ": FP16 has no typed contents; send it as raw_input_contents");
    case DataType::Bytes:
      n = c.bytes_contents_size();
      t.elements.assign(c.bytes_contents().begin(), c.bytes_contents().end());
      break;
  }
  if (n != expected) {
    bad(where + ": contents hold " + std::to_string(n) + " elements, the shape " + std::to_string(expected));
  }
}

template <typename Map>
const inference::InferParameter* parameter(const Map& parameters, const char* key) {
  const auto it = parameters.find(key);
  return it == parameters.end() ? nullptr : &it->second;
}

std::int64_t int_parameter(const inference::InferParameter& p, const char* key, const std::string& where) {
  if (p.parameter_choice_case() == inference::InferParameter::kInt64Param) return p.int64_param();
  if (p.parameter_choice_case() == inference::InferParameter::kUint64Param &&
      p.uint64_param() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(p.uint64_param());
  }
  bad(where + ": parameter \"" + key + "\" must be an integer");
}

template <typename Map>
std::optional<std::int64_t> int_of(const Map& parameters, const char* key, const std::string& where) {
  const auto* p = parameter(parameters, key);
  return p ? std::optional<std::int64_t>(int_parameter(*p, key, where)) : std::nullopt;
}

template <typename Map>
std::optional<std::string> string_of(const Map& parameters, const char* key, const std::string& where) {
  const auto* p = parameter(parameters, key);
  if (!p) return std::nullopt;
  if (p->parameter_choice_case() != inference::InferParameter::kStringParam) {
    bad(where + ": parameter \"" + key + "\" must be a string");
  }
  return p->string_param();
}

// The checks and the form of parse_infer_request (kserve.h), from the gRPC message.
}  // namespace

InferRequest request_of(const inference::ModelInferRequest& m, const Limits& limits) {
  InferRequest r;
  r.id = m.id();
  check_counts(static_cast<std::size_t>(m.inputs_size()), static_cast<std::size_t>(m.outputs_size()), limits);
  // Raw contents are one entry per input that does not name a shared-memory region, in the inputs' order (as
  // tritonclient sends them and Triton reads them).
  const bool raw = m.raw_input_contents_size() > 0;
  int in_memory = 0;
  for (const auto& in : m.inputs()) in_memory += in.parameters().count("shared_memory_region") == 0;
  if (raw && m.raw_input_contents_size() != in_memory) {
    bad("raw_input_contents holds " + std::to_string(m.raw_input_contents_size()) + " entries for " +
        std::to_string(in_memory) + " inputs not in shared memory");
  }
  int next_raw = 0;
  for (int i = 0; i < m.inputs_size(); ++i) {
    const auto& in = m.inputs(i);
    Tensor t;
    const std::vector<std::int64_t> shape(in.shape().begin(), in.shape().end());
    const std::int64_t elements = declare_input(t, in.name(), in.datatype(), shape, limits, r.inputs);
    const std::string where = "input " + in_quotes(in.name());
    t.shared_memory = shared_memory_ref(string_of(in.parameters(), "shared_memory_region", where),
                                        int_of(in.parameters(), "shared_memory_byte_size", where),
                                        int_of(in.parameters(), "shared_memory_offset", where), limits, where);
    if (t.shared_memory) {
      if (in.has_contents()) bad(where + ": both shared_memory_region and contents");
    } else if (raw) {
      if (in.has_contents()) bad(where + ": both contents and raw_input_contents");
      read_binary_data(t, m.raw_input_contents(next_raw++), elements, where);
    } else {
      if (!in.has_contents()) bad(where + ": no contents and no raw_input_contents");
      read_contents(t, in.contents(), elements, where);
    }
    r.inputs.push_back(std::move(t));
  }
  if (const auto* p = parameter(m.parameters(), "timeout")) {
    r.timeout_us = checked_timeout(int_parameter(*p, "timeout", "the request"));
  }
  for (const auto& out : m.outputs()) {
    check_name(out.name(), limits, "a requested output");
    RequestedOutput o;
    o.name = out.name();
    o.binary = true;  // gRPC answers in raw_output_contents, as Triton does
    if (out.parameters().count("shared_memory_region")) refuse_shared_memory_output("output " + in_quotes(o.name));
    if (const auto* p = parameter(out.parameters(), "classification")) {
      const std::string where = "output " + in_quotes(o.name);
      o.classification = checked_classification(int_parameter(*p, "classification", where), where);
    }
    r.outputs.push_back(std::move(o));
  }
  return r;
}

void fill(const InferResponse& r, inference::ModelInferResponse& m) {
  m.set_model_name(r.model_name);
  m.set_model_version(r.model_version);
  m.set_id(r.id);
  for (const auto& t : r.outputs) {
    auto* o = m.add_outputs();
    o->set_name(t.name);
    o->set_datatype(datatype_name(t.datatype));
    for (const auto d : t.shape) o->add_shape(d);
    *m.add_raw_output_contents() = raw_bytes(t);
  }
}

GrpcInfer parse_grpc_infer_request(std::string_view serialized, const Limits& limits) {
  if (serialized.size() > limits.max_body_bytes) {
    throw ProtocolError(413, "the message is " + std::to_string(serialized.size()) + " bytes, over the limit of " +
                                 std::to_string(limits.max_body_bytes));
  }
  inference::ModelInferRequest m;
  if (!m.ParseFromArray(serialized.data(), static_cast<int>(serialized.size()))) bad("not a ModelInferRequest message");
  return {m.model_name(), m.model_version(), request_of(m, limits)};
}

}  // namespace convnets::serve
