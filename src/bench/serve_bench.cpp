#include "bench/serve_bench.h"

#include "bench/http_client.h"
#ifdef CONVNETS_GRPC
#include "bench/grpc_client.h"
#endif
#include "core/error.h"
#include "core/json.h"
#include "core/stats.h"
#include "kserve/messages.h"

#include <c10/util/Half.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

namespace convnets::bench {
namespace {

using namespace kserve;
using Clock = std::chrono::steady_clock;

// The model's input of `kind`: name, datatype and shape (batch 1, a side left open filled from image_size).
struct Chosen {
  std::string name, datatype;
  std::vector<std::int64_t> shape;
};

Chosen choose_input(const nlohmann::json& meta, InputKind kind, std::int64_t image_size, const std::string& model) {
  std::vector<std::string> seen;
  for (const auto& in : meta.value("inputs", nlohmann::json::array())) {
    const auto name = in.value("name", std::string());
    const auto dt = in.value("datatype", std::string());
    auto shape = in.value("shape", std::vector<std::int64_t>{});
    seen.push_back(name + " " + dt + " " + nlohmann::json(shape).dump());
    const bool image = (kind == InputKind::Fp32 && (dt == "FP32" || dt == "FP16")) ||
                       (kind == InputKind::Pixels && dt == "UINT8" && shape.size() == 4);
    if (kind == InputKind::Jpeg && dt == "BYTES") return {name, dt, {1, 1}};
    if (!image || shape.size() != 4) continue;
    shape[0] = 1;
    for (std::size_t i = 1; i < 4; ++i) {
      if (shape[i] >= 0) continue;
      if (image_size <= 0) {
        throw Error("model " + model + "'s input " + name + " leaves its side open (" + nlohmann::json(shape).dump() +
                    ")", "pass --image-size N");
      }
      shape[i] = image_size;
    }
    return {name, dt, shape};
  }
  const char* want = kind == InputKind::Fp32 ? "an FP32 or FP16 image [N,3,H,W] (--input fp32)"
                     : kind == InputKind::Pixels ? "UINT8 pixels [N,H,W,3] (--input pixels)"
                                                 : "BYTES encoded images (--input jpeg)";
  std::string list;
  for (const auto& s : seen) list += (list.empty() ? "" : "; ") + s;
  throw Error("model " + model + " has no input of " + std::string(want) + "; its inputs: " + list);
}

std::int64_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

// The distinct inputs' raw bytes (as the binary extension and shared memory carry them), and what each was.
struct Payloads {
  std::vector<std::string> bytes;
  std::vector<std::string> sources;
};

Payloads make_payloads(const LoadOptions& o, const Chosen& in) {
  Payloads p;
  if (o.input == InputKind::Jpeg) {
    if (o.images.empty()) throw Error("--input jpeg needs --images DIR (a folder of .jpg files)");
    std::error_code ec;
    if (!std::filesystem::is_directory(o.images, ec)) throw Error("--images " + o.images + ": not a folder");
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(o.images, ec)) {
      auto ext = e.path().extension().string();
      std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
      if (e.is_regular_file() && (ext == ".jpg" || ext == ".jpeg")) files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) throw Error("--images " + o.images + ": no .jpg or .jpeg file in it");
    for (const auto& f : files) {
      Tensor t;
      t.name = in.name;
      t.datatype = DataType::Bytes;
      t.shape = in.shape;
      t.elements.push_back(read_file(f, "image"));
      p.bytes.push_back(raw_bytes(t));
      p.sources.push_back(std::filesystem::relative(f, o.images).string());
    }
    return p;
  }
  // Fixed, seeded values: the same requests every run.
  std::mt19937 gen(1234);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> pixel(0, 255);
  const auto n = numel(in.shape);
  for (int k = 0; k < std::max(1, o.distinct_inputs); ++k) {
    std::string b;
    if (in.datatype == "FP32") {
      b.resize(static_cast<std::size_t>(n) * 4);
      for (std::int64_t i = 0; i < n; ++i) {
        const float v = normal(gen);
        std::memcpy(&b[static_cast<std::size_t>(i) * 4], &v, 4);
      }
    } else if (in.datatype == "FP16") {
      b.resize(static_cast<std::size_t>(n) * 2);
      for (std::int64_t i = 0; i < n; ++i) {
        const c10::Half h(normal(gen));
        std::memcpy(&b[static_cast<std::size_t>(i) * 2], &h.x, 2);
      }
    } else {
      b.resize(static_cast<std::size_t>(n));
      for (auto& c : b) c = static_cast<char>(pixel(gen));
    }
    p.bytes.push_back(std::move(b));
    p.sources.push_back("generated " + std::to_string(k));
  }
  return p;
}

// The calls a run makes besides inference, over the protocol it loads the server with.
class Control {
 public:
  Control(const LoadOptions& o, const Endpoint& e) : http_(e) {
#ifdef CONVNETS_GRPC
    if (o.protocol == "grpc") grpc_ = std::make_unique<GrpcClient>(e.host + ":" + e.port);
#endif
    try {
#ifdef CONVNETS_GRPC
      if (grpc_) grpc_->connect(10);
      else
#endif
        http_.connect();
    } catch (const std::exception& ex) {
      throw Error("bench serve: cannot connect to " + o.url + ": " + ex.what(), "is the server up? (convnets serve)");
    }
  }
  std::vector<std::string> model_names() {
#ifdef CONVNETS_GRPC
    if (grpc_) return grpc_->model_names();
#endif
    const auto index = json_of(http_.request("POST", "/v2/repository/index", "{}"), "the server's repository index");
    std::vector<std::string> names;
    for (const auto& m : index) names.push_back(m.value("name", std::string()));
    return names;
  }
  nlohmann::json model_metadata(const std::string& model) {
#ifdef CONVNETS_GRPC
    if (grpc_) return grpc_->model_metadata(model);
#endif
    return json_of(http_.request("GET", "/v2/models/" + percent_encoded(model)), "model " + model + "'s metadata");
  }
  void register_region(const std::string& name, const std::string& key, std::size_t size) {
#ifdef CONVNETS_GRPC
    if (grpc_) return grpc_->register_region(name, key, 0, size);
#endif
    const auto r = http_.request("POST", "/v2/systemsharedmemory/region/" + percent_encoded(name) + "/register",
                                 nlohmann::json{{"key", key}, {"byte_size", size}, {"offset", 0}}.dump());
    if (r.status != 200) {
      throw Error("registering shared-memory region " + name + ": HTTP " + std::to_string(r.status) + " " + r.body,
                  "the server must offer Triton's system shared-memory extension, on this machine");
    }
  }
  void unregister_region(const std::string& name) {
#ifdef CONVNETS_GRPC
    if (grpc_) return grpc_->unregister_region(name);
#endif
    http_.request("POST", "/v2/systemsharedmemory/region/" + percent_encoded(name) + "/unregister");
  }

 private:
  Connection http_;
#ifdef CONVNETS_GRPC
  std::unique_ptr<GrpcClient> grpc_;  // --protocol grpc; without gRPC in the build, run_load refuses it first
#endif
};

// The inputs in one system shared-memory region (Triton's extension), registered with the server for the run and
// unregistered and unlinked when it ends, however it ends.
class SharedRegion {
 public:
  SharedRegion(const Payloads& p, Control& control) : control_(control) {
    const auto id = std::to_string(::getpid()) + "-" + std::to_string(Clock::now().time_since_epoch().count());
    key_ = "/convnets-bench-serve-" + id;
    name_ = "convnets-bench-serve-" + id;
    std::size_t total = 0;
    for (const auto& b : p.bytes) offsets_.push_back(total), total += b.size();
    const int fd = ::shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) throw Error("shm_open " + key_ + ": " + std::strerror(errno));
    if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
      const int err = errno;
      ::close(fd);
      ::shm_unlink(key_.c_str());
      throw Error("ftruncate " + key_ + ": " + std::strerror(err));
    }
    void* map = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) {
      ::shm_unlink(key_.c_str());
      throw Error("mmap " + key_ + ": " + std::strerror(errno));
    }
    for (std::size_t i = 0; i < p.bytes.size(); ++i) {
      std::memcpy(static_cast<char*>(map) + offsets_[i], p.bytes[i].data(), p.bytes[i].size());
    }
    ::munmap(map, total);
    try {
      control_.register_region(name_, key_, total);
    } catch (const Error&) {
      ::shm_unlink(key_.c_str());
      throw;
    } catch (const std::exception& e) {
      ::shm_unlink(key_.c_str());
      throw Error("registering shared-memory region " + name_ + ": " + e.what());
    }
  }
  ~SharedRegion() {
    try {
      control_.unregister_region(name_);
    } catch (const std::exception&) {
      // The server may be gone: the object is still ours to remove.
    }
    ::shm_unlink(key_.c_str());
  }
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  const std::string& name() const { return name_; }
  std::size_t offset(std::size_t i) const { return offsets_[i]; }

 private:
  Control& control_;
  std::string key_, name_;
  std::vector<std::size_t> offsets_;
};

// Each distinct input's request, in the protocol's form (kserve/messages.h), as tritonclient builds it.
std::vector<InferRequest> make_requests(const std::string& model, const Chosen& in, const std::string& output,
                                        const Payloads& p, const SharedRegion* region) {
  std::vector<InferRequest> out;
  for (std::size_t i = 0; i < p.bytes.size(); ++i) {
    InferRequest request;
    Tensor t;
    const auto type = datatype_of(in.datatype);
    if (!type) throw Error("model " + model + "'s input " + in.name + " has the datatype " + in.datatype);
    const std::int64_t elements = declare_input(t, in.name, in.datatype, in.shape, Limits{}, {});
    if (region) {
      t.shared_memory = SharedMemoryRef{region->name(), region->offset(i), p.bytes[i].size()};
    } else {
      read_binary_data(t, p.bytes[i], elements, "input " + in.name);
    }
    request.inputs.push_back(std::move(t));
    request.outputs.push_back({output, /*binary=*/true, 0});
    out.push_back(std::move(request));
  }
  return out;
}

// Each request's whole HTTP message, made once: a client's send is one write.
std::vector<std::string> http_messages(const Endpoint& e, const std::string& model,
                                       const std::vector<InferRequest>& requests, std::int64_t& largest_body) {
  std::vector<std::string> out;
  for (const auto& request : requests) {
    std::optional<std::size_t> header;
    const std::string body = write_infer_request(request, header);
    std::string r = "POST /v2/models/" + percent_encoded(model) + "/infer HTTP/1.1\r\nHost: " + e.host + "\r\n";
    r += header ? "Content-Type: application/octet-stream\r\nInference-Header-Content-Length: " +
                      std::to_string(*header) + "\r\n"
                : "Content-Type: application/json\r\n";
    r += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    largest_body = std::max<std::int64_t>(largest_body, static_cast<std::int64_t>(body.size()));
    out.push_back(std::move(r));
  }
  return out;
}

// One client thread's way to the server: its own HTTP/1.1 keep-alive connection or its own gRPC channel. send()
// gives "" for an answer (its first output's values into `answer` when asked), else what failed: the HTTP status,
// the gRPC code's name, or "connection".
class Session {
 public:
  virtual ~Session() = default;
  virtual void connect() = 0;
  virtual std::string send(std::size_t which, std::vector<double>* answer) = 0;
  virtual void close() {}
};

// A response's first output as numbers, read as the protocol says (kserve/messages.h).
std::vector<double> first_output(const InferResponse& response) {
  if (response.outputs.empty()) throw Error("an infer response without outputs");
  return tensor_values(response.outputs.front());
}

class HttpSession final : public Session {
 public:
  HttpSession(const Endpoint& e, const std::vector<std::string>& messages) : conn_(e), messages_(messages) {}
  void connect() override { conn_.connect(); }
  std::string send(std::size_t which, std::vector<double>* answer) override {
    HttpResponse r;
    try {
      r = conn_.send(messages_[which]);
    } catch (const std::exception&) {
      conn_.close();
      return "connection";
    }
    if (r.status != 200) return std::to_string(r.status);
    if (answer) *answer = first_output(read_infer_response(r.body, r.header_length));
    return "";
  }
  void close() override { conn_.close(); }

 private:
  Connection conn_;
  const std::vector<std::string>& messages_;
};

#ifdef CONVNETS_GRPC
class GrpcSession final : public Session {
 public:
  GrpcSession(const Endpoint& e, const GrpcRequests& requests) : client_(e.host + ":" + e.port), requests_(requests) {}
  void connect() override { client_.connect(10); }
  std::string send(std::size_t which, std::vector<double>* answer) override {
    InferResponse r;
    auto error = client_.infer(requests_, which, answer ? &r : nullptr);
    if (error.empty() && answer) *answer = first_output(r);
    return error;
  }

 private:
  GrpcClient client_;
  const GrpcRequests& requests_;
};
#endif

// Each client's counts and latencies inside the window.
struct ClientTally {
  std::int64_t ok = 0, late = 0;
  std::map<std::string, std::int64_t> errors;
  std::vector<double> ms;
};

class Runner {
 public:
  using SessionFactory = std::function<std::unique_ptr<Session>()>;
  Runner(const LoadOptions& o, SessionFactory sessions, std::size_t requests, const std::string& model,
         std::string metrics_url)
      : o_(o), sessions_(std::move(sessions)), requests_(requests), model_(model), metrics_url_(std::move(metrics_url)) {}

  // The first answer to each distinct input, kept for --outputs.
  std::vector<std::optional<std::vector<double>>> answers;

  LoadRow row(const std::string& mode, double level) {
    const int clients = mode == "rate" ? std::max(1, o_.rate_connections) : static_cast<int>(level);
    std::vector<ClientTally> tallies(static_cast<std::size_t>(clients));
    const auto start = Clock::now();
    const auto window_begin = start + to_duration(o_.warmup_seconds);
    const auto window_end = window_begin + to_duration(o_.seconds);
    std::atomic<bool> failed_to_connect{false};
    std::string connect_error;
    std::mutex mutex;
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] {
        const auto conn = sessions_();
        try {
          conn->connect();
        } catch (const std::exception& ex) {
          std::lock_guard<std::mutex> lock(mutex);
          failed_to_connect = true;
          connect_error = ex.what();
          return;
        }
        auto& t = tallies[static_cast<std::size_t>(c)];
        std::size_t next = static_cast<std::size_t>(c);
        for (std::int64_t k = 0;; ++k) {
          Clock::time_point sent = Clock::now();
          if (mode == "rate") {
            // Client c sends the schedule's slots c, c + clients, ...: the rate over all clients.
            const auto slot = start + to_duration(static_cast<double>(c + k * clients) / level);
            if (slot >= window_end) break;
            std::this_thread::sleep_until(slot);
            sent = Clock::now();
            if (sent - slot > std::chrono::milliseconds(1) && slot >= window_begin) ++t.late;
          } else if (sent >= window_end) {
            break;
          }
          const std::size_t which = next % requests_;
          next += static_cast<std::size_t>(clients);
          std::vector<double> answer;
          const bool keep = wants_answer(which);
          const std::string error = conn->send(which, keep ? &answer : nullptr);
          const auto done = Clock::now();
          if (error.empty() && keep) record_answer(which, std::move(answer));
          if (done < window_begin || done > window_end) continue;
          if (error.empty()) {
            ++t.ok;
            t.ms.push_back(std::chrono::duration<double, std::milli>(done - sent).count());
          } else {
            ++t.errors[error];
          }
        }
        conn->close();
      });
    }
    // The window's counters, read as it opens and closes.
    std::this_thread::sleep_until(window_begin);
    const double cpu0 = process_cpu_seconds();
    const auto server0 = scrape(metrics_url_, model_);
    const auto wall0 = Clock::now();
    std::this_thread::sleep_until(window_end);
    const double cpu1 = process_cpu_seconds();
    const auto server1 = scrape(metrics_url_, model_);
    const double wall = std::chrono::duration<double>(Clock::now() - wall0).count();
    for (auto& th : threads) th.join();
    if (failed_to_connect) throw Error("bench serve: cannot connect to " + o_.url + ": " + connect_error);

    LoadRow row;
    row.mode = mode;
    row.level = level;
    row.seconds = wall;
    std::vector<double> all;
    for (auto& t : tallies) {
      row.ok += t.ok;
      row.late += t.late;
      for (const auto& [k, n] : t.errors) row.errors[k] += n;
      all.insert(all.end(), t.ms.begin(), t.ms.end());
    }
    row.inferences_per_s = static_cast<double>(row.ok) / o_.seconds;
    if (!all.empty()) {
      double sum = 0;
      for (const auto v : all) sum += v;
      row.avg_ms = sum / static_cast<double>(all.size());
      row.p50_ms = percentile(all, 50), row.p90_ms = percentile(all, 90);
      row.p95_ms = percentile(all, 95), row.p99_ms = percentile(all, 99);
    }
    const double cpu = cpu1 - cpu0;
    row.client_cores = wall > 0 ? cpu / wall : 0;
    if (row.ok > 0) row.client_cpu_ms = 1e3 * cpu / static_cast<double>(row.ok);
    if (server0 && server1 && server0->cpu_s >= 0 && server1->success > server0->success) {
      row.server_cpu_ms = 1e3 * (server1->cpu_s - server0->cpu_s) / (server1->success - server0->success);
    }
    // perf_analyzer's caution: a client that needs the machine's cores measures itself.
    const double cores = std::max(1u, std::thread::hardware_concurrency());
    if (row.client_cores >= 0.8 * cores) {
      char text[200];
      std::snprintf(text, sizeof text, "the client used %.1f of %.0f cores: it may be the limit, not the server",
                    row.client_cores, cores);
      row.warning = text;
    } else if (row.late > row.ok / 100) {
      row.warning = std::to_string(row.late) + " sends started late: the client could not keep the schedule";
    }
    return row;
  }

 private:
  static Clock::duration to_duration(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  // The first answer to each input is decoded and kept where --outputs asks for it; the others are not read.
  bool wants_answer(std::size_t which) {
    if (o_.outputs_file.empty()) return false;
    std::lock_guard<std::mutex> lock(answers_mutex_);
    return answers.size() < requests_ || !answers[which];
  }
  void record_answer(std::size_t which, std::vector<double> values) {
    std::lock_guard<std::mutex> lock(answers_mutex_);
    if (answers.size() < requests_) answers.resize(requests_);
    if (!answers[which]) answers[which] = std::move(values);
  }

  const LoadOptions& o_;
  SessionFactory sessions_;
  std::size_t requests_;
  std::string model_, metrics_url_;
  std::mutex answers_mutex_;
};

std::string find_metrics(const LoadOptions& o, const Endpoint& e, const std::string& model) {
  if (o.metrics_url == "none") return "";
  if (!o.metrics_url.empty()) return o.metrics_url;
  for (const auto& url : {"http://" + e.host + ":8002/metrics", "http://" + e.host + ":" + e.port + "/metrics"}) {
    if (scrape(url, model)) return url;
  }
  return "";
}

}  // namespace

LoadReport run_load(const LoadOptions& o) {
  if (o.concurrency.empty() && o.request_rates.empty()) throw Error("bench serve: no --concurrency or --request-rate");
  for (const int c : o.concurrency) {
    if (c < 1 || c > 4096) throw Error("--concurrency " + std::to_string(c) + ": expected 1..4096");
  }
  for (const double r : o.request_rates) {
    if (!(r > 0 && r <= 1e6)) throw Error("--request-rate " + std::to_string(r) + ": expected a rate in (0, 1e6]");
  }
  if (!(o.seconds > 0 && o.seconds <= 3600)) throw Error("--seconds must be in (0, 3600]");
  if (!(o.warmup_seconds >= 0 && o.warmup_seconds <= 3600)) throw Error("--warmup-seconds must be in [0, 3600]");
  const bool grpc = o.protocol == "grpc";
  if (o.protocol != "http" && !grpc) throw Error("--protocol " + o.protocol + ": expected http or grpc");
#ifndef CONVNETS_GRPC
  if (grpc) throw Error("--protocol grpc: gRPC is not in this build", "install Debian's libgrpc++-dev and protobuf-compiler-grpc, then rebuild");
#endif
  const auto e = endpoint_of(grpc && o.url.rfind("grpc://", 0) == 0 ? o.url.substr(7) : o.url, "URL");
  Control control(o, e);
  LoadReport report;
  report.model = o.model;
  if (report.model.empty()) {
    const auto names = control.model_names();
    if (names.size() != 1) {
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      throw Error("bench serve: the server has " + std::to_string(names.size()) + " models (" + list + ")",
                  "name one with --model");
    }
    report.model = names.front();
  }
  const auto meta = control.model_metadata(report.model);
  const auto in = choose_input(meta, o.input, o.image_size, report.model);
  report.input = in.name, report.datatype = in.datatype, report.shape = in.shape;
  const auto outputs = meta.value("outputs", nlohmann::json::array());
  if (outputs.empty()) throw Error("model " + report.model + " declares no output");
  report.output = outputs.at(0).value("name", std::string());
  const auto payloads = make_payloads(o, in);
  report.inputs = static_cast<std::int64_t>(payloads.bytes.size());
  std::optional<SharedRegion> region;
  if (o.shared_memory) region.emplace(payloads, control);
  const auto requests = make_requests(report.model, in, report.output, payloads, region ? &*region : nullptr);
  report.metrics_url = find_metrics(o, e, report.model);
  Runner::SessionFactory sessions;
  std::vector<std::string> messages;
#ifdef CONVNETS_GRPC
  std::optional<GrpcRequests> grpc_requests;
#endif
  if (grpc) {
#ifdef CONVNETS_GRPC
    grpc_requests.emplace(report.model, requests);
    for (const auto& r : requests) {
      // What crosses the socket besides the tensors in shared memory: the message's own bytes.
      std::int64_t bytes = 0;
      for (const auto& t : r.inputs) bytes += t.shared_memory ? 0 : static_cast<std::int64_t>(raw_bytes(t).size());
      report.request_bytes = std::max(report.request_bytes, bytes);
    }
    sessions = [&] { return std::unique_ptr<Session>(std::make_unique<GrpcSession>(e, *grpc_requests)); };
#endif
  } else {
    messages = http_messages(e, report.model, requests, report.request_bytes);
    sessions = [&] { return std::unique_ptr<Session>(std::make_unique<HttpSession>(e, messages)); };
  }
  Runner runner(o, sessions, requests.size(), report.model, report.metrics_url);
  for (const int c : o.concurrency) report.rows.push_back(runner.row("concurrency", c));
  for (const double r : o.request_rates) report.rows.push_back(runner.row("rate", r));
  if (!o.outputs_file.empty()) {
    nlohmann::ordered_json answers = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < runner.answers.size(); ++i) {
      if (runner.answers[i]) answers.push_back({{"input", payloads.sources[i]}, {"output", *runner.answers[i]}});
    }
    std::ofstream(o.outputs_file) << dump_json(nlohmann::ordered_json{{"model", report.model}, {"answers", answers}}, 1)
                                  << '\n';
  }
  return report;
}

std::string format_table(const LoadReport& r, const LoadOptions& o) {
  std::ostringstream s;
  s << "convnets bench serve: " << o.url << ", model " << r.model << ", input " << r.input << " " << r.datatype << " "
    << nlohmann::json(r.shape).dump() << " (" << r.inputs << " distinct, " << r.request_bytes << " bytes a request"
    << (o.protocol == "grpc" ? (o.shared_memory ? " in gRPC, the tensors in system shared memory" : ", gRPC with raw contents")
                             : (o.shared_memory ? " in HTTP, the tensors in system shared memory" : ", HTTP with binary tensors"))
    << ")\n";
  s << "server CPU from " << (r.metrics_url.empty() ? "nowhere (no /metrics answered)" : r.metrics_url) << "\n\n";
  s << "| " << (r.rows.empty() || r.rows.front().mode == "concurrency" ? "Concurrency" : "Rate")
    << " | Inferences/s | p50 ms | p90 ms | p95 ms | p99 ms | avg ms | Client CPU ms/req | Server CPU ms/req | Errors |\n"
       "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|\n";
  std::string warnings;
  for (const auto& row : r.rows) {
    char line[320], server[32] = "n/a";
    std::string errors;
    for (const auto& [k, n] : row.errors) errors += (errors.empty() ? "" : ", ") + k + ": " + std::to_string(n);
    if (row.server_cpu_ms >= 0) std::snprintf(server, sizeof server, "%.3f", row.server_cpu_ms);
    std::snprintf(line, sizeof line, "| %g%s | %.1f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %s | %s |\n", row.level,
                  row.mode == "rate" ? "/s" : "", row.inferences_per_s, row.p50_ms, row.p90_ms, row.p95_ms, row.p99_ms,
                  row.avg_ms, row.client_cpu_ms, server, errors.empty() ? "0" : errors.c_str());
    s << line;
    if (!row.warning.empty()) warnings += "warning: at " + std::to_string(row.level) + ": " + row.warning + "\n";
  }
  return s.str() + warnings;
}

nlohmann::ordered_json to_json(const LoadReport& r, const LoadOptions& o) {
  nlohmann::ordered_json j;
  j["tool"] = "convnets bench serve";
  j["url"] = o.url;
  j["model"] = r.model;
  j["input"] = {{"name", r.input}, {"datatype", r.datatype}, {"shape", r.shape}, {"distinct", r.inputs},
                {"request_bytes", r.request_bytes}};
  j["protocol"] = o.protocol + (o.shared_memory ? "-shm" : "");
  j["seconds"] = o.seconds;
  j["warmup_seconds"] = o.warmup_seconds;
  j["metrics_url"] = r.metrics_url;
  j["rows"] = nlohmann::ordered_json::array();
  for (const auto& row : r.rows) {
    nlohmann::ordered_json e;
    e[row.mode] = row.level;
    e["inferences_per_s"] = row.inferences_per_s;
    e["p50_ms"] = row.p50_ms, e["p90_ms"] = row.p90_ms, e["p95_ms"] = row.p95_ms, e["p99_ms"] = row.p99_ms;
    e["avg_ms"] = row.avg_ms;
    nlohmann::ordered_json counts{{"ok", row.ok}};
    for (const auto& [k, n] : row.errors) counts[k] = n;
    e["counts"] = counts;
    e["client_cpu_ms_per_request"] = row.client_cpu_ms;
    e["client_cores"] = row.client_cores;
    if (row.server_cpu_ms >= 0) e["server_cpu_ms_per_request"] = row.server_cpu_ms;
    if (row.mode == "rate") e["late"] = row.late;
    if (!row.warning.empty()) e["warning"] = row.warning;
    j["rows"].push_back(e);
  }
  return j;
}

}  // namespace convnets::bench
