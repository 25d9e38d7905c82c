#include "bench/grpc_client.h"

#include "core/error.h"
#include "kserve/triton_grpc.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <limits>

namespace convnets::bench {
namespace {

using inference::GRPCInferenceService;

const char* code_name(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    default: return "UNKNOWN";
  }
}

void check(const grpc::Status& s, const std::string& what) {
  if (!s.ok()) throw Error(what + ": " + code_name(s.error_code()) + " " + s.error_message());
}

// As tritonclient builds it: each input's bytes one raw_input_contents entry, in input order, those in shared
// memory named by the three parameters instead.
inference::ModelInferRequest message_of(const std::string& model, const kserve::InferRequest& r) {
  inference::ModelInferRequest m;
  m.set_model_name(model);
  m.set_id(r.id);
  for (const auto& t : r.inputs) {
    auto* in = m.add_inputs();
    in->set_name(t.name);
    in->set_datatype(kserve::datatype_name(t.datatype));
    for (const auto d : t.shape) in->add_shape(d);
    if (t.shared_memory) {
      auto& p = *in->mutable_parameters();
      p["shared_memory_region"].set_string_param(t.shared_memory->region);
      p["shared_memory_byte_size"].set_int64_param(static_cast<std::int64_t>(t.shared_memory->byte_size));
      p["shared_memory_offset"].set_int64_param(static_cast<std::int64_t>(t.shared_memory->offset));
    } else {
      *m.add_raw_input_contents() = kserve::raw_bytes(t);
    }
  }
  for (const auto& o : r.outputs) {
    auto* out = m.add_outputs();
    out->set_name(o.name);
    if (o.classification > 0) (*out->mutable_parameters())["classification"].set_int64_param(o.classification);
  }
  return m;
}

// The answer's outputs as the HTTP side reads them: fixed-size types from their raw bytes.
kserve::InferResponse response_of(const inference::ModelInferResponse& m) {
  kserve::InferResponse r;
  r.model_name = m.model_name(), r.model_version = m.model_version(), r.id = m.id();
  for (int i = 0; i < m.outputs_size(); ++i) {
    const auto& o = m.outputs(i);
    kserve::Tensor t;
    const std::vector<std::int64_t> shape(o.shape().begin(), o.shape().end());
    const auto elements = kserve::declare_tensor(t, "output", o.name(), o.datatype(), shape, kserve::Limits{}, {});
    if (i >= m.raw_output_contents_size()) throw Error("output " + o.name() + " came without raw contents");
    kserve::read_binary_data(t, m.raw_output_contents(i), elements, "output " + o.name());
    r.outputs.push_back(std::move(t));
    r.binary.push_back(true);
  }
  return r;
}

}  // namespace

struct GrpcRequests::Impl {
  std::vector<inference::ModelInferRequest> messages;
};

GrpcRequests::GrpcRequests(const std::string& model, const std::vector<kserve::InferRequest>& requests)
    : impl_(std::make_unique<Impl>()) {
  for (const auto& r : requests) impl_->messages.push_back(message_of(model, r));
}
GrpcRequests::~GrpcRequests() = default;
std::size_t GrpcRequests::size() const { return impl_->messages.size(); }

struct GrpcClient::Impl {
  std::string target;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<GRPCInferenceService::Stub> stub;
};

GrpcClient::GrpcClient(const std::string& target) : impl_(std::make_unique<Impl>()) {
  impl_->target = target;
  grpc::ChannelArguments args;
  // Each client thread its own connection, as each HTTP client has its own socket: channels to one target
  // would otherwise share a subchannel.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(std::numeric_limits<int>::max());
  args.SetMaxSendMessageSize(std::numeric_limits<int>::max());
  impl_->channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  impl_->stub = GRPCInferenceService::NewStub(impl_->channel);
}
GrpcClient::~GrpcClient() = default;

void GrpcClient::connect(double seconds) {
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(seconds));
  if (!impl_->channel->WaitForConnected(deadline)) {
    throw Error("no gRPC connection to " + impl_->target + " within " + std::to_string(static_cast<int>(seconds)) + " s");
  }
}

std::string GrpcClient::infer(const GrpcRequests& requests, std::size_t which, kserve::InferResponse* out) {
  grpc::ClientContext ctx;
  inference::ModelInferResponse response;
  const auto s = impl_->stub->ModelInfer(&ctx, requests.impl_->messages.at(which), &response);
  if (!s.ok()) return code_name(s.error_code());
  if (out) *out = response_of(response);
  return "";
}

nlohmann::json GrpcClient::model_metadata(const std::string& model) {
  grpc::ClientContext ctx;
  inference::ModelMetadataRequest in;
  in.set_name(model);
  inference::ModelMetadataResponse m;
  check(impl_->stub->ModelMetadata(&ctx, in, &m), "model " + model + "'s metadata");
  const auto tensors = [](const auto& list) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& t : list) {
      out.push_back({{"name", t.name()},
                     {"datatype", t.datatype()},
                     {"shape", std::vector<std::int64_t>(t.shape().begin(), t.shape().end())}});
    }
    return out;
  };
  return {{"name", m.name()}, {"inputs", tensors(m.inputs())}, {"outputs", tensors(m.outputs())}};
}

std::vector<std::string> GrpcClient::model_names() {
  grpc::ClientContext ctx;
  inference::RepositoryIndexResponse index;
  check(impl_->stub->RepositoryIndex(&ctx, inference::RepositoryIndexRequest{}, &index), "the server's repository index");
  std::vector<std::string> names;
  for (const auto& m : index.models()) names.push_back(m.name());
  return names;
}

void GrpcClient::register_region(const std::string& name, const std::string& key, std::uint64_t offset,
                                 std::uint64_t size) {
  grpc::ClientContext ctx;
  inference::SystemSharedMemoryRegisterRequest in;
  in.set_name(name), in.set_key(key), in.set_offset(offset), in.set_byte_size(size);
  inference::SystemSharedMemoryRegisterResponse out;
  check(impl_->stub->SystemSharedMemoryRegister(&ctx, in, &out), "registering shared-memory region " + name);
}

void GrpcClient::unregister_region(const std::string& name) {
  grpc::ClientContext ctx;
  inference::SystemSharedMemoryUnregisterRequest in;
  in.set_name(name);
  inference::SystemSharedMemoryUnregisterResponse out;
  check(impl_->stub->SystemSharedMemoryUnregister(&ctx, in, &out), "unregistering shared-memory region " + name);
}

}  // namespace convnets::bench
