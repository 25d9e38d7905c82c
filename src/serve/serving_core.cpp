#include "serve/serving_core.h"

#include "core/error.h"
#include "core/stats.h"
#include "core/json.h"
#include "serve/model_repository.h"
#include "serve/served_model.h"
#include "serve/server_options.h"

#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace convnets::serve {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

std::int64_t micros_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t).count();
}

// The threads that turn a request's body into rows (JSON, image decoding, shared memory) and its logits into an
// answer: the fronts hand them on, and the batcher's instances hand the answers back. None waits on a forward pass.
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

std::int64_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  long long pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

}  // namespace

struct ServingCore::Impl {
  explicit Impl(const ServerOptions& o) : options(o), models(o), workers(std::max(2, static_cast<int>(std::thread::hardware_concurrency()))) {}
  ~Impl() { workers.finish(); }  // its jobs hold models' requests: they end before the models do

  // A parsed request through its model: shared memory read, rows made, queued on the batcher, the response made
  // from its logits and handed to `done` with the time it took counted (Triton's metrics). The instance thread
  // answers when nothing else waits, else a worker does: a hop to a worker cost a lone request more than its answer
  // takes to write (c1 0.89x httplib's, 2 vCPUs), and a queue needs the instance back.
  void run(const std::shared_ptr<Admission::State>& admitted, InferRequest parsed,
           const SharedMemoryRegions::Bound& bound, const InferDone& done);

  const ServerOptions& options;
  ModelRepository models;  // before the requests' state: every admission holds one of its versions
  Drain drain;
  SharedMemoryRegions shared_memory;  // before the workers, which read from it, so that it outlives them
  Workers workers;                    // last: destroyed first
};

struct ServingCore::Admission::State {
  Drain* drain = nullptr;
  std::shared_ptr<ServedModel> model;  // the version admitted to: a reload meanwhile does not take it away
  Clock::time_point start;
  std::shared_ptr<void> arriving;  // the batcher's announcement, released with the admission
  ~State() {
    if (drain) drain->leave();
  }
};

struct ServingCore::Arrival::State {
  std::shared_ptr<ServedModel> model;
  std::shared_ptr<void> announced;
};

ServingCore::Admission::Admission() = default;
ServingCore::Admission::~Admission() = default;
ServingCore::Admission::Admission(const Admission&) = default;
ServingCore::Admission& ServingCore::Admission::operator=(const Admission&) = default;

ServingCore::ServingCore(const ServerOptions& o) : impl_(std::make_unique<Impl>(o)) {}

ServingCore::~ServingCore() { finish(); }

bool ServingCore::ready() const { return !impl_->drain.draining(); }

std::string ServingCore::server_metadata() const {
  const Json extensions = {"classification", "binary_tensor_data", "model_configuration", "model_repository",
                           "system_shared_memory"};
  return dump_json(Json{{"name", "convnets"}, {"version", CONVNETS_VERSION}, {"extensions", extensions}});
}

std::string ServingCore::repository_index(bool ready_only) const { return impl_->models.index(ready_only); }

namespace {
// "" for the one version served ("" or "1"), else the 404 message naming it.
std::string unknown_version(const std::string& name, const std::string& version) {
  if (version.empty() || version == "1") return "";
  return "Request for unknown model: '" + name + "' version " + utf8_escaped(version) +
         " is not found (version 1 is served)";
}
}  // namespace

std::string ServingCore::find_model(const std::string& name, const std::string& version) const {
  if (!impl_->models.find(name)) return impl_->models.missing(name);
  return unknown_version(name, version);
}

namespace {
std::shared_ptr<ServedModel> served(const ModelRepository& models, const std::string& name) {
  auto m = models.find(name);
  if (!m) throw ProtocolError(404, models.missing(name));
  return m;
}
}  // namespace

std::string ServingCore::model_metadata(const std::string& name) const { return served(impl_->models, name)->metadata(); }
std::string ServingCore::model_config(const std::string& name) const { return served(impl_->models, name)->config(); }

void ServingCore::load_model(const std::string& name, LoadRequest request, std::function<void(ControlResult)> done) {
  if (!ready()) return done({503, "Server not ready"});
  impl_->models.load(name, std::move(request), std::move(done));
}

void ServingCore::unload_model(const std::string& name, std::function<void(ControlResult)> done) {
  if (!ready()) return done({503, "Server not ready"});
  impl_->models.unload(name, std::move(done));
}
SharedMemoryRegions& ServingCore::shared_memory() { return impl_->shared_memory; }

ServingCore::Arrival ServingCore::expect(const std::string& name, const std::string& version) const {
  Arrival a;
  auto model = impl_->models.find(name);
  if (!model || !unknown_version(name, version).empty()) return a;
  a.state_ = std::make_shared<Arrival::State>();
  a.state_->announced = model->batcher().announce();
  a.state_->model = std::move(model);
  return a;
}

ServingCore::Admission ServingCore::admit(const std::string& name, const std::string& version, Arrival arrival) {
  const auto start = Clock::now();
  if (!impl_->drain.enter()) throw ProtocolError(503, "the server is shutting down: no new requests are taken");
  auto model = impl_->models.find(name);
  // One lookup: the version admitted to is the one found here, whatever a reload does next.
  if (auto missing = model ? unknown_version(name, version) : impl_->models.missing(name); !missing.empty()) {
    impl_->drain.leave();
    throw ProtocolError(404, missing);
  }
  Admission a;
  a.state_ = std::make_shared<Admission::State>();
  a.state_->model = std::move(model);
  a.state_->start = start;
  const bool expected = arrival.state_ && arrival.state_->model == a.state_->model;
  a.state_->arriving = expected ? std::move(arrival.state_->announced) : a.state_->model->batcher().announce();
  a.state_->drain = &impl_->drain;
  return a;
}

void ServingCore::infer(const Admission& admission, Read read, InferDone done) {
  const auto admitted = admission.state_;
  InferRequest parsed;
  try {
    parsed = read();
  } catch (const Error& e) {
    ++admitted->model->counters().failure;
    return done(http_status_of(e), e.what(), {});
  }
  // A request of a few hundred bytes can name megabytes in shared memory: those are copied out on a worker, not on
  // the front's thread (the event loop every HTTP connection shares, or gRPC's). Its regions are bound here, as it
  // comes: an unregister while it waits for the worker does not take its bytes away.
  const bool shared = std::any_of(parsed.inputs.begin(), parsed.inputs.end(),
                                  [](const Tensor& t) { return t.shared_memory.has_value(); });
  if (!shared) return impl_->run(admitted, std::move(parsed), {}, done);
  auto bound = std::make_shared<SharedMemoryRegions::Bound>();
  try {
    *bound = impl_->shared_memory.bind(parsed);
  } catch (const Error& e) {
    ++admitted->model->counters().failure;
    return done(http_status_of(e), e.what(), {});
  }
  impl_->workers.submit(
      [impl = impl_.get(), admitted, r = std::make_shared<InferRequest>(std::move(parsed)), bound, done] {
        impl->run(admitted, std::move(*r), *bound, done);
      });
}

void ServingCore::Impl::run(const std::shared_ptr<Admission::State>& admitted, InferRequest parsed,
                            const SharedMemoryRegions::Bound& bound, const InferDone& done) {
  auto& m = *admitted->model;
  auto& c = m.counters();
  at::Tensor rows;
  try {
    shared_memory.read(parsed, bound);
    rows = m.rows_of(parsed);
  } catch (const Error& e) {
    ++c.failure;
    return done(http_status_of(e), e.what(), {});
  }
  auto request = std::make_shared<const InferRequest>(std::move(parsed));
  c.input_us += micros_since(admitted->start);
  m.batcher().submit(std::move(rows), request->timeout_us, [this, admitted, request, done](Outcome o) {
    auto& m = *admitted->model;
    if (o.status != 200) {
      ++m.counters().failure;
      return done(o.status, "model '" + m.name() + "': " + o.error, {});
    }
    auto answer = [admitted, request, done, logits = o.logits] {
      auto& m = *admitted->model;
      auto& c = m.counters();
      const auto out_start = Clock::now();
      InferResponse r;
      try {
        r = m.respond(*request, logits);
      } catch (const Error& e) {
        ++c.failure;
        return done(http_status_of(e), e.what(), {});
      }
      // Counted before the answer leaves: a client that reads /metrics once it has its answer sees it counted.
      ++c.success;
      done(200, "", std::move(r));
      c.output_us += micros_since(out_start);
      c.request_us += micros_since(admitted->start);
    };
    if (m.batcher().queued() == 0) return answer();
    workers.submit(std::move(answer));
  });
}

void ServingCore::offload(std::function<void()> job) { impl_->workers.submit(std::move(job)); }

std::vector<std::string> ServingCore::describe() const {
  std::vector<std::string> lines;
  const auto& b = impl_->options.batching;
  for (const auto& m : impl_->models.served()) {
    lines.push_back("model " + m->name() + " from " + m->path() + ": " + m->describe(b));
  }
  if (impl_->options.model_control != ModelControl::None) {
    lines.push_back(std::string("model control: ") +
                    (impl_->options.model_control == ModelControl::Explicit
                         ? "explicit (POST /v2/repository/models/NAME/load and /unload)"
                         : "poll, every " + std::to_string(impl_->options.repository_poll_secs) + " s"));
  }
  std::string preferred;
  for (auto s : b.preferred_batch_sizes) preferred += (preferred.empty() ? "" : ",") + std::to_string(s);
  lines.push_back("dynamic batching: max batch " + std::to_string(b.max_batch_size) + ", max queue delay " +
                  std::to_string(b.max_queue_delay_us) + " us, preferred sizes " +
                  (preferred.empty() ? "none" : preferred) + ", " + std::to_string(b.instances) +
                  " instance(s), max queue " + std::to_string(b.max_queue_size) + " requests");
  return lines;
}

std::string ServingCore::metrics(int open_connections) const {
  std::ostringstream out;
  struct Family {
    const char *name, *type, *help;
  };
  auto family = [&](const Family& f) { out << "# HELP " << f.name << ' ' << f.help << "\n# TYPE " << f.name << ' ' << f.type << '\n'; };
  auto labels = [](const std::string& model) { return "{model=\"" + model + "\",version=\"1\"}"; };
  // One snapshot of the served versions: a reload while this is written does not mix two.
  const auto models = impl_->models.served();
  std::map<std::string, BatcherStats> stats;
  for (const auto& m : models) stats[m->name()] = m->batcher().stats();
  auto each = [&](const Family& f, auto value) {
    family(f);
    for (const auto& m : models) out << f.name << labels(m->name()) << ' ' << value(*m, stats[m->name()]) << '\n';
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
  family({"convnets_models_in_memory", "gauge",
          "Model versions in memory: one per served model, and a replaced or unloaded one until its requests are answered"});
  out << "convnets_models_in_memory " << impl_->models.in_memory() << '\n';
  family({"convnets_http_open_connections", "gauge", "HTTP connections open now (idle kept-alive ones included)"});
  out << "convnets_http_open_connections " << open_connections << '\n';
  return out.str();
}

int ServingCore::begin_drain() { return impl_->drain.start(); }
int ServingCore::in_flight() const { return impl_->drain.in_flight(); }

std::string ServingCore::answered() const {
  std::string out;
  for (const auto& m : impl_->models.served()) {
    auto& c = m->counters();
    out += (out.empty() ? "" : "; ") + m->name() + ": " + std::to_string(c.success.load()) + " succeeded, " +
           std::to_string(c.failure.load()) + " failed";
  }
  return out;
}

void ServingCore::finish() {
  if (!impl_) return;
  impl_->models.stop();
  impl_->workers.finish();
}

}  // namespace convnets::serve
