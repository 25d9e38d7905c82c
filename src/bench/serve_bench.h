// `convnets bench serve`: a KServe v2 load generator in the manner of Triton's perf_analyzer (closed-loop concurrency, or requests at a fixed rate) over HTTP with the binary tensor extension or gRPC with raw contents, or either with system shared memory, for convnets serve or Triton itself; latency percentiles, inferences/s and the client's and the server's CPU time per request.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace convnets::bench {

// What a request carries: an FP32 (or FP16) image tensor, UINT8 pixels, or an encoded image file as BYTES, each
// sent to the model's input of that kind.
enum class InputKind { Fp32, Pixels, Jpeg };

struct LoadOptions {
  std::string url = "http://127.0.0.1:8000";  // grpc: HOST:PORT, or grpc://HOST:PORT
  std::string protocol = "http";              // or grpc (perf_analyzer's -i): Triton's GRPCInferenceService
  std::string model;                  // "": the server's only model
  InputKind input = InputKind::Fp32;
  std::string images;                 // Jpeg: a folder whose .jpg/.jpeg files are sent as they are (recursively)
  std::int64_t image_size = 0;        // Fp32 and Pixels: the side where the model's shape leaves it open
  std::vector<int> concurrency{1};    // closed loop: this many requests in flight, one per connection
  std::vector<double> request_rates;  // open loop instead: requests a second, sent on schedule
  int rate_connections = 64;          // open loop: connections the schedule is spread over
  double seconds = 5;                 // each row's measured window
  double warmup_seconds = 1;          // before each window: sent, not counted
  bool shared_memory = false;         // the inputs in one system shared-memory region, registered for the run
  std::string metrics_url;            // the server's Prometheus text ("": its Triton port, 8002, then URL/metrics)
  std::string outputs_file;           // each distinct input's answer (its first output), written as JSON
  int distinct_inputs = 8;            // Fp32 and Pixels: how many different tensors the requests cycle through
};

// One concurrency or rate: what the window measured.
struct LoadRow {
  std::string mode;       // "concurrency" or "rate"
  double level = 0;       // the concurrency, or the rate asked
  std::int64_t ok = 0;
  std::map<std::string, std::int64_t> errors;  // by HTTP status ("503"), or "connection"
  double seconds = 0;     // the window as measured
  double inferences_per_s = 0;
  double avg_ms = 0, p50_ms = 0, p90_ms = 0, p95_ms = 0, p99_ms = 0;
  double client_cpu_ms = 0;   // per successful request: this process's CPU time over the window
  double client_cores = 0;    // that CPU time over the window's wall time
  double server_cpu_ms = -1;  // per successful request, from /metrics' process_cpu_seconds_total; -1: not given
  std::int64_t late = 0;      // open loop: sends that started more than 1 ms after their slot
  std::string warning;        // why the client itself may have been the limit
};

struct LoadReport {
  std::string model, input, datatype, output;
  std::vector<std::int64_t> shape;
  std::int64_t inputs = 0;         // distinct inputs cycled through
  std::int64_t request_bytes = 0;  // the largest request's body (its JSON alone with shared memory)
  std::string metrics_url;         // "" where none answered
  std::vector<LoadRow> rows;
};

// Asks the server for the model's metadata, builds the requests, registers the shared memory (unregistered and
// unlinked at the end, also after an error), then runs each row. An Error names what the server or the options
// lacked (no such model, no input of the kind, an image size left open).
LoadReport run_load(const LoadOptions& options);

// perf_analyzer's table: one line per row.
std::string format_table(const LoadReport& report, const LoadOptions& options);
nlohmann::ordered_json to_json(const LoadReport& report, const LoadOptions& options);

}  // namespace convnets::bench
