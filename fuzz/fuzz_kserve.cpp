// Fuzz target: the KServe v2 / Triton infer request body (kserve/messages.h), JSON and binary tensors, and both
// directions back: the request written again as a client writes it (it must parse to what it was), and the response
// written from what parsed (it must read back to what was written). First byte: bit 0 set, the next two (little-endian) are the
// Inference-Header-Content-Length; the rest is the body. With bit 1 set (and FUZZ_GRPC built), the rest is a
// serialized gRPC ModelInferRequest instead (serve/grpc_messages.h), its response serialized and read back.
#include "kserve/messages.h"
#ifdef FUZZ_GRPC
#include "serve/grpc_messages.h"
#endif

#include <nlohmann/json.hpp>

#include <cstdlib>

using namespace convnets::kserve;
#ifdef FUZZ_GRPC
using namespace convnets::serve;
#endif

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  std::optional<std::size_t> header;
  if (data[0] & 1) header = static_cast<std::size_t>(data[1] | (data[2] << 8));
  const std::string_view body(reinterpret_cast<const char*>(data + 3), size - 3);
  Limits limits;
  limits.max_elements = 1 << 20;
  InferRequest r;
  const bool grpc = (data[0] & 2) != 0;
  try {
#ifdef FUZZ_GRPC
    if (grpc) r = parse_grpc_infer_request(body, limits).request;
#endif
    if (!grpc) r = parse_infer_request(body, header, limits);
  } catch (const ProtocolError& e) {
    if (e.status() != 400 && e.status() != 413) std::abort();
    return 0;
  }
  // Every tensor that parsed holds exactly its shape's elements (or names the region that holds them).
  for (const auto& t : r.inputs) {
    if (t.shared_memory) continue;
    const auto n = t.element_count();
    if (t.datatype == DataType::Bytes ? static_cast<std::int64_t>(t.elements.size()) != n
                                      : t.data.size() != static_cast<std::size_t>(n) * element_size(t.datatype)) {
      std::abort();
    }
  }
#ifdef FUZZ_GRPC
  if (grpc) {
    // Written back as the gRPC response: it must read back with each output's raw bytes as written.
    InferResponse out;
    out.model_name = "fuzz";
    out.outputs = r.inputs;
    inference::ModelInferResponse m;
    fill(out, m);
    inference::ModelInferResponse back;
    if (!back.ParseFromString(m.SerializeAsString())) std::abort();
    if (back.outputs_size() != static_cast<int>(out.outputs.size()) || back.raw_output_contents_size() != back.outputs_size()) {
      std::abort();
    }
    for (int i = 0; i < back.outputs_size(); ++i) {
      const auto& t = out.outputs[static_cast<std::size_t>(i)];
      std::size_t want = t.data.size();
      if (t.datatype == DataType::Bytes) {
        want = 0;
        for (const auto& e : t.elements) want += 4 + e.size();
      }
      if (back.raw_output_contents(i).size() != want) std::abort();
    }
    return 0;
  }
#endif
  // Written again as a client writes it: it parses to the same request.
  std::optional<std::size_t> length;
  const InferRequest again = parse_infer_request(write_infer_request(r, length), length, limits);
  if (again.inputs.size() != r.inputs.size() || again.outputs.size() != r.outputs.size()) std::abort();
  for (std::size_t i = 0; i < r.inputs.size(); ++i) {
    const auto &a = r.inputs[i], &b = again.inputs[i];
    if (a.name != b.name || a.datatype != b.datatype || a.shape != b.shape || a.data != b.data ||
        a.elements != b.elements || a.shared_memory.has_value() != b.shared_memory.has_value()) {
      std::abort();
    }
  }
  // Written back as a response, JSON and binary: the JSON part must parse, binary sizes must add up, and it reads
  // back to the outputs written (JSON numbers exactly, where finite: JSON has no NaN; BYTES as JSON where UTF-8).
  InferResponse out;
  out.model_name = "fuzz";
  out.outputs = r.inputs;
  for (auto& t : out.outputs) t.shared_memory.reset();
  for (std::size_t i = 0; i < out.outputs.size(); ++i) out.binary.push_back((i + data[0]) % 2 == 0);
  const std::string text = write_infer_response(out, length);
  const auto j = nlohmann::json::parse(length ? text.substr(0, *length) : text);
  std::size_t binary = 0;
  for (const auto& o : j["outputs"]) {
    if (o.contains("parameters")) binary += o["parameters"]["binary_data_size"].get<std::size_t>();
  }
  if (binary != (length ? text.size() - *length : 0)) std::abort();
  InferResponse read;
  try {
    read = read_infer_response(text, length, limits);
  } catch (const ProtocolError&) {
    // A JSON output that cannot come back: a NaN or infinity (written as null), or a string that is not UTF-8.
    return 0;
  }
  if (read.outputs.size() != out.outputs.size() || read.binary != out.binary) std::abort();
  for (std::size_t i = 0; i < out.outputs.size(); ++i) {
    const auto &a = out.outputs[i], &b = read.outputs[i];
    if (a.name != b.name || a.datatype != b.datatype || a.shape != b.shape) std::abort();
    if (out.binary[i] && (a.data != b.data || a.elements != b.elements)) std::abort();
  }
  return 0;
}
