// The KServe v2 (Triton) inference protocol's HTTP bodies, both directions: a server's (requests parsed under limits, JSON or Triton's binary tensor extension; responses written) and a client's (requests written, responses read).
#pragma once

#include "core/error.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace convnets::kserve {

// The protocol's tensor datatypes (KServe v2 "Tensor Data Types").
enum class DataType { Bool, UInt8, UInt16, UInt32, UInt64, Int8, Int16, Int32, Int64, Fp16, Fp32, Fp64, Bytes };
std::optional<DataType> datatype_of(std::string_view name);
const char* datatype_name(DataType t);
std::size_t element_size(DataType t);  // bytes per element; 0 for BYTES

// Where an input's bytes wait instead (Triton's system shared-memory extension): `byte_size` bytes at `offset`
// into the region a client registered under `region` (SharedMemoryRegions binds and reads it into the tensor's data).
struct SharedMemoryRef {
  std::string region;
  std::uint64_t offset = 0;
  std::uint64_t byte_size = 0;
};

struct Tensor {
  std::string name;
  DataType datatype = DataType::Fp32;
  std::vector<std::int64_t> shape;
  std::string data;                   // fixed-size types: the elements little-endian, row-major, packed
  std::vector<std::string> elements;  // BYTES: one string per element (an encoded image, a label line)
  std::optional<SharedMemoryRef> shared_memory;  // set: data/elements are still to be read from the region
  std::int64_t element_count() const;
};

// One entry of a request's "outputs": which output, in what form. `classification` > 0 asks for Triton's
// classification extension: the top k as "score:index[:label]" strings instead of the tensor.
struct RequestedOutput {
  std::string name;
  bool binary = false;
  std::int64_t classification = 0;
};

struct InferRequest {
  std::string id;
  std::vector<Tensor> inputs;
  std::vector<RequestedOutput> outputs;  // empty: every output
  bool binary_data_output = false;       // parameters.binary_data_output: outputs not named come back binary
  std::optional<std::int64_t> timeout_us;  // parameters.timeout (Triton's), microseconds
};

// What one request may hold. The HTTP layer bounds the body before it is read; these bound what it declares.
struct Limits {
  std::size_t max_body_bytes = std::size_t{64} << 20;
  std::size_t max_inputs = 16;
  std::size_t max_outputs = 16;
  int max_dims = 8;
  std::int64_t max_elements = std::int64_t{1} << 26;  // per tensor
  std::size_t max_name_bytes = 256;
};

// A request the protocol or the limits refuse. `status` is the HTTP status Triton answers with (400 for a
// malformed or inconsistent request, 413 for one over a size limit); what() is the error text.
class ProtocolError : public Error {
 public:
  ProtocolError(int status, const std::string& what) : Error(what), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

// The HTTP status a failed request is answered with: a protocol error's own, else 400 (the request could not be
// served as it was).
int http_status_of(const Error& e);

// `body` is the HTTP body; `header_length` the Inference-Header-Content-Length header when the request carries
// binary tensors (the JSON is then the body's first header_length bytes, the tensors' bytes follow in the
// order of the inputs that declare parameters.binary_data_size). Throws ProtocolError.
InferRequest parse_infer_request(std::string_view body, std::optional<std::size_t> header_length,
                                 const Limits& limits = {});

// The checks of a request's own fields that both protocols make, each written once: the same message over HTTP and
// gRPC, HTTP answering the status and gRPC its code for it.
// The input and output counts, before any is read: none (400), or more than the limits (413).
void check_counts(std::size_t inputs, std::size_t outputs, const Limits& limits);
// parameters.timeout, in microseconds: 0 or more (ProtocolError 400).
std::int64_t checked_timeout(std::int64_t us);
// An output's parameters.classification, the top k asked: 0 or more (ProtocolError 400 naming `where`, the output).
std::int64_t checked_classification(std::int64_t k, const std::string& where);

// A tensor's name, 1..limits.max_name_bytes bytes (ProtocolError 400 naming `where` otherwise).
void check_name(const std::string& name, const Limits& limits, const std::string& where);

// One input as either protocol declares it: its name, datatype and shape checked against the limits and against
// the inputs before it (ProtocolError naming it: 400, or 413 for a size), set into `t`; returns its element count.
std::int64_t declare_input(Tensor& t, const std::string& name, std::string_view datatype,
                           const std::vector<std::int64_t>& shape, const Limits& limits, const std::vector<Tensor>& earlier);
// The same for an output of a response (`kind` "output"), or any tensor.
std::int64_t declare_tensor(Tensor& t, const std::string& kind, const std::string& name, std::string_view datatype,
                            const std::vector<std::int64_t>& shape, const Limits& limits,
                            const std::vector<Tensor>& earlier);

// A declared input's elements from the protocol's raw bytes (KServe's binary data, the gRPC raw contents):
// fixed-size types packed little-endian, BYTES as 4-byte little-endian lengths each followed by its bytes.
// ProtocolError (400, naming `where`) when they do not hold exactly `expected` elements.
void read_binary_data(Tensor& t, std::string_view bytes, std::int64_t expected, const std::string& where);

// An input's shared-memory parameters as either protocol names them (shared_memory_region, _byte_size, _offset):
// none without a region, else checked (ProtocolError 400 naming `where`: a size or offset without a region, no
// size, a negative one). The region itself is looked up when the request is admitted (SharedMemoryRegions::bind).
std::optional<SharedMemoryRef> shared_memory_ref(std::optional<std::string> region, std::optional<std::int64_t> byte_size,
                                                 std::optional<std::int64_t> offset, const Limits& limits,
                                                 const std::string& where);

// ProtocolError 400 for an output asked into shared memory, naming it (`where`): the server does not write there.
[[noreturn]] void refuse_shared_memory_output(const std::string& where);

// The other way: a tensor's contents as both protocols carry them raw (its data, or BYTES elements each after a
// 4-byte little-endian length).
std::string raw_bytes(const Tensor& t);

// A name as errors quote it: in single quotes, bytes that are not UTF-8 escaped.
std::string in_quotes(const std::string& name);

// The value of an Inference-Header-Content-Length header: a decimal count, or ProtocolError 400.
std::size_t parse_header_length(std::string_view value);

struct InferResponse {
  std::string model_name, model_version, id;
  std::vector<Tensor> outputs;
  std::vector<bool> binary;  // per output: its bytes after the JSON instead of "data"
};

// The response body; `header_length` is set to the JSON's length when any output is binary (the server then
// sends Inference-Header-Content-Length), and reset otherwise.
std::string write_infer_response(const InferResponse& r, std::optional<std::size_t>& header_length);

// {"error": MESSAGE}, the protocol's error body.
std::string error_body(const std::string& message);

// The client's direction, as tritonclient's HTTP client writes and reads the same bodies.
// A request's body: its JSON, then the bytes of each input that carries them (binary_data_size), in input order;
// an input that names shared memory sends its region, size and offset only. Each output asks binary_data as its
// RequestedOutput says. `header_length` is set to the JSON's length where bytes follow it (the client then sends
// Inference-Header-Content-Length), and reset otherwise. parse_infer_request reads back what this writes.
std::string write_infer_request(const InferRequest& r, std::optional<std::size_t>& header_length);

// A response body as write_infer_response (or Triton) writes it: each output's tensor, from its bytes after the JSON
// or its JSON "data" (an FP16 output's numbers stored as halves), `binary` saying which. ProtocolError (400, 413
// over `limits`) naming what is malformed; an {"error": ...} body is one, with the server's message.
InferResponse read_infer_response(std::string_view body, std::optional<std::size_t> header_length,
                                  const Limits& limits = {});

// A tensor's elements as numbers, whatever its numeric datatype (FP16's halves widened); Error for BYTES.
std::vector<double> tensor_values(const Tensor& t);

}  // namespace convnets::kserve
