// Triton's gRPC infer messages and the server's own request and response (kserve.h): the conversion both ways, with the HTTP protocol's checks, protobuf alone (no gRPC runtime), so the fuzzer reaches it.
#pragma once

#include "kserve/messages.h"
#include "kserve/triton_grpc.pb.h"

#include <string>
#include <string_view>

namespace convnets::serve {

// The server speaks the protocol kserve/messages.h reads and writes.
using namespace kserve;

// The request as parse_infer_request gives it from an HTTP body: the same checks, ProtocolError the same way.
// Typed contents are packed as raw bytes would be; every output comes back as raw contents (binary), as Triton's.
InferRequest request_of(const inference::ModelInferRequest& m, const Limits& limits);

// The response's outputs as raw_output_contents (BYTES as 4-byte lengths, each followed by its bytes).
void fill(const InferResponse& r, inference::ModelInferResponse& m);

// A serialized ModelInferRequest as the service reads it: the model it names, and the request in the form the
// HTTP front end parses its body into (the same checks, ProtocolError the same way). For the fuzzer.
struct GrpcInfer {
  std::string model, version;
  InferRequest request;
};
GrpcInfer parse_grpc_infer_request(std::string_view serialized, const Limits& limits);

}  // namespace convnets::serve
