#include "serve/model_repository.h"

#include "core/error.h"
#include "core/json.h"
#include "deploy/triton_repo.h"
#include "serve/served_model.h"
#include "serve/server_options.h"

#include <nlohmann/json.hpp>

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

namespace convnets::serve {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// Deletes retired versions on a thread of its own: the last request of a replaced version may be answered on that
// version's batcher thread, which cannot join itself in the version's destructor.
class Reaper {
 public:
  Reaper() : thread_([this] { run(); }) {}
  ~Reaper() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void retire(ServedModel* m) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(m);
    }
    wake_.notify_one();
  }
  std::atomic<int> alive{0};

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto* m = queue_.front();
      queue_.pop_front();
      lock.unlock();
      delete m;  // its batcher runs what it still holds, then joins its threads
      --alive;
      lock.lock();
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<ServedModel*> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the rest is built
};

struct Entry {
  std::shared_ptr<ServedModel> model;   // the version served; null when none is
  std::weak_ptr<ServedModel> retiring;  // after an unload: UNLOADING until its last request is answered
  bool loading = false, unloaded = false;
  std::string failure;                    // the last load's, while no version is served
  fs::file_time_type mtime{};             // of the file the served version was read from (poll)
  std::optional<fs::file_time_type> failed_mtime;  // a file poll could not load: tried again once it changes
};

// A JSON integer as Triton's JSON configuration may write it: a number, or (protobuf's mapping of int64) a string.
std::int64_t config_int(const Json& v, const std::string& key) {
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_string()) {
    const auto s = v.get<std::string>();
    if (!s.empty() && s.find_first_not_of("0123456789") == std::string::npos && s.size() < 12) return std::stoll(s);
  }
  throw Error("Invalid config override: '" + key + "' must be an integer, got " + v.dump());
}

// A temporary folder, gone with the object.
struct TempDir {
  fs::path root;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "convnets-serve-load-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw Error("cannot make a temporary folder in " + fs::temp_directory_path().string());
    root = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
};

}  // namespace

struct ModelRepository::Impl {
  explicit Impl(const ServerOptions& o) : options(o) {}

  // The (name, path) pairs the MODEL arguments name now: a repository folder read again, a file that is gone left
  // out (poll unloads its model).
  std::map<std::string, std::string> catalog() const {
    std::map<std::string, std::string> out;
    for (const auto& spec : options.models) {
      try {
        for (auto& [name, path] : served_model_paths({spec})) out.emplace(name, path);
      } catch (const std::exception&) {
      }
    }
    return out;
  }

  std::shared_ptr<ServedModel> make(const std::string& name, const std::string& path, const BatchingOptions& b) {
    auto* m = new ServedModel(name, path, options.inference, b, options.max_image_pixels);
    ++reaper.alive;
    return std::shared_ptr<ServedModel>(m, [r = &reaper](ServedModel* p) { r->retire(p); });
  }

  void install(const std::string& name, std::shared_ptr<ServedModel> model, fs::file_time_type mtime) {
    std::lock_guard<std::mutex> lock(mutex);
    auto& e = entries[name];
    std::swap(e.model, model);  // the old version (if any) goes with `model`: its requests keep it until answered
    e.loading = e.unloaded = false;
    e.failure.clear();
    e.mtime = mtime;
    e.failed_mtime.reset();
  }

  // Triton's parameters.config: the settings convnets serve batches by taken from it; any other field must say
  // what the served version's configuration says (a configuration read back and edited loads), else it is refused
  // by name rather than silently ignored.
  BatchingOptions with_config(const std::string& name, const std::string& text) const {
    Json c;
    try {
      c = Json::parse(text);
    } catch (const Json::exception& e) {
      throw Error(std::string("Invalid config override: ") + e.what());
    }
    if (!c.is_object()) throw Error("Invalid config override: expected a JSON object, got " + c.dump());
    BatchingOptions b = options.batching;
    Json served;
    if (auto m = find(name)) served = Json::parse(m->config());
    for (const auto& [key, v] : c.items()) {
      if (key == "name") {
        if (v != name) throw Error("Invalid config override: its name " + v.dump() + " is not the model's, '" + name + "'");
      } else if (key == "max_batch_size") {
        b.max_batch_size = config_int(v, key);
      } else if (key == "dynamic_batching" && v.is_object()) {
        for (const auto& [k, x] : v.items()) {
          if (k == "max_queue_delay_microseconds") {
            b.max_queue_delay_us = config_int(x, k);
          } else if (k == "preferred_batch_size" && x.is_array()) {
            b.preferred_batch_sizes.clear();
            for (const auto& s : x) b.preferred_batch_sizes.push_back(config_int(s, k));
          } else if (k == "default_queue_policy" && x.is_object() && x.contains("max_queue_size") && x.size() == 1) {
            b.max_queue_size = config_int(x["max_queue_size"], "max_queue_size");
          } else {
            throw Error("Invalid config override: dynamic_batching." + k + " is not one convnets serve applies "
                        "(max_queue_delay_microseconds, preferred_batch_size, default_queue_policy.max_queue_size)");
          }
        }
      } else if (key == "instance_group" && v.is_array() && v.size() == 1 && v[0].is_object() && v[0].contains("count")) {
        b.instances = static_cast<int>(config_int(v[0]["count"], "instance_group.count"));
      } else if (!served.is_object() || !served.contains(key) || served[key] != v) {
        throw Error("Invalid config override: '" + key + "' cannot be changed by convnets serve; it applies name, "
                    "max_batch_size, dynamic_batching and instance_group[0].count");
      }
    }
    b.validate();
    return b;
  }

  // The model folder a file override describes, written out: NAME/PATH for each "file:PATH".
  std::string from_files(const std::string& name, const LoadRequest& r, const TempDir& dir) const {
    const fs::path folder = dir.root / name;
    for (const auto& [key, bytes] : r.files) {
      const auto rel = fs::path(key.substr(5)).lexically_normal();
      if (key.size() <= 5 || rel.is_absolute() || rel.empty() || *rel.begin() == "..") {
        throw Error("Invalid file parameter '" + utf8_escaped(key) + "' with normalized path '" + rel.string() +
                    "' must stay within model directory.");
      }
      fs::create_directories((folder / rel).parent_path());
      std::ofstream out(folder / rel, std::ios::binary);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      if (!out) throw Error("cannot write the load's file " + (folder / rel).string());
    }
    for (auto& [n, path] : served_model_paths({dir.root.string()})) {
      if (n == name) return path;
    }
    throw Error("the files give no " + name + "/VERSION/model.onnx");
  }

  // One load, on the control thread: Triton's statuses and texts, the served version kept when it fails.
  ControlResult load_now(const std::string& name, const LoadRequest& r) {
    if (name.empty()) return {400, "Model name cannot be empty"};
    if (!deploy::valid_triton_model_name(name)) {
      return {400, "invalid model name '" + utf8_escaped(name) + "': letters, digits, '_', '-' or '.', not starting with '.'"};
    }
    const std::string poll_failed = "failed to load '" + name + "', failed to poll from model repository: ";
    BatchingOptions batching = options.batching;
    std::unique_ptr<TempDir> dir;
    std::string path;
    try {
      if (r.has_config) batching = with_config(name, r.config);
      if (!r.files.empty()) {
        if (!r.has_config) throw Error("Load parameter 'config' must be specified for model file override");
        dir = std::make_unique<TempDir>();
        path = from_files(name, r, *dir);
      } else {
        const auto all = catalog();
        const auto it = all.find(name);
        if (it == all.end()) throw Error("no model '" + name + "' among the MODEL arguments, nor in their repository folders");
        path = it->second;
      }
    } catch (const std::exception& e) {
      return {500, poll_failed + e.what()};
    }
    std::error_code ec;
    const auto mtime = fs::last_write_time(path, ec);
    return load_path(name, path, batching, ec ? fs::file_time_type{} : mtime, dir ? "its load's files" : path);
  }

  ControlResult load_path(const std::string& name, const std::string& path, const BatchingOptions& batching,
                          fs::file_time_type mtime, const std::string& from) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto& e = entries[name];
      if (!e.model) e.loading = true;
    }
    std::printf("convnets serve: loading model %s from %s\n", name.c_str(), from.c_str());
    std::fflush(stdout);
    std::shared_ptr<ServedModel> model;
    try {
      model = make(name, path, batching);
    } catch (const std::exception& e) {
      const std::string why = std::string("Internal: ") + e.what();
      {
        std::lock_guard<std::mutex> lock(mutex);
        auto& entry = entries[name];
        entry.loading = false;
        entry.failed_mtime = mtime;
        if (!entry.model) entry.failure = why;
      }
      std::fprintf(stderr, "convnets serve: model %s did not load from %s (%s)%s\n", name.c_str(), from.c_str(),
                   e.what(), find(name) ? "; the version loaded before is still served" : "");
      return {400, "load failed for model '" + name + "': version 1 is at UNAVAILABLE state: " + why + ";\n"};
    }
    install(name, std::move(model), mtime);
    std::printf("convnets serve: model %s ready\n", name.c_str());
    std::fflush(stdout);
    return {};
  }

  ControlResult unload_now(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = entries.find(name);
    if (it == entries.end() || !it->second.model) return {};  // as Triton: nothing to unload is no error
    auto& e = it->second;
    e.retiring = e.model;
    e.model.reset();
    e.unloaded = true;
    e.failure.clear();
    std::printf("convnets serve: model %s unloaded; its requests in flight finish\n", name.c_str());
    std::fflush(stdout);
    return {};
  }

  // Triton's poll: a file newer than the version served reloads it, a new model loads, a model whose file is gone
  // unloads. A file that failed is tried again once it changes.
  void poll() {
    const auto all = catalog();
    for (const auto& [name, path] : all) {
      std::error_code ec;
      const auto mtime = fs::last_write_time(path, ec);
      if (ec) continue;
      {
        std::lock_guard<std::mutex> lock(mutex);
        const auto it = entries.find(name);
        if (it != entries.end() && ((it->second.model && it->second.mtime == mtime) || it->second.failed_mtime == mtime)) {
          continue;
        }
      }
      load_path(name, path, options.batching, mtime, path);
    }
    std::vector<std::string> gone;
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (const auto& [name, e] : entries) {
        if (e.model && !all.count(name)) gone.push_back(name);
      }
    }
    for (const auto& name : gone) unload_now(name);
  }

  std::shared_ptr<ServedModel> find(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = entries.find(name);
    return it == entries.end() ? nullptr : it->second.model;
  }

  struct Job {
    std::function<ControlResult()> op;
    std::function<void(ControlResult)> done;
  };

  // The control thread: one load or unload at a time, in the order asked; in poll mode a poll between them.
  void control_loop() {
    using Clock = std::chrono::steady_clock;
    const bool polling = options.model_control == ModelControl::Poll && options.repository_poll_secs > 0;
    const auto every = std::chrono::seconds(options.repository_poll_secs);
    auto next_poll = Clock::now() + every;
    std::unique_lock<std::mutex> lock(jobs_mutex);
    for (;;) {
      const auto ready = [this] { return stopping || !jobs.empty(); };
      if (polling) {
        wake.wait_until(lock, next_poll, ready);
      } else {
        wake.wait(lock, ready);
      }
      if (stopping) break;
      if (!jobs.empty()) {
        auto job = std::move(jobs.front());
        jobs.pop_front();
        lock.unlock();
        ControlResult result;
        try {
          result = job.op();
        } catch (const std::exception& e) {
          result = {500, e.what()};
        }
        job.done(result);
        lock.lock();
      } else if (polling && Clock::now() >= next_poll) {
        lock.unlock();
        try {
          poll();
        } catch (const std::exception& e) {
          std::fprintf(stderr, "convnets serve: polling the models failed: %s\n", e.what());
        }
        lock.lock();
        next_poll = Clock::now() + every;
      }
    }
    for (auto& job : jobs) job.done({503, "the server is shutting down: no model is loaded or unloaded"});
    jobs.clear();
  }

  void submit(Job job) {
    {
      std::lock_guard<std::mutex> lock(jobs_mutex);
      if (!stopping) {
        jobs.push_back(std::move(job));
        job.done = nullptr;
      }
    }
    if (job.done) return job.done({503, "the server is shutting down: no model is loaded or unloaded"});
    wake.notify_one();
  }

  const ServerOptions& options;
  Reaper reaper;  // first: it outlives every version
  mutable std::mutex mutex;
  std::map<std::string, Entry> entries;
  std::mutex jobs_mutex;
  std::condition_variable wake;
  std::deque<Job> jobs;
  bool stopping = false;
  bool stopped = false;
  std::thread control;
};

ModelRepository::ModelRepository(const ServerOptions& o) : impl_(std::make_unique<Impl>(o)) {
  const auto named = served_model_paths(o.models);  // every argument checked, two of one name refused
  std::set<std::string> wanted;
  if (o.model_control == ModelControl::Explicit) {
    for (const auto& n : o.load_models) {
      if (n == "*") {
        if (o.load_models.size() > 1) throw Error("--load-model '*' must be the only --load-model if given at all");
        for (const auto& [name, path] : named) wanted.insert(name);
        continue;
      }
      const bool known = std::any_of(named.begin(), named.end(), [&](const auto& p) { return p.first == n; });
      if (!known) {
        std::string names;
        for (const auto& [name, path] : named) names += (names.empty() ? "" : ", ") + name;
        throw Error("--load-model " + n + ": no such model among the MODEL arguments (" + names + ")");
      }
      wanted.insert(n);
    }
  } else {
    if (!o.load_models.empty()) {
      throw Error("--load-model needs --model-control-mode explicit (in none and poll modes every model loads)");
    }
    for (const auto& [name, path] : named) wanted.insert(name);
  }
  for (const auto& [name, path] : named) {
    if (!wanted.count(name)) continue;
    std::printf("convnets serve: loading model %s from %s\n", name.c_str(), path.c_str());
    std::fflush(stdout);
    std::error_code ec;
    const auto mtime = fs::last_write_time(path, ec);
    impl_->install(name, impl_->make(name, path, o.batching), ec ? fs::file_time_type{} : mtime);
  }
  impl_->control = std::thread([impl = impl_.get()] { impl->control_loop(); });
}

ModelRepository::~ModelRepository() { stop(); }

std::shared_ptr<ServedModel> ModelRepository::find(const std::string& name) const { return impl_->find(name); }

std::string ModelRepository::missing(const std::string& name) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->entries.count(name)) return "Request for unknown model: '" + utf8_escaped(name) + "' has no available versions";
  return "Request for unknown model: '" + utf8_escaped(name) + "' is not found";
}

std::vector<std::shared_ptr<ServedModel>> ModelRepository::served() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<std::shared_ptr<ServedModel>> out;
  for (const auto& [name, e] : impl_->entries) {
    if (e.model) out.push_back(e.model);
  }
  return out;
}

std::string ModelRepository::index(bool ready_only) const {
  const auto all = impl_->catalog();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::set<std::string> names;
  for (const auto& [name, path] : all) names.insert(name);
  for (const auto& [name, e] : impl_->entries) names.insert(name);
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& name : names) {
    nlohmann::ordered_json j{{"name", name}};
    const auto it = impl_->entries.find(name);
    if (it != impl_->entries.end()) {
      const auto& e = it->second;
      j["version"] = "1";
      if (e.model) {
        j["state"] = "READY";
      } else if (e.loading) {
        j["state"] = "LOADING";
      } else if (e.unloaded && !e.retiring.expired()) {
        j["state"] = "UNLOADING";
      } else {
        j["state"] = "UNAVAILABLE";
        j["reason"] = e.unloaded ? "unloaded" : e.failure;
      }
    }
    if (!ready_only || j.value("state", "") == "READY") list.push_back(j);
  }
  return dump_json(list);
}

int ModelRepository::in_memory() const { return impl_->reaper.alive.load(); }

void ModelRepository::load(const std::string& name, LoadRequest request, std::function<void(ControlResult)> done) {
  if (impl_->options.model_control != ModelControl::Explicit) return done(control_not_allowed());
  impl_->submit({[impl = impl_.get(), name, r = std::move(request)] { return impl->load_now(name, r); }, std::move(done)});
}

void ModelRepository::unload(const std::string& name, std::function<void(ControlResult)> done) {
  if (impl_->options.model_control != ModelControl::Explicit) return done(control_not_allowed());
  impl_->submit({[impl = impl_.get(), name] { return impl->unload_now(name); }, std::move(done)});
}

void ModelRepository::stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  {
    std::lock_guard<std::mutex> lock(impl_->jobs_mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  if (impl_->control.joinable()) impl_->control.join();
  for (const auto& m : served()) m->batcher().finish();
}

}  // namespace convnets::serve
