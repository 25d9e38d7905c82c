// The models a server holds, as Triton's model repository manager holds them: each name's served version (shared by the requests admitted to it), its state and reason, --model-control-mode's load, unload and poll, and the retirement of a replaced version once its last request is answered.
#pragma once

#include "serve/repository_control.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace convnets::serve {

class ServedModel;
struct ServerOptions;

class ModelRepository {
 public:
  // Loads the startup models (every one the MODEL arguments name; in explicit mode only --load-model's) and, in
  // poll mode, starts polling. Throws Error naming a model that does not load or a --load-model not among them.
  explicit ModelRepository(const ServerOptions& options);
  ~ModelRepository();  // stop()
  ModelRepository(const ModelRepository&) = delete;
  ModelRepository& operator=(const ModelRepository&) = delete;

  // The version served under `name` now, or null. A request holds it until answered: a reload or unload meanwhile
  // serves new requests from the new one (or none) while this one finishes on the old.
  std::shared_ptr<ServedModel> find(const std::string& name) const;
  // Why `name` is not served: Triton's 404 texts.
  std::string missing(const std::string& name) const;
  std::vector<std::shared_ptr<ServedModel>> served() const;  // by name
  // POST /v2/repository/index's JSON array: every model the arguments name or that was loaded, with its version,
  // state (READY, LOADING, UNLOADING, UNAVAILABLE) and reason where Triton gives them; READY ones only if asked.
  std::string index(bool ready_only) const;
  // Versions in memory, retiring ones included: one per served model once the replaced ones' requests are answered.
  int in_memory() const;

  // Triton's load and unload, answered through `done` from the control thread that runs them one at a time (a
  // load takes seconds; the fronts' threads do not wait for it). Outside explicit mode, 503 at once, as Triton.
  void load(const std::string& name, LoadRequest request, std::function<void(ControlResult)> done);
  void unload(const std::string& name, std::function<void(ControlResult)> done);

  // Stops polling and the control thread, then lets each served model's batcher run what it holds.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace convnets::serve
