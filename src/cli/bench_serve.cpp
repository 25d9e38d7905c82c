// `convnets bench serve URL`: the KServe v2 load generator's flags (bench/serve_bench.h), its table and JSON.
#include "cli/commands.h"
#include "core/error.h"
#include "core/json.h"
#include "io/atomic_file.h"
#include "bench/serve_bench.h"

#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>

namespace convnets::cli {

void add_bench_serve(CLI::App& bench) {
  struct Args {
    bench::LoadOptions o;
    std::string input = "fp32", json;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = bench.add_subcommand(
      "serve", "Load a KServe v2 server (convnets serve, Triton) as perf_analyzer does: inferences/s, latency "
               "percentiles, the client's and the server's CPU time per request");
  auto* url = cmd->add_option("URL", a->o.url,
                               "The server's endpoint: http://HOST:PORT, or with --protocol grpc HOST:PORT (loopback "
                               "by default: http://127.0.0.1:8000, 127.0.0.1:8001)")
                   ->capture_default_str();
  cmd->add_option("-i,--protocol", a->o.protocol,
                  "http (the binary tensor extension) or grpc (Triton's GRPCInferenceService, raw contents), as "
                  "perf_analyzer's -i")
      ->check(CLI::IsMember({"http", "grpc"}))
      ->capture_default_str();
  cmd->add_option("--model", a->o.model, "The model's name (default: the server's only model)");
  cmd->add_option("--input", a->input,
                  "fp32: random image tensors (the model's FP32 or FP16 input) | pixels: random UINT8 images | "
                  "jpeg: the files of --images, sent encoded as BYTES")
      ->check(CLI::IsMember({"fp32", "pixels", "jpeg"}))
      ->capture_default_str();
  cmd->add_option("--images", a->o.images, "--input jpeg: a folder of .jpg/.jpeg files, each sent as it is");
  cmd->add_option("--image-size", a->o.image_size, "fp32 and pixels: the image side where the model leaves it open")
      ->check(CLI::Range(1, 8192));
  cmd->add_option("--distinct-inputs", a->o.distinct_inputs, "fp32 and pixels: different tensors cycled through")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  auto* concurrency = cmd->add_option("--concurrency", a->o.concurrency,
                  "Closed loop: requests kept in flight, one connection and one thread each, per row "
                  "(perf_analyzer's --concurrency-range)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--request-rate", a->o.request_rates,
                  "Open loop instead: requests a second per row, sent on schedule over --rate-connections "
                  "(perf_analyzer's --request-rate-range); late sends are counted")
      ->delimiter(',');
  cmd->add_option("--rate-connections", a->o.rate_connections, "--request-rate: connections and threads")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--seconds", a->o.seconds, "Each row's measured window")->capture_default_str();
  cmd->add_option("--warmup-seconds", a->o.warmup_seconds, "Before each window: sent, not counted")
      ->capture_default_str();
  cmd->add_flag("--shared-memory", a->o.shared_memory,
                "The inputs in one system shared-memory region registered with the server (Triton's extension; "
                "perf_analyzer's --shared-memory system): only the request's JSON crosses the socket");
  cmd->add_option("--metrics-url", a->o.metrics_url,
                  "The server's Prometheus /metrics, for its CPU time per request (default: HOST:8002/metrics, then "
                  "URL/metrics; none: do not ask)");
  cmd->add_option("--outputs", a->o.outputs_file, "Write each distinct input's answer (its first output) as JSON");
  cmd->add_option("--json", a->json, "Write the rows as JSON");
  cmd->callback([a, concurrency, url] {
    if (a->o.protocol == "grpc" && url->count() == 0) a->o.url = "127.0.0.1:8001";  // Triton's gRPC port
    if (concurrency->count() == 0 && !a->o.request_rates.empty()) a->o.concurrency.clear();  // the rates' rows alone
    a->o.input = a->input == "pixels" ? bench::InputKind::Pixels
                 : a->input == "jpeg" ? bench::InputKind::Jpeg
                                      : bench::InputKind::Fp32;
#if CONVNETS_SERVE
    const auto report = bench::run_load(a->o);
    std::cout << bench::format_table(report, a->o);
    if (!a->json.empty()) write_file_atomically(a->json, dump_json(bench::to_json(report, a->o), 2) + "\n");
#else
    throw Error("convnets bench serve is not in this build: Boost's headers (Beast, Asio) were not found when it "
                "was built", "install Debian's libboost-dev and build again (scripts/setup.sh does)");
#endif
  });
}

}  // namespace convnets::cli
