#include "serve/server.h"

#include "codec/image.h"
#include "core/error.h"
#include "core/json.h"
#include "data/rng.h"
#include "data/transforms.h"
#include "deploy/graph_engine.h"
#include "deploy/triton_repo.h"
#include "serve/grpc_service.h"
#include "serve/http_front.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <system_error>
#include <memory>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

namespace convnets::serve {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

std::int64_t micros_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t).count();
}

// The three inputs a served model takes; a request carries exactly one of them.
constexpr const char* kImages = "INPUT";   // encoded JPEG/PNG bytes, the exported ensemble's input name
constexpr const char* kTensor = "input";   // normalised float [B, 3, S, S], the exported ONNX graph's
constexpr const char* kPixels = "PIXELS";  // uint8 [B, S, S, 3], decoded, resized and cropped, not normalised
constexpr const char* kLogits = "logits";  // the exported ONNX graph's output name
constexpr const char* kLogitsAlias = "LOGITS";  // the exported ensemble's: the same tensor under its name

// --------------------------------------------------------------------------------------------- one model

struct ModelCounters {
  std::atomic<std::int64_t> success{0}, failure{0}, request_us{0}, input_us{0}, output_us{0};
};

class ServedModel {
 public:
  ServedModel(std::string name, std::string path, const ServerOptions& o)
      : name_(std::move(name)), path_(std::move(path)), model_(path_, inference_options(o)) {
    const auto& pre = model_.preprocessing();
    auto topts = data::TransformOptions::eval(pre.input_size, pre.crop_ratio,
                                              data::parse_filter(pre.interpolation, "interpolation"));
    if (o.max_image_pixels > 0) topts.max_pixels = o.max_image_pixels;
    transform_ = std::make_unique<data::Transform>(topts);
    // One pass before the port opens: a model that cannot run fails at startup, and the first request does not
    // pay for the engine's first allocation. On CUDA graphs, one per size the batches will take: each captured now
    // rather than during a request, and the batcher fills them (Triton's preferred sizes).
    const bool graphed = !deploy::describe_graphs(model_.engine()).empty();
    auto batching = graphed ? batching_for_graphs(o.batching, model_.options().graph_batch_sizes) : o.batching;
    std::vector<std::int64_t> warm{1};
    if (graphed) {
      for (const auto rows : model_.options().graph_batch_sizes) {
        if (rows > 1 && rows <= batching.max_batch_size) warm.push_back(rows);
      }
    }
    for (const auto rows : warm) model_.logits(at::zeros({rows, side(), side(), 3}, at::kByte));
    batcher_ = std::make_unique<Batcher>(batching, [this](const at::Tensor& rows) {
      return model_.logits(rows).to(at::kFloat).cpu().contiguous();
    });
  }

  // The server's inference options for this model: on CUDA graphs without --graph-batch-sizes, the sizes of
  // serving_graph_sizes(--max-batch-size) (the CPU's engines ignore them).
  static deploy::InferenceOptions inference_options(const ServerOptions& o) {
    auto io = o.inference;
    if (io.graph_batch_sizes.empty()) io.graph_batch_sizes = serving_graph_sizes(o.batching.max_batch_size);
    return io;
  }

  const std::string& name() const { return name_; }
  const std::string& path() const { return path_; }
  const deploy::InferenceModel& model() const { return model_; }
  Batcher& batcher() { return *batcher_; }
  ModelCounters& counters() { return counters_; }
  std::int64_t side() const { return model_.preprocessing().input_size; }

  // The rows a request's one input gives: decoded and transformed images, or its tensor checked against the
  // model's shape. Throws ProtocolError (400) naming the input.
  at::Tensor rows_of(const InferRequest& r) const {
    if (r.inputs.size() != 1) {
      throw ProtocolError(400, "model '" + name_ + "' takes one input per request: " + std::string(kImages) +
                                   " (BYTES, encoded JPEG/PNG images), " + kTensor + " (FP32 [B, 3, " +
                                   std::to_string(side()) + ", " + std::to_string(side()) + "], normalised) or " +
                                   kPixels + " (UINT8 [B, " + std::to_string(side()) + ", " + std::to_string(side()) +
                                   ", 3]); the request has " + std::to_string(r.inputs.size()));
    }
    for (const auto& out : r.outputs) {
      if (out.name != kLogits && out.name != kLogitsAlias) {
        throw ProtocolError(400, "unknown output '" + utf8_escaped(out.name) + "' for model '" + name_ +
                                     "': it has one, " + kLogits + " (or " + kLogitsAlias + ")");
      }
      if (out.classification < 0) throw ProtocolError(400, "output " + out.name + ": classification must be >= 0");
    }
    const Tensor& t = r.inputs[0];
    const std::int64_t s = side();
    if (t.name == kImages) return decode_images(t);
    if (t.name == kTensor) {
      expect(t, DataType::Fp32, {-1, 3, s, s});
      auto rows = at::empty({t.shape[0], 3, s, s}, at::kFloat);
      std::memcpy(rows.data_ptr(), t.data.data(), t.data.size());
      return rows;
    }
    if (t.name == kPixels) {
      expect(t, DataType::UInt8, {-1, s, s, 3});
      auto rows = at::empty({t.shape[0], s, s, 3}, at::kByte);
      std::memcpy(rows.data_ptr(), t.data.data(), t.data.size());
      return rows;
    }
    throw ProtocolError(400, "unknown input '" + utf8_escaped(t.name) + "' for model '" + name_ + "': expected " +
                                 kImages + ", " + kTensor + " or " + kPixels);
  }

  // The response to `r` given its logits: the logits tensor, or Triton's classification strings.
  InferResponse respond(const InferRequest& r, const at::Tensor& logits) const {
    InferResponse resp;
    resp.model_name = name_;
    resp.model_version = "1";
    resp.id = r.id;
    std::vector<RequestedOutput> outs = r.outputs;
    if (outs.empty()) outs.push_back({kLogits, r.binary_data_output, 0});
    for (const auto& want : outs) {
      resp.outputs.push_back(want.classification > 0 ? classification(want.name, logits, want.classification)
                                                     : logits_tensor(want.name, logits));
      resp.binary.push_back(want.binary || r.binary_data_output);
    }
    return resp;
  }

  Json metadata() const {
    const std::int64_t s = side();
    return {{"name", name_},
            {"versions", {"1"}},
            {"platform", "convnets_" + model_.engine_name()},
            {"inputs",
             {{{"name", kImages}, {"datatype", "BYTES"}, {"shape", {-1, 1}}},
              {{"name", kTensor}, {"datatype", "FP32"}, {"shape", {-1, 3, s, s}}},
              {{"name", kPixels}, {"datatype", "UINT8"}, {"shape", {-1, s, s, 3}}}}},
            {"outputs", {{{"name", kLogits}, {"datatype", "FP32"}, {"shape", {-1, model_.num_classes()}}}}}};
  }

  // Triton's model configuration, as its HTTP model-configuration extension gives it (JSON).
  Json config() const {
    const auto& b = batcher_->options();
    const std::int64_t s = side();
    Json dynamic{{"preferred_batch_size", b.preferred_batch_sizes},
                 {"max_queue_delay_microseconds", b.max_queue_delay_us},
                 {"default_queue_policy", {{"max_queue_size", b.max_queue_size}}}};
    const bool cuda = model_.runtime().device.is_cuda();
    return {{"name", name_},
            {"platform", "convnets_" + model_.engine_name()},
            {"max_batch_size", b.max_batch_size},
            {"input",
             {{{"name", kImages}, {"data_type", "TYPE_STRING"}, {"dims", {1}}},
              {{"name", kTensor}, {"data_type", "TYPE_FP32"}, {"dims", {3, s, s}}},
              {{"name", kPixels}, {"data_type", "TYPE_UINT8"}, {"dims", {s, s, 3}}}}},
            {"output",
             {{{"name", kLogits},
               {"data_type", "TYPE_FP32"},
               {"dims", {model_.num_classes()}},
               {"label_filename", model_.has_class_names() ? "labels.txt" : ""}}}},
            {"dynamic_batching", dynamic},
            {"instance_group", {{{"count", b.instances}, {"kind", cuda ? "KIND_GPU" : "KIND_CPU"}}}},
            {"parameters",
             {{"arch", {{"string_value", model_.arch().name}}},
              {"engine", {{"string_value", model_.describe_engine()}}},
              {"preprocessing", {{"string_value", dump_json(convnets::to_json(model_.preprocessing()))}}}}}};
  }

 private:
  static std::string shape_text(const std::vector<std::int64_t>& shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }

  // `want`: -1 for the batch dimension.
  void expect(const Tensor& t, DataType type, const std::vector<std::int64_t>& want) const {
    if (t.datatype != type) {
      throw ProtocolError(400, "input '" + t.name + "': expected datatype " + datatype_name(type) + ", got " +
                                   datatype_name(t.datatype));
    }
    bool ok = t.shape.size() == want.size();
    for (std::size_t i = 0; ok && i < want.size(); ++i) ok = want[i] < 0 ? t.shape[i] >= 1 : t.shape[i] == want[i];
    if (!ok) {
      auto shown = want;
      shown[0] = -1;
      throw ProtocolError(400, "input '" + t.name + "': expected shape " + shape_text(shown) + " (-1: the batch), got " +
                                   shape_text(t.shape));
    }
  }

  at::Tensor decode_images(const Tensor& t) const {
    std::vector<std::string_view> images;
    if (t.datatype == DataType::Bytes) {
      const bool ok = (t.shape.size() == 1 || (t.shape.size() == 2 && t.shape[1] == 1)) && !t.elements.empty();
      if (!ok) {
        throw ProtocolError(400, "input '" + t.name + "': expected BYTES of shape [-1, 1] or [-1] (one encoded image "
                                     "per element), got " + shape_text(t.shape));
      }
      for (const auto& e : t.elements) images.emplace_back(e);
    } else if (t.datatype == DataType::UInt8) {
      // The exported ensemble's form: one image's bytes as a UINT8 vector.
      if (!(t.shape.size() == 1 || (t.shape.size() == 2 && t.shape[0] == 1)) || t.data.empty()) {
        throw ProtocolError(400, "input '" + t.name + "': UINT8 carries one encoded image, shape [1, -1] or [-1]; got " +
                                     shape_text(t.shape));
      }
      images.emplace_back(t.data);
    } else {
      throw ProtocolError(400, "input '" + t.name + "': expected datatype BYTES (encoded images), got " +
                                   datatype_name(t.datatype));
    }
    const auto n = static_cast<std::int64_t>(images.size());
    if (n > batcher_->options().max_batch_size) {
      throw ProtocolError(400, "input '" + t.name + "': a batch of " + std::to_string(n) + " images exceeds the "
                                   "model's max_batch_size of " + std::to_string(batcher_->options().max_batch_size));
    }
    const std::int64_t s = side(), pixels = s * s * 3;
    auto rows = at::empty({n, s, s, 3}, at::kByte);
    thread_local data::Workspace ws;
    data::Rng rng(0);  // eval transforms draw nothing
    for (std::int64_t i = 0; i < n; ++i) {
      data::SampleData sample;
      sample.name = t.name + "[" + std::to_string(i) + "]";
      const auto& img = images[static_cast<std::size_t>(i)];
      sample.bytes.assign(img.begin(), img.end());
      try {
        transform_->apply(sample, rng, ws, rows.data_ptr<std::uint8_t>() + i * pixels, nullptr);
      } catch (const std::bad_alloc&) {
        throw ProtocolError(413, sample.name + ": out of memory while decoding it");
      } catch (const std::exception& e) {
        throw ProtocolError(400, e.what());
      }
    }
    return rows;
  }

  static Tensor logits_tensor(const std::string& name, const at::Tensor& logits) {
    Tensor t;
    t.name = name;
    t.datatype = DataType::Fp32;
    t.shape = {logits.size(0), logits.size(1)};
    t.data.assign(static_cast<const char*>(logits.data_ptr()), static_cast<std::size_t>(logits.numel()) * sizeof(float));
    return t;
  }

  // Triton's classification extension: per row the top k as "value:index[:label]", the value the output's own
  // (here a logit), best first.
  Tensor classification(const std::string& name, const at::Tensor& logits, std::int64_t k) const {
    k = std::min(k, logits.size(1));
    const auto [values, indices] = at::topk(logits, k, 1);
    Tensor t;
    t.name = name;
    t.datatype = DataType::Bytes;
    t.shape = {logits.size(0), k};
    const auto v = values.accessor<float, 2>();
    const auto idx = indices.accessor<std::int64_t, 2>();
    for (std::int64_t i = 0; i < logits.size(0); ++i) {
      for (std::int64_t j = 0; j < k; ++j) {
        std::string s = std::to_string(v[i][j]) + ":" + std::to_string(idx[i][j]);
        if (model_.has_class_names()) s += ":" + model_.class_names()[static_cast<std::size_t>(idx[i][j])];
        t.elements.push_back(std::move(s));
      }
    }
    return t;
  }

  std::string name_, path_;
  deploy::InferenceModel model_;
  std::unique_ptr<data::Transform> transform_;
  std::unique_ptr<Batcher> batcher_;
  ModelCounters counters_;
};

// NAME=PATH or PATH, a Triton repository folder expanded into its models: (name, path) pairs.
std::vector<std::pair<std::string, std::string>> model_list(const std::vector<std::string>& specs) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& spec : specs) {
    std::string name, path = spec;
    const auto eq = spec.find('=');
    if (eq != std::string::npos && !fs::exists(spec)) {
      name = spec.substr(0, eq);
      path = spec.substr(eq + 1);
    }
    std::error_code ec;
    if (!fs::exists(path, ec)) throw Error(path + ": no such file or folder (serve MODEL)", {}, ErrorKind::NotFound);
    if (fs::is_directory(path, ec)) {
      if (!name.empty()) throw Error(spec + ": a Triton model repository folder names its own models; give its path alone");
      std::size_t found = 0;
      std::vector<fs::path> entries;
      for (const auto& e : fs::directory_iterator(path)) entries.push_back(e.path());
      std::sort(entries.begin(), entries.end());
      for (const auto& dir : entries) {
        if (!fs::is_directory(dir)) continue;
        // The highest numeric version folder holding model.onnx, as Triton's default version policy serves.
        long best = -1;
        for (const auto& v : fs::directory_iterator(dir)) {
          const auto vn = v.path().filename().string();
          if (vn.empty() || !std::all_of(vn.begin(), vn.end(), ::isdigit) || vn.size() > 9) continue;
          if (fs::exists(v.path() / "model.onnx")) best = std::max(best, std::stol(vn));
        }
        if (best < 0) continue;  // the DALI step and the ensemble: convnets' own pipeline does their work
        out.emplace_back(dir.filename().string(), (dir / std::to_string(best) / "model.onnx").string());
        ++found;
      }
      if (found == 0) {
        throw Error(path + ": a folder with no NAME/VERSION/model.onnx in it; serve takes checkpoints, weights and "
                           "ONNX files, or a Triton model repository that `convnets export --format triton` wrote");
      }
      continue;
    }
    if (name.empty()) name = fs::path(path).stem().string();
    out.emplace_back(name, path);
  }
  std::map<std::string, int> seen;
  for (const auto& [name, path] : out) {
    if (!deploy::valid_triton_model_name(name)) {
      throw Error("serve: model name '" + utf8_escaped(name) + "' (for " + path + ") must be letters, digits, '_', '-' "
                  "or '.', not starting with '.'", "name it with NAME=PATH");
    }
    if (seen[name]++) throw Error("serve: two models are named '" + name + "'", "name them apart with NAME=PATH");
  }
  return out;
}

// --------------------------------------------------------------------------------------------- workers

// The threads that turn a request's body into rows (JSON, image decoding) and its logits into an answer: the
// event loop hands them on, and the batcher's instances hand the answers back. None waits on a forward pass.
class Workers {
 public:
  explicit Workers(int n) {
    for (int i = 0; i < std::max(1, n); ++i) threads_.emplace_back([this] { work(); });
  }
  ~Workers() { finish(); }
  void submit(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(fn));
    }
    wake_.notify_one();
  }
  // Runs what is queued, then joins.
  void finish() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      auto fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      try {
        fn();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "convnets serve: a request's work failed: %s\n", e.what());
      }
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// Requests in flight, and the drain that waits for them.
class Drain {
 public:
  bool enter() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (draining_) return false;
    ++in_flight_;
    return true;
  }
  void leave() {
    std::lock_guard<std::mutex> lock(mutex_);
    --in_flight_;
  }
  bool draining() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return draining_;
  }
  // Refuses new requests from now on; returns how many are in flight.
  int start() {
    std::lock_guard<std::mutex> lock(mutex_);
    draining_ = true;
    return in_flight_;
  }
  int in_flight() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return in_flight_;
  }

 private:
  mutable std::mutex mutex_;
  int in_flight_ = 0;
  bool draining_ = false;
};

// --------------------------------------------------------------------------------------------- the server

double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

std::int64_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  long long pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

std::string url(const std::string& host, int port) {
  return "http://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// A failed request's status: a protocol error's own, else 400 (the request could not be served as it was).
int status_of(const Error& e) {
  const auto* p = dynamic_cast<const ProtocolError*>(&e);
  return p ? p->status() : 400;
}

// A path segment as the client named it: tritonclient quote()s model and region names into the URL (a space is
// %20). A '%' not followed by two hex digits stays as it is.
std::string percent_decoded(const std::string& segment) {
  const auto hex = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
  };
  std::string out;
  out.reserve(segment.size());
  for (std::size_t i = 0; i < segment.size(); ++i) {
    if (segment[i] == '%' && i + 2 < segment.size() && hex(segment[i + 1]) >= 0 && hex(segment[i + 2]) >= 0) {
      out += static_cast<char>(hex(segment[i + 1]) * 16 + hex(segment[i + 2]));
      i += 2;
    } else {
      out += segment[i];
    }
  }
  return out;
}

HttpResponse error_response(int status, const std::string& message, bool close = false) {
  return HttpResponse::json_error(status, error_body(message), close);
}

HttpResponse json_response(const Json& j) {
  HttpResponse r;
  r.content_type = "application/json";
  r.body = dump_json(j);
  return r;
}

HttpResponse status_response(int status) {
  HttpResponse r;
  r.status = status;
  return r;
}

class Server final : public ServingCore {
 public:
  Server(const ServerOptions& o) : o_(o), workers_(std::max(2, static_cast<int>(std::thread::hardware_concurrency()))) {
    for (const auto& [name, path] : model_list(o.models)) {
      // Said before the (seconds-long) load: a supervisor, or a test, knows the server is up to its own code.
      std::printf("convnets serve: loading model %s from %s\n", name.c_str(), path.c_str());
      std::fflush(stdout);
      models_.emplace(name, std::make_unique<ServedModel>(name, path, o));
    }
    HttpFrontOptions f;
    f.host = o.host;
    f.max_connections = o.max_connections;
    f.idle_timeout_s = o.idle_timeout_s;
    f.header_timeout_s = o.header_timeout_s;
    f.body_timeout_s = o.body_timeout_s;
    f.max_body_bytes = o.limits.max_body_bytes;
    // The bodies held at once are bounded too, not only each: a thousand connections may each send the largest.
    f.max_held_bytes = 4 * o.limits.max_body_bytes;
    f.log_verbose = o.log_verbose;
    http_ = std::make_unique<HttpFront>(
        f, [this](const HttpRequest& r) { return refusal(r); },
        [this](HttpRequest r, HttpFront::Reply reply) { route(std::move(r), std::move(reply)); }, error_body);
    if (o.metrics_port >= 0) {
      f.max_connections = 64;
      f.max_body_bytes = kSmallBody;
      f.max_held_bytes = 64 * kSmallBody;
      metrics_ = std::make_unique<HttpFront>(
          f, [](const HttpRequest&) { return std::optional<HttpResponse>{}; },
          [this](HttpRequest r, HttpFront::Reply reply) {
            if (r.method == "GET" && r.path == "/metrics") return reply(metrics());
            reply(error_response(404, "no such endpoint: " + utf8_escaped(r.method + " " + r.path)));
          },
          error_body);
    }
  }

  ~Server() {
    // The workers hold replies into the fronts: they end first.
    workers_.finish();
  }

  int serve() {
    const int port = http_->bind(o_.http_port, "--port");
    const int mport = metrics_ ? metrics_->bind(o_.metrics_port, "--metrics-port") : -1;
    std::string grpc_line = "gRPC off (--grpc-port -1)";
#ifdef CONVNETS_GRPC
    if (o_.grpc_port >= 0) {
      GrpcOptions g;
      g.host = o_.host;
      g.port = o_.grpc_port;
      g.limits = o_.limits;
      grpc_ = std::make_unique<GrpcService>(*this, g);
      grpc_line = "gRPC on " + url(o_.host, grpc_->port()).substr(7) + " (Triton's GRPCInferenceService)";
    }
#else
    grpc_line = "gRPC not in this build (Debian's libgrpc++-dev and protobuf-compiler-grpc)";
#endif
    for (const auto& [name, m] : models_) {
      const auto& im = m->model();
      const auto& own = m->batcher().options().preferred_batch_sizes;
      std::string batching;
      if (own != o_.batching.preferred_batch_sizes) {
        for (auto s : own) batching += (batching.empty() ? "; preferred batch sizes " : ",") + std::to_string(s);
        batching += " (its largest CUDA graph)";
      }
      std::printf("convnets serve: model %s from %s: %s, %lld classes, %lldx%lld input; %s%s\n", name.c_str(),
                  m->path().c_str(), im.arch().name.c_str(), static_cast<long long>(im.num_classes()),
                  static_cast<long long>(m->side()), static_cast<long long>(m->side()), im.describe_engine().c_str(),
                  batching.c_str());
    }
    const auto& b = o_.batching;
    std::string preferred;
    for (auto s : b.preferred_batch_sizes) preferred += (preferred.empty() ? "" : ",") + std::to_string(s);
    std::printf("convnets serve: dynamic batching: max batch %lld, max queue delay %lld us, preferred sizes %s, "
                "%d instance(s), max queue %lld requests\n",
                static_cast<long long>(b.max_batch_size), static_cast<long long>(b.max_queue_delay_us),
                preferred.empty() ? "none" : preferred.c_str(), b.instances, static_cast<long long>(b.max_queue_size));
    // Before the HTTP line, which a supervisor (or a test) reads as the server being up.
    std::printf("convnets serve: %s\n", grpc_line.c_str());
    std::printf("convnets serve: HTTP on %s (KServe v2), metrics on %s/metrics\n", url(o_.host, port).c_str(),
                (mport >= 0 ? url(o_.host, mport) : url(o_.host, port)).c_str());
    std::fflush(stdout);
    std::thread metrics_thread;
    if (metrics_) metrics_thread = std::thread([this] { metrics_->run(); });
    http_->run();
    // Drained by now (the HTTP front stops once nothing is in flight, gRPC's calls included): what remains are
    // calls that came after, answered 503 before the service stops.
#ifdef CONVNETS_GRPC
    if (grpc_) grpc_->shutdown();
#endif
    if (metrics_) metrics_->stop();
    if (metrics_thread.joinable()) metrics_thread.join();
    for (auto& [name, m] : models_) m->batcher().finish();
    workers_.finish();
    return 0;
  }

  // From the signal thread. begin_drain refuses new requests (503); stop_when_drained, called on every tick after
  // it, stops the front ends once nothing is in flight or the drain timeout has passed (a stop before they run is
  // kept for them).
  void begin_drain(const char* why) {
    drain_began_ = Clock::now();
    std::fprintf(stderr, "convnets serve: %s: draining %d request(s) in flight; new requests get 503\n", why,
                 drain_.start());
  }
  void stop_when_drained() {
    const int left = drain_.in_flight();
    if (left > 0 && Clock::now() - drain_began_ < std::chrono::seconds(o_.drain_timeout_s)) return;
    if (stopped_.exchange(true)) return;
    if (left > 0) {
      std::fprintf(stderr, "convnets serve: %d request(s) still running after --drain-timeout-s %d; stopping\n", left,
                   o_.drain_timeout_s);
    }
    http_->stop();
    if (metrics_) metrics_->stop();
  }
  Clock::time_point drain_began() const { return drain_began_; }
  // Each model's requests answered with a result and refused, for the line the process ends with: a supervisor
  // (or a test) can match it against what its clients received.
  std::string answered() const {
    std::string out;
    for (const auto& [name, m] : models_) {
      auto& c = m->counters();
      out += (out.empty() ? "" : "; ") + name + ": " + std::to_string(c.success.load()) + " succeeded, " +
             std::to_string(c.failure.load()) + " failed";
    }
    return out;
  }


 private:
  // A request refused from its headers alone, before any of its body is read: the response, or none. Only infer
  // takes a large or chunked body; the other routes' bodies are small and declared.
  std::optional<HttpResponse> refusal(const HttpRequest& req) const {
    const auto encoding = req.header("Content-Encoding");
    if (!encoding.empty() && encoding != "identity") {
      return error_response(415, "Content-Encoding " + utf8_escaped(encoding) +
                                     " is not accepted: send the body uncompressed");
    }
    if (req.header("Content-Type").rfind("multipart/", 0) == 0) {
      return error_response(415, "multipart bodies are not accepted: send the KServe v2 JSON, or its binary tensor "
                                 "extension");
    }
    const bool infer = req.method == "POST" && req.path.size() > 6 &&
                       req.path.compare(req.path.size() - 6, 6, "/infer") == 0;
    const bool chunked = req.has_header("Transfer-Encoding");
    if (req.has_header("Content-Length")) {
      const auto text = req.header("Content-Length");
      const std::uint64_t length = std::stoull(text);  // the parser took it as a byte count already
      const std::uint64_t limit = infer ? o_.limits.max_body_bytes : kSmallBody;
      if (length > limit) {
        return error_response(413, "the request body of " + text + " bytes exceeds the limit of " +
                                       std::to_string(limit) + (infer ? " (--max-request-bytes)" : " for " + req.path));
      }
    } else if (!infer && (chunked || req.method == "POST" || req.method == "PUT" || req.method == "PATCH")) {
      return error_response(411, req.method + " " + utf8_escaped(req.path) + " needs a Content-Length (at most " +
                                     std::to_string(kSmallBody) + " bytes)");
    }
    return std::nullopt;
  }
  static constexpr std::uint64_t kSmallBody = 64 * 1024;
  static constexpr std::size_t kInlineParseBytes = 16 * 1024;

  // The model a path names (its version 1), or the 404 answer.
  ServedModel* find(const std::smatch& m, HttpResponse& refused) {
    const std::string name = percent_decoded(m[1]);
    if (auto missing = find_model(name, m.size() > 2 && m[2].matched ? percent_decoded(m[2]) : ""); !missing.empty()) {
      refused = error_response(404, missing);
      return nullptr;
    }
    return models_.at(name).get();
  }

  // On the event loop: the small answers at once, inference handed to the workers.
  void route(HttpRequest r, HttpFront::Reply reply) {
    static const std::string model = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";
    static const std::regex model_route(model), ready_route(model + "/ready"), config_route(model + "/config"),
        infer_route(model + "/infer"),
        shm_route(R"(/v2/systemsharedmemory(?:/region/([^/]+))?/(status|register|unregister))");
    const auto& p = r.path;
    std::smatch m;
    HttpResponse refused;
    if (r.method == "GET") {
      if (p == "/v2/health/live") return reply(status_response(200));
      if (p == "/v2/health/ready") return reply(status_response(drain_.draining() ? 503 : 200));
      if (p == "/v2") return reply(json_response(server_metadata_json()));
      if (std::regex_match(p, m, ready_route)) {
        return reply(find(m, refused) ? status_response(drain_.draining() ? 503 : 200) : refused);
      }
      if (std::regex_match(p, m, config_route)) {
        auto* s = find(m, refused);
        return reply(s ? json_response(s->config()) : refused);
      }
      if (std::regex_match(p, m, model_route)) {
        auto* s = find(m, refused);
        return reply(s ? json_response(s->metadata()) : refused);
      }
      if (p == "/metrics" && o_.metrics_port < 0) return reply(metrics());
      if (std::regex_match(p, m, shm_route) && m[2] == "status") {
        return reply(shared_memory_call(percent_decoded(m[1]), "status", ""));
      }
    } else if (r.method == "POST") {
      if (p == "/v2/repository/index") return reply(json_response(repository_index_json()));
      if (std::regex_match(p, m, infer_route)) {
        const auto start = Clock::now();
        if (!drain_.enter()) {
          return reply(error_response(503, "the server is shutting down: no new requests are taken", true));
        }
        ServedModel* s = find(m, refused);
        if (!s) {
          drain_.leave();
          return reply(refused);
        }
        // Left when the answer is handed back, whichever thread gives it; until then the model's batcher counts
        // the request as on its way (a lone queued request need not wait for it).
        auto leave = std::shared_ptr<void>(nullptr, [this, arriving = s->batcher().announce()](void*) { drain_.leave(); });
        // A small body is parsed here, on the loop (at most tens of microseconds); a large one on a worker, so that
        // no copy of megabytes holds the other connections' reads and writes.
        if (r.body.size() <= kInlineParseBytes) return infer(*s, r, reply, leave, start);
        workers_.submit([this, s, r = std::make_shared<HttpRequest>(std::move(r)), reply, leave, start] {
          infer(*s, *r, reply, leave, start);
        });
        return;
      }
      if (std::regex_match(p, m, shm_route) && m[2] != "status") {
        return reply(shared_memory_call(percent_decoded(m[1]), m[2].str(), r.body));
      }
    }
    reply(error_response(404, "no such endpoint: " + utf8_escaped(r.method + " " + p)));
  }

  // Triton's system shared-memory routes: GET .../status, POST .../register {"key", "offset", "byte_size"} and
  // .../unregister, each for one region (`name`) or, without /region/NAME, for all (register needs a name).
  HttpResponse shared_memory_call(const std::string& name, const std::string& what, const std::string& body) {
    try {
      if (what == "status") {
        Json list = Json::array();
        for (const auto& s : shared_memory_.status(name)) {
          list.push_back({{"name", s.name}, {"key", s.key}, {"offset", s.offset}, {"byte_size", s.byte_size}});
        }
        return json_response(list);
      }
      if (what == "unregister") {
        shared_memory_.remove(name);
        return status_response(200);
      }
      if (name.empty()) return error_response(404, "no such endpoint: POST /v2/systemsharedmemory/register (name a region)");
      const auto j = parse_json(body, "the register request for shared memory region " + in_quotes(name));
      const auto field = [&](const char* key) -> const nlohmann::json* {
        return j.is_object() && j.contains(key) ? &j[key] : nullptr;
      };
      const auto* key = field("key");
      const auto* size = field("byte_size");
      const auto* offset = field("offset");
      if (!key || !key->is_string() || !size || !size->is_number_unsigned() || (offset && !offset->is_number_unsigned())) {
        return error_response(400, "register shared memory region " + in_quotes(name) +
                                       ": expected {\"key\": string, \"byte_size\": integer, \"offset\": integer}");
      }
      shared_memory_.add(name, key->get<std::string>(), offset ? offset->get<std::uint64_t>() : 0,
                         size->get<std::uint64_t>());
      return status_response(200);
    } catch (const Error& e) {
      return error_response(status_of(e), e.what());
    }
  }

  // On a worker (on the loop for a small body, as route() hands it): the body parsed, then run as run_infer runs
  // it; the answer written as the request asked (JSON, or Triton's binary tensors).
  void infer(ServedModel& m, HttpRequest& req, const HttpFront::Reply& reply, const std::shared_ptr<void>& leave,
             Clock::time_point start) {
    const bool on_loop = req.body.size() <= kInlineParseBytes;
    InferRequest parsed;
    try {
      std::optional<std::size_t> header_length;
      if (req.has_header("Inference-Header-Content-Length")) {
        header_length = parse_header_length(req.header("Inference-Header-Content-Length"));
      }
      // A JSON tree costs about 16 bytes per number it holds: large tensors come as binary data, as tritonclient sends.
      const std::size_t json = header_length ? std::min(*header_length, req.body.size()) : req.body.size();
      if (json > o_.max_json_bytes) {
        throw ProtocolError(413, "the request's JSON is " + std::to_string(json) + " bytes, over --max-json-bytes " +
                                     std::to_string(o_.max_json_bytes) + ": send tensors as Triton's binary data");
      }
      parsed = parse_infer_request(req.body, header_length, o_.limits);
    } catch (const Error& e) {
      ++m.counters().failure;
      return reply(error_response(status_of(e), e.what()));
    }
    req.body.clear();
    req.body.shrink_to_fit();
    auto done = [reply](int status, const std::string& error, InferResponse r) {
      if (status != 200) return reply(error_response(status, error));
      HttpResponse res;
      std::optional<std::size_t> out_header;
      res.body = write_infer_response(r, out_header);
      if (out_header) {
        res.headers.emplace_back("Inference-Header-Content-Length", std::to_string(*out_header));
        res.content_type = "application/octet-stream";
      } else {
        res.content_type = "application/json";
      }
      reply(std::move(res));
    };
    // A body of a few hundred bytes can name megabytes in shared memory: those are copied out on a worker, as a
    // large body is parsed there, not on the loop every connection shares.
    const bool shared = std::any_of(parsed.inputs.begin(), parsed.inputs.end(),
                                    [](const Tensor& t) { return t.shared_memory.has_value(); });
    if (on_loop && shared) {
      workers_.submit([this, &m, r = std::make_shared<InferRequest>(std::move(parsed)), leave, start, done] {
        run_infer(m, std::move(*r), start, leave, done);
      });
      return;
    }
    run_infer(m, std::move(parsed), start, leave, std::move(done));
  }

  // A parsed request through its model, whichever protocol carried it: its rows made, queued on the batcher, the
  // response made from its logits and handed to `done` with the time it took counted (Triton's metrics). The
  // instance thread answers when nothing else waits, else a worker does: a hop to a worker cost a lone request
  // more than its answer takes to write (c1 0.89x httplib's, 2 vCPUs), and a queue needs the instance back.
  void run_infer(ServedModel& m, InferRequest parsed, Clock::time_point start, std::shared_ptr<void> leave,
                 ServingCore::InferDone done) {
    auto& c = m.counters();
    at::Tensor rows;
    try {
      shared_memory_.resolve(parsed);  // inputs in shared memory read into the request
      rows = m.rows_of(parsed);
    } catch (const Error& e) {
      ++c.failure;
      return done(status_of(e), e.what(), {});
    }
    auto request = std::make_shared<const InferRequest>(std::move(parsed));
    c.input_us += micros_since(start);
    m.batcher().submit(std::move(rows), request->timeout_us, [this, &m, request, leave, start, done](Outcome o) {
      if (o.status != 200) {
        ++m.counters().failure;
        return done(o.status, "model '" + m.name() + "': " + o.error, {});
      }
      auto answer = [&m, request, leave, start, done, logits = o.logits] {
        auto& c = m.counters();
        const auto out_start = Clock::now();
        InferResponse r;
        try {
          r = m.respond(*request, logits);
        } catch (const Error& e) {
          ++c.failure;
          return done(status_of(e), e.what(), {});
        }
        // Counted before the answer leaves: a client that reads /metrics once it has its answer sees it counted.
        ++c.success;
        done(200, "", std::move(r));
        c.output_us += micros_since(out_start);
        c.request_us += micros_since(start);
      };
      if (m.batcher().queued() == 0) return answer();
      workers_.submit(std::move(answer));
    });
  }

  // ---- ServingCore: what the gRPC service asks, answered as the HTTP routes answer.
  bool ready() const override { return !drain_.draining(); }
  std::string server_metadata() const override { return dump_json(server_metadata_json()); }
  std::string repository_index() const override { return dump_json(repository_index_json()); }
  std::string find_model(const std::string& name, const std::string& version) const override {
    if (models_.find(name) == models_.end()) return "Request for unknown model: '" + utf8_escaped(name) + "' is not found";
    if (!version.empty() && version != "1") {
      return "Request for unknown model: '" + name + "' version " + utf8_escaped(version) +
             " is not found (version 1 is served)";
    }
    return "";
  }
  std::string model_metadata(const std::string& name) const override { return dump_json(models_.at(name)->metadata()); }
  std::string model_config(const std::string& name) const override { return dump_json(models_.at(name)->config()); }
  SharedMemoryRegions& shared_memory() override { return shared_memory_; }
  void infer(const std::string& name, const std::string& version, InferRequest request, InferDone done) override {
    const auto start = Clock::now();
    if (!drain_.enter()) return done(503, "the server is shutting down: no new requests are taken", {});
    if (auto missing = find_model(name, version); !missing.empty()) {
      drain_.leave();
      return done(404, missing, {});
    }
    auto& m = *models_.at(name);
    auto leave = std::shared_ptr<void>(nullptr, [this, arriving = m.batcher().announce()](void*) { drain_.leave(); });
    run_infer(m, std::move(request), start, std::move(leave), std::move(done));
  }

  Json server_metadata_json() const {
    Json extensions = {"classification", "binary_tensor_data", "model_configuration", "model_repository",
                       "system_shared_memory"};
    return {{"name", "convnets"}, {"version", CONVNETS_VERSION}, {"extensions", extensions}};
  }
  Json repository_index_json() const {
    Json list = Json::array();
    for (const auto& [name, s] : models_) list.push_back({{"name", name}, {"version", "1"}, {"state", "READY"}});
    return list;
  }

  HttpResponse metrics() const {
    std::ostringstream out;
    struct Family {
      const char *name, *type, *help;
    };
    auto family = [&](const Family& f) { out << "# HELP " << f.name << ' ' << f.help << "\n# TYPE " << f.name << ' ' << f.type << '\n'; };
    auto labels = [](const std::string& model) { return "{model=\"" + model + "\",version=\"1\"}"; };
    std::map<std::string, BatcherStats> stats;
    for (const auto& [name, m] : models_) stats[name] = m->batcher().stats();
    auto each = [&](const Family& f, auto value) {
      family(f);
      for (const auto& [name, m] : models_) out << f.name << labels(name) << ' ' << value(*m, stats[name]) << '\n';
    };
    // Triton's metric names and meanings (docs/user_guide/metrics.md), then convnets' own.
    each({"nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes"},
         [](ServedModel& m, const BatcherStats&) { return m.counters().success.load(); });
    each({"nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes"},
         [](ServedModel& m, const BatcherStats&) { return m.counters().failure.load(); });
    each({"nv_inference_count", "counter", "Number of inferences performed (a batch of n counts n)"},
         [](ServedModel&, const BatcherStats& s) { return s.inferences; });
    each({"nv_inference_exec_count", "counter", "Number of model executions performed (batches)"},
         [](ServedModel&, const BatcherStats& s) { return s.executions; });
    each({"nv_inference_pending_request_count", "gauge", "Instantaneous number of pending requests awaiting execution"},
         [](ServedModel&, const BatcherStats& s) { return s.pending; });
    each({"nv_inference_request_duration_us", "counter", "Cumulative end-to-end inference request handling time"},
         [](ServedModel& m, const BatcherStats&) { return m.counters().request_us.load(); });
    each({"nv_inference_queue_duration_us", "counter", "Cumulative time requests spend waiting in the scheduling queue"},
         [](ServedModel&, const BatcherStats& s) { return s.queue_us; });
    each({"nv_inference_compute_input_duration_us", "counter",
          "Cumulative compute input duration (reading the body, decoding and preprocessing images)"},
         [](ServedModel& m, const BatcherStats&) { return m.counters().input_us.load(); });
    each({"nv_inference_compute_infer_duration_us", "counter", "Cumulative compute inference duration"},
         [](ServedModel&, const BatcherStats& s) { return s.compute_us; });
    each({"nv_inference_compute_output_duration_us", "counter", "Cumulative inference compute output duration"},
         [](ServedModel& m, const BatcherStats&) { return m.counters().output_us.load(); });
    each({"convnets_inference_queue_full_count", "counter", "Requests refused at once because the queue was full"},
         [](ServedModel&, const BatcherStats& s) { return s.refused_full; });
    each({"convnets_inference_timeout_count", "counter", "Requests whose timeout passed before a batch took them"},
         [](ServedModel&, const BatcherStats& s) { return s.timed_out; });
    family({"convnets_inference_batch_size_count", "counter", "Model executions by the number of rows batched"});
    for (const auto& [name, s] : stats) {
      for (const auto& [size, n] : s.batch_sizes) {
        out << "convnets_inference_batch_size_count{model=\"" << name << "\",version=\"1\",batch_size=\"" << size
            << "\"} " << n << '\n';
      }
    }
    // Prometheus' process metric: what `convnets bench serve` divides by the requests answered in its window.
    family({"process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds"});
    out << "process_cpu_seconds_total " << process_cpu_seconds() << '\n';
    family({"process_resident_memory_bytes", "gauge", "Resident memory size in bytes"});
    out << "process_resident_memory_bytes " << resident_bytes() << '\n';
    family({"convnets_http_open_connections", "gauge", "HTTP connections open now (idle kept-alive ones included)"});
    out << "convnets_http_open_connections " << http_->open_connections() << '\n';
    HttpResponse res;
    res.content_type = "text/plain; version=0.0.4; charset=utf-8";
    res.body = out.str();
    return res;
  }

  const ServerOptions& o_;
  std::map<std::string, std::unique_ptr<ServedModel>> models_;
  Drain drain_;
  SharedMemoryRegions shared_memory_;  // before the workers, which read from it, so that it outlives them
  std::atomic<bool> stopped_{false};
  Clock::time_point drain_began_{};
  std::unique_ptr<HttpFront> http_, metrics_;
#ifdef CONVNETS_GRPC
  std::unique_ptr<GrpcService> grpc_;  // its calls hold answers into the batchers: stopped before models_ go
#endif
  // Last: destroyed first, before the fronts its jobs reply into.
  Workers workers_;
};

// SIGTERM and SIGINT write their number to a pipe that one thread reads: the drain they start locks and waits,
// which no handler may do. A handler, not a blocked mask and sigwait: threads made before `serve` runs (LibTorch's,
// OpenVINO's) would not have the mask, and a signal the kernel gave one of them would end the process.
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int sig) {
  const char c = static_cast<char>(sig);
  const int saved = errno;
  (void)!::write(g_signal_pipe[1], &c, 1);
  errno = saved;
}

class StopSignals {
 public:
  StopSignals() {
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw Error(std::string("serve: pipe2: ") + std::strerror(errno));
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, &old_term_);
    sigaction(SIGINT, &sa, &old_int_);
  }
  // The handlers stay: the process ends after the server, and a second SIGTERM during the drain must not end it
  // with status 143 before every accepted request is answered.
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The signal taken, or 0 when `timeout_ms` passed without one.
  int wait(int timeout_ms) const {
    pollfd p{g_signal_pipe[0], POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return 0;
    char c = 0;
    return ::read(g_signal_pipe[0], &c, 1) == 1 ? c : 0;
  }

 private:
  struct sigaction old_term_ {}, old_int_ {};
};

// A thousand connections need a thousand descriptors: the soft limit is raised to fit --max-connections twice (and
// the models' own files), not to the hard limit: past --max-connections the front end stops accepting and the
// kernel's backlog holds the rest, instead of an unbounded number of open sockets.
void raise_descriptor_limit(int max_connections) {
  rlimit r{};
  const rlim_t want = 2 * static_cast<rlim_t>(max_connections) + 256;
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < want) {
    r.rlim_cur = std::min(want, r.rlim_max);
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

}  // namespace

int run_server(const ServerOptions& options) {
  options.batching.validate();
  if (options.http_port < 0 || options.http_port > 65535) throw Error("--port must be 0..65535, got " + std::to_string(options.http_port));
  if (options.metrics_port < -1 || options.metrics_port > 65535) {
    throw Error("--metrics-port must be -1 (off: /metrics on the HTTP port) or 0..65535, got " +
                std::to_string(options.metrics_port));
  }
  if (options.grpc_port < -1 || options.grpc_port > 65535) {
    throw Error("--grpc-port must be -1 (off), 0 (a free port) or 1..65535, got " + std::to_string(options.grpc_port));
  }
#ifndef CONVNETS_GRPC
  if (options.grpc_asked && options.grpc_port >= 0) {
    throw Error("--grpc-port: this convnets was built without gRPC (Debian's libgrpc++-dev and protobuf-compiler-grpc; "
                "scripts/setup.sh installs them)");
  }
#endif
  if (options.max_connections < 1 || options.max_connections > 65536) throw Error("--max-connections must be 1 .. 65536");
  if (options.max_json_bytes < 1024) throw Error("--max-json-bytes must be at least 1024");
  if (options.idle_timeout_s < 1 || options.header_timeout_s < 1 || options.body_timeout_s < 1 ||
      options.drain_timeout_s < 0) {
    throw Error("--idle-timeout-s, --header-timeout-s and --body-timeout-s must be at least 1 and --drain-timeout-s "
                "at least 0");
  }
  // Before the models load: a SIGTERM while they do still ends in an orderly stop once the server is up.
  const StopSignals signals;
  raise_descriptor_limit(options.max_connections);
  Server server(options);
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    bool draining = false;
    while (!done) {
      const int sig = signals.wait(100);
      if ((sig == SIGTERM || sig == SIGINT) && !draining) {
        draining = true;
        server.begin_drain(sig == SIGTERM ? "SIGTERM" : "SIGINT");
      }
      if (!draining) continue;
      server.stop_when_drained();
      // A forward pass that never returns would hold the stop for ever: past the drain and the connections'
      // own timeouts, the process ends without them.
      const auto limit = std::chrono::seconds(options.drain_timeout_s + options.idle_timeout_s + options.body_timeout_s +
                                              options.header_timeout_s + 10);
      if (Clock::now() - server.drain_began() > limit) {
        std::fprintf(stderr, "convnets serve: not stopped %lld s after the signal; exiting with requests unanswered\n",
                     static_cast<long long>(limit.count()));
        std::fflush(nullptr);
        std::_Exit(1);
      }
    }
  });
  int rc = 0;
  try {
    rc = server.serve();
  } catch (...) {
    done = true;
    watcher.join();
    throw;
  }
  done = true;
  watcher.join();
  std::fprintf(stderr, "convnets serve: stopped (%s)\n", server.answered().c_str());
  return rc;
}

}  // namespace convnets::serve
