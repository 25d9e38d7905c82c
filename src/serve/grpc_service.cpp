#include "serve/grpc_service.h"

#include "serve/grpc_messages.h"
#include "serve/serving_core.h"
#include "kserve/triton_grpc.grpc.pb.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <limits>

namespace convnets::serve {
namespace {

using inference::GRPCInferenceService;

// The HTTP status the server's core answers with, as the gRPC code Triton gives for the same failure.
grpc::Status status_of(int http, const std::string& message) {
  switch (http) {
    case 404: return {grpc::StatusCode::NOT_FOUND, message};
    case 408: return {grpc::StatusCode::DEADLINE_EXCEEDED, message};
    case 413: return {grpc::StatusCode::RESOURCE_EXHAUSTED, message};
    case 503: return {grpc::StatusCode::UNAVAILABLE, message};
    case 400: case 411: case 415: return {grpc::StatusCode::INVALID_ARGUMENT, message};
    case 501: return {grpc::StatusCode::UNIMPLEMENTED, message};
    default: return {grpc::StatusCode::INTERNAL, message};
  }
}

// One of the server's JSON bodies as the message of the same fields (Triton's HTTP and gRPC protocols share
// them); fields the message does not carry are skipped.
template <typename Message>
grpc::Status from_json(const std::string& json, Message& m) {
  google::protobuf::util::JsonParseOptions o;
  o.ignore_unknown_fields = true;
  const auto s = google::protobuf::util::JsonStringToMessage(json, &m, o);
  return s.ok() ? grpc::Status::OK : grpc::Status(grpc::StatusCode::INTERNAL, "the server's answer: " + s.ToString());
}

class Service final : public GRPCInferenceService::CallbackService {
 public:
  Service(ServingCore& core, const GrpcOptions& o) : core_(core), limits_(o.limits), restricted_(o.restricted) {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx, const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse* out) override {
    if (auto refused = restricted(ctx, ApiGroup::Health); !refused.ok()) return finish(ctx, refused);
    out->set_live(true);
    return finish(ctx, grpc::Status::OK);
  }
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx, const inference::ServerReadyRequest*,
                                        inference::ServerReadyResponse* out) override {
    if (auto refused = restricted(ctx, ApiGroup::Health); !refused.ok()) return finish(ctx, refused);
    out->set_ready(core_.ready());
    return finish(ctx, grpc::Status::OK);
  }
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx, const inference::ModelReadyRequest* in,
                                       inference::ModelReadyResponse* out) override {
    if (auto refused = restricted(ctx, ApiGroup::Health); !refused.ok()) return finish(ctx, refused);
    out->set_ready(core_.ready() && core_.find_model(in->name(), in->version()).empty());
    return finish(ctx, grpc::Status::OK);
  }
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx, const inference::ServerMetadataRequest*,
                                           inference::ServerMetadataResponse* out) override {
    if (auto refused = restricted(ctx, ApiGroup::Metadata); !refused.ok()) return finish(ctx, refused);
    return finish(ctx, from_json(core_.server_metadata(), *out));
  }
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx, const inference::ModelMetadataRequest* in,
                                          inference::ModelMetadataResponse* out) override {
    if (auto refused = restricted(ctx, ApiGroup::Metadata); !refused.ok()) return finish(ctx, refused);
    if (auto missing = core_.find_model(in->name(), in->version()); !missing.empty()) {
      return finish(ctx, status_of(404, missing));
    }
    return finish(ctx, model_call([&] { return from_json(core_.model_metadata(in->name()), *out); }));
  }
  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* ctx, const inference::ModelConfigRequest* in,
                                        inference::ModelConfigResponse* out) override {
    if (auto refused = restricted(ctx, ApiGroup::ModelConfig); !refused.ok()) return finish(ctx, refused);
    if (auto missing = core_.find_model(in->name(), in->version()); !missing.empty()) {
      return finish(ctx, status_of(404, missing));
    }
    return finish(ctx, model_call([&] { return from_json("{\"config\":" + core_.model_config(in->name()) + "}", *out); }));
  }
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* ctx, const inference::RepositoryIndexRequest* in,
                                            inference::RepositoryIndexResponse* out) override {
    if (auto refused = restricted(ctx, ApiGroup::ModelRepository); !refused.ok()) return finish(ctx, refused);
    if (auto named = one_repository(in->repository_name()); !named.ok()) return finish(ctx, named);
    return finish(ctx, from_json("{\"models\":" + core_.repository_index(in->ready()) + "}", *out));
  }
  // Answered from the core's control thread once the load is done (seconds): gRPC's thread does not wait.
  grpc::ServerUnaryReactor* RepositoryModelLoad(grpc::CallbackServerContext* ctx,
                                                const inference::RepositoryModelLoadRequest* in,
                                                inference::RepositoryModelLoadResponse*) override {
    if (auto refused = restricted(ctx, ApiGroup::ModelRepository); !refused.ok()) return finish(ctx, refused);
    if (auto named = one_repository(in->repository_name()); !named.ok()) return finish(ctx, named);
    LoadRequest request;
    using P = inference::ModelRepositoryParameter;
    for (const auto& [key, value] : in->parameters()) {
      // Triton's texts for a parameter of the wrong kind (grpc_server.cc).
      if (key == "config") {
        if (value.parameter_choice_case() != P::kStringParam) {
          return finish(ctx, status_of(400, "invalid value type for load parameter 'config', expected string_param."));
        }
        request.has_config = true;
        request.config = value.string_param();
      } else if (key.rfind("file:", 0) == 0) {
        if (value.parameter_choice_case() != P::kBytesParam) {
          return finish(ctx, status_of(400, "invalid value type for load parameter '" + key + "', expected bytes_param."));
        }
        request.files.emplace_back(key, value.bytes_param());
      } else {
        return finish(ctx, status_of(400, "unrecognized load parameter '" + key + "'."));
      }
    }
    auto* reactor = ctx->DefaultReactor();
    core_.load_model(in->model_name(), std::move(request),
                     [reactor](ControlResult r) { reactor->Finish(r.status == 200 ? grpc::Status::OK : status_of(r.status, r.message)); });
    return reactor;
  }
  grpc::ServerUnaryReactor* RepositoryModelUnload(grpc::CallbackServerContext* ctx,
                                                  const inference::RepositoryModelUnloadRequest* in,
                                                  inference::RepositoryModelUnloadResponse*) override {
    if (auto refused = restricted(ctx, ApiGroup::ModelRepository); !refused.ok()) return finish(ctx, refused);
    if (auto named = one_repository(in->repository_name()); !named.ok()) return finish(ctx, named);
    const auto dependents = in->parameters().find("unload_dependents");
    if (dependents != in->parameters().end() &&
        dependents->second.parameter_choice_case() != inference::ModelRepositoryParameter::kBoolParam) {
      return finish(ctx, status_of(400, "invalid value type for 'unload_dependents' parameter, expected bool_param."));
    }
    auto* reactor = ctx->DefaultReactor();
    core_.unload_model(in->model_name(), [reactor](ControlResult r) {
      reactor->Finish(r.status == 200 ? grpc::Status::OK : status_of(r.status, r.message));
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* SystemSharedMemoryStatus(grpc::CallbackServerContext* ctx,
                                                     const inference::SystemSharedMemoryStatusRequest* in,
                                                     inference::SystemSharedMemoryStatusResponse* out) override {
    if (auto refused = restricted(ctx, ApiGroup::SharedMemory); !refused.ok()) return finish(ctx, refused);
    return finish(ctx, shared_memory_call([&] {
                    for (const auto& s : core_.shared_memory().status(in->name())) {
                      auto& r = (*out->mutable_regions())[s.name];
                      r.set_name(s.name);
                      r.set_key(s.key);
                      r.set_offset(s.offset);
                      r.set_byte_size(s.byte_size);
                    }
                  }));
  }
  grpc::ServerUnaryReactor* SystemSharedMemoryRegister(grpc::CallbackServerContext* ctx,
                                                       const inference::SystemSharedMemoryRegisterRequest* in,
                                                       inference::SystemSharedMemoryRegisterResponse*) override {
    if (auto refused = restricted(ctx, ApiGroup::SharedMemory); !refused.ok()) return finish(ctx, refused);
    return finish(ctx, shared_memory_call([&] {
                    core_.shared_memory().add(in->name(), in->key(), in->offset(), in->byte_size());
                  }));
  }
  grpc::ServerUnaryReactor* SystemSharedMemoryUnregister(grpc::CallbackServerContext* ctx,
                                                         const inference::SystemSharedMemoryUnregisterRequest* in,
                                                         inference::SystemSharedMemoryUnregisterResponse*) override {
    if (auto refused = restricted(ctx, ApiGroup::SharedMemory); !refused.ok()) return finish(ctx, refused);
    return finish(ctx, shared_memory_call([&] { core_.shared_memory().remove(in->name()); }));
  }

  // Admitted and parsed here (gRPC's threads), run on the batcher's; answered from whichever thread finishes it.
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx, const inference::ModelInferRequest* in,
                                       inference::ModelInferResponse* out) override {
    if (auto refused = restricted(ctx, ApiGroup::Inference); !refused.ok()) return finish(ctx, refused);
    auto* reactor = ctx->DefaultReactor();
    ServingCore::Admission admitted;
    try {
      admitted = core_.admit(in->model_name(), in->model_version());
    } catch (const ProtocolError& e) {
      reactor->Finish(status_of(e.status(), e.what()));
      return reactor;
    }
    // `in` lives until Finish; the core reads it before this call returns.
    core_.infer(admitted, [in, &limits = limits_] { return request_of(*in, limits); },
                [reactor, out](int status, const std::string& error, InferResponse response) {
                  if (status != 200) return reactor->Finish(status_of(status, error));
                  fill(response, *out);
                  reactor->Finish(grpc::Status::OK);
                });
    return reactor;
  }

 private:
  // Triton's answer to a call of a restricted group without its metadata: UNAVAILABLE (its grpc_server.cc), not
  // PERMISSION_DENIED; OK otherwise.
  grpc::Status restricted(grpc::CallbackServerContext* ctx, ApiGroup group) const {
    std::string value;
    const auto why = restricted_.refusal(group, [&](const std::string& key) -> const std::string* {
      const auto& metadata = ctx->client_metadata();
      const auto it = metadata.find(key);
      if (it == metadata.end()) return nullptr;
      value.assign(it->second.data(), it->second.size());
      return &value;
    });
    return why.empty() ? grpc::Status::OK : grpc::Status(grpc::StatusCode::UNAVAILABLE, why);
  }

  // Triton's answer to a call that names a repository: convnets serve's models are one repository.
  static grpc::Status one_repository(const std::string& name) {
    return name.empty() ? grpc::Status::OK : status_of(501, "'repository_name' specification is not supported");
  }

  // A model's answer, or 404 if an unload took the model since its lookup.
  template <typename F>
  static grpc::Status model_call(F&& call) {
    try {
      return call();
    } catch (const ProtocolError& e) {
      return status_of(e.status(), e.what());
    }
  }

  // A registry call's ProtocolError as the status the HTTP route's answer maps to.
  template <typename F>
  static grpc::Status shared_memory_call(F&& call) {
    try {
      call();
      return grpc::Status::OK;
    } catch (const ProtocolError& e) {
      return status_of(e.status(), e.what());
    }
  }
  static grpc::ServerUnaryReactor* finish(grpc::CallbackServerContext* ctx, const grpc::Status& status) {
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(status);
    return reactor;
  }

  ServingCore& core_;
  Limits limits_;
  RestrictedApis restricted_;
};

}  // namespace

struct GrpcService::Impl {
  Service service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  Impl(ServingCore& core, const GrpcOptions& o) : service(core, o) {}
};

GrpcService::GrpcService(ServingCore& core, const GrpcOptions& o) : impl_(std::make_unique<Impl>(core, o)) {
  const std::string address =
      (o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host) + ":" + std::to_string(o.port);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &impl_->port);
  // As the HTTP port: a port another server holds is refused, not shared (gRPC's default is SO_REUSEPORT).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A message over the request limit is refused (RESOURCE_EXHAUSTED) before it is read whole.
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<std::size_t>(o.limits.max_body_bytes, std::numeric_limits<int>::max())));
  builder.RegisterService(&impl_->service);
  impl_->server = builder.BuildAndStart();
  if (!impl_->server || impl_->port == 0) {
    throw Error("--grpc-port " + std::to_string(o.port) + ": cannot listen on " + address +
                " (in use, or not an address of this machine)");
  }
}

GrpcService::~GrpcService() { shutdown(); }

int GrpcService::port() const { return impl_->port; }

void GrpcService::shutdown() {
  if (impl_ && impl_->server) {
    impl_->server->Shutdown();
    impl_->server->Wait();
    impl_->server.reset();
  }
}

}  // namespace convnets::serve
