// `convnets serve`: checkpoints, weights and exported ONNX files behind Triton's KServe v2 HTTP protocol.
#include "cli/commands.h"
#include "codec/image.h"
#include "core/error.h"
#include "core/options.h"
#include "deploy/engine.h"
#include "serve/server.h"

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace convnets::cli {

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<serve::ServerOptions>();
  auto max_body = std::make_shared<std::int64_t>(static_cast<std::int64_t>(o->limits.max_body_bytes));
  auto* cmd = app.add_subcommand(
      "serve", "Serve models over the KServe v2 / Triton HTTP protocol, with dynamic batching and /metrics");
  cmd->add_option("MODEL", o->models,
                  "NAME=PATH or PATH (named after the file): a checkpoint, plain weights with --arch, an exported "
                  "ONNX file, or a Triton model repository folder (`convnets export --format triton`)")
      ->required();
  cmd->add_option("--host", o->host, "the address to listen on (default loopback; 0.0.0.0 or :: for every interface)")
      ->capture_default_str();
  cmd->add_option("--port,--http-port", o->http_port, "HTTP port (Triton's 8000; 0: a free one, named at startup)")
      ->capture_default_str();
  cmd->add_option("--metrics-port", o->metrics_port,
                  "Prometheus /metrics port (Triton's 8002; 0: a free one; -1: /metrics on the HTTP port)")
      ->capture_default_str();
  auto* grpc = cmd->add_option("--grpc-port", o->grpc_port,
                               "Triton's gRPC inference service port (Triton's 8001; 0: a free one; -1: none)")
                   ->capture_default_str();
  // Triton's model control: its flags, its modes' meanings (docs/SERVE.md, "Loading and replacing models").
  cmd->add_option_function<std::string>(
         "--model-control-mode",
         [o](const std::string& m) {
           o->model_control = m == "explicit" ? serve::ModelControl::Explicit
                              : m == "poll"   ? serve::ModelControl::Poll
                                              : serve::ModelControl::None;
         },
         "none: every model loads once | explicit: --load-model's at startup, then POST "
         "/v2/repository/models/NAME/load and /unload (gRPC RepositoryModelLoad/Unload) | poll: every model, reloaded "
         "when its file changes, loaded when one appears in a repository folder, unloaded when its file goes")
      ->check(CLI::IsMember({"none", "explicit", "poll"}, CLI::ignore_case))
      ->default_str("none");
  cmd->add_option("--repository-poll-secs", o->repository_poll_secs,
                  "poll mode: seconds between looks at the model files (0: none after startup)")
      ->check(CLI::Range(0, 86400))
      ->capture_default_str();
  cmd->add_option("--load-model", o->load_models,
                  "explicit mode: a model (of the MODEL arguments) loaded at startup; repeatable; '*': all")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  // Dynamic batching, in Triton's model-configuration terms and DLE's deployer spellings.
  add_batching_options(cmd, o->batching);
  cmd->add_option_function<std::string>(
         "--batch-delay-policy",
         [o](const std::string& p) { o->batching.known_arrivals = p == "arrivals"; },
         "arrivals: the oldest request waits for others only while the server holds requests not yet queued (being "
         "received, decoded, run or answered); when every one is queued the batch leaves at once, so a lone request "
         "pays no delay | always: it waits out --max-queue-delay-us as Triton's batcher does")
      ->check(CLI::IsMember({"arrivals", "always"}))
      ->default_str("arrivals");
  // Request and connection limits.
  cmd->add_option("--max-request-bytes", *max_body, "the largest HTTP body accepted (larger: 413, unread)")
      ->check(CLI::Range(std::int64_t{1024}, std::int64_t{1} << 34))
      ->capture_default_str();
  cmd->add_option("--max-json-bytes", o->max_json_bytes,
                  "the largest JSON part of a request (larger: 413; tensors beyond it come as binary data)")
      ->capture_default_str();
  cmd->add_option("--max-image-pixels", o->max_image_pixels, codec::kMaxImagePixelsHelp)->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-connections", o->max_connections,
                  "sockets open at once, idle keep-alive ones included (none holds a thread); more wait in the "
                  "listen backlog")
      ->capture_default_str();
  cmd->add_option("--idle-timeout-s", o->idle_timeout_s, "a connection silent this long is closed")
      ->capture_default_str();
  cmd->add_option("--header-timeout-s", o->header_timeout_s,
                  "a request whose headers are not complete this long after their first byte is closed")
      ->capture_default_str();
  cmd->add_option("--body-timeout-s", o->body_timeout_s, "a request body not received in full this long gets 408")
      ->capture_default_str();
  cmd->add_option("--log-verbose", o->log_verbose,
                  "1: a line on stderr for each connection a deadline or a limit closes (slow clients); 2: idle ones "
                  "too (Triton's --log-verbose)")
      ->check(CLI::Range(0, 2))
      ->capture_default_str();
  // Triton's endpoint restriction, its syntax and its groups (docs/SERVE.md: any --host but loopback wants it).
  auto restricted = std::make_shared<std::pair<std::vector<std::string>, std::vector<std::string>>>();
  const auto all = CLI::MultiOptionPolicy::TakeAll;
  cmd->add_option("--http-restricted-api", restricted->first,
                  "GROUP[,GROUP...]:KEY=VALUE (repeatable): HTTP requests to these groups need the header KEY: VALUE, "
                  "else 403; groups: health, metadata, inference, shared-memory, model-config, model-repository "
                  "(and Triton's statistics, trace, logging)")
      ->allow_extra_args(false)
      ->multi_option_policy(all);
  cmd->add_option("--grpc-restricted-protocol", restricted->second,
                  "GROUP[,GROUP...]:KEY=VALUE (repeatable): gRPC calls to these groups need the metadata "
                  "triton-grpc-protocol-KEY: VALUE, else UNAVAILABLE (Triton's answer)")
      ->allow_extra_args(false)
      ->multi_option_policy(all);
  cmd->add_option("--drain-timeout-s", o->drain_timeout_s,
                  "on SIGTERM, how long requests in flight may take before the server stops")
      ->capture_default_str();
  // The model, as classify loads it.
  auto& io = o->inference;
  cmd->add_option("-a,--arch", io.arch, "the architecture of plain weights (checked against a checkpoint's)");
  cmd->add_option("--num-classes", io.num_classes, "plain weights: the class count (default: the classifier's width)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--image-size", io.image_size, "crop size (default: the checkpoint's or the arch's)")
      ->check(CLI::NonNegativeNumber);
  add_inference_options(cmd, io);
  cmd->callback([o, max_body, grpc, restricted] {
    o->limits.max_body_bytes = static_cast<std::size_t>(*max_body);
    for (const auto& spec : restricted->first) o->http_restricted.add(spec);
    for (const auto& spec : restricted->second) o->grpc_restricted.add(spec);
    o->grpc_asked = grpc->count() > 0;
#if CONVNETS_SERVE
    serve::run_server(*o);
#else
    throw Error("convnets serve is not in this build: Boost's headers (Beast, Asio) were not found when it was "
                "configured", "install Debian's libboost-dev (scripts/setup.sh does) and rebuild");
#endif
  });
  cmd->footer(
      "Endpoints (KServe v2 and Triton's extensions): GET /v2/health/live, /v2/health/ready, /v2, "
      "/v2/models/NAME[/versions/1][/ready|/config]; POST /v2/models/NAME[/versions/1]/infer (JSON tensors or "
      "Triton's binary tensors; outputs as tensors or classification), POST /v2/repository/index, "
      "/v2/repository/models/NAME/load and /unload (--model-control-mode explicit). Each model takes "
      "one of INPUT (BYTES: encoded JPEG/PNG images, preprocessed as the model was evaluated), input (FP32 "
      "[B,3,S,S], normalised) or PIXELS (UINT8 [B,S,S,3]) and answers logits. SIGTERM or SIGINT: new requests get "
      "503, those accepted are answered, and the exit status is 0.");
}

}  // namespace convnets::cli
