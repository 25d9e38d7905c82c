// The server behind both protocols: the models and their batchers, the worker threads, the drain, the metrics and the shared-memory registry, and the one path every inference request takes through them (admitted, read, resolved, batched, answered).
#pragma once

#include "kserve/messages.h"
#include "serve/repository_control.h"
#include "serve/shared_memory.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace convnets::serve {

// The server speaks the protocol kserve/messages.h reads and writes.
using namespace kserve;

struct ServerOptions;

class ServingCore {
 public:
  // Loads every model (a line on stdout before each: the load takes seconds, and a supervisor knows the server is
  // up to its own code), warms it and starts its batcher. Throws Error for a model that does not load.
  explicit ServingCore(const ServerOptions& options);
  ~ServingCore();  // finish()
  ServingCore(const ServingCore&) = delete;
  ServingCore& operator=(const ServingCore&) = delete;

  // What both protocols answer outside inference; JSON texts are Triton's HTTP bodies, which the gRPC service
  // turns into the messages of the same fields.
  bool ready() const;                    // false while draining
  std::string server_metadata() const;   // GET /v2
  std::string repository_index(bool ready_only = false) const;  // POST /v2/repository/index
  // "" when `name` (at `version`, "" or "1") is served, else the 404 message naming it.
  std::string find_model(const std::string& name, const std::string& version) const;
  // For a name find_model accepts; ProtocolError 404 if an unload took it since.
  std::string model_metadata(const std::string& name) const;
  std::string model_config(const std::string& name) const;  // Triton's model configuration
  // Triton's model repository extension (--model-control-mode explicit): `done` gets 200 once the new version
  // serves (or the model is unloaded), else Triton's status and message; from the thread that ran it.
  void load_model(const std::string& name, LoadRequest request, std::function<void(ControlResult)> done);
  void unload_model(const std::string& name, std::function<void(ControlResult)> done);
  SharedMemoryRegions& shared_memory();  // Triton's system shared-memory regions, one registry for both protocols

  // A request let in: counted in flight until its answer is handed back (the drain waits for it) and announced to
  // its model's batcher (a queue holding every request the server has need not wait for more). Copies share it.
  class Admission {
   public:
    Admission();
    ~Admission();
    Admission(const Admission&);
    Admission& operator=(const Admission&);
    struct State;  // serving_core.cpp's

   private:
    friend class ServingCore;
    std::shared_ptr<State> state_;
  };
  // A request whose headers named a served model, its body still on its way: announced to that version's batcher
  // from now on, so that a batch waits for a body being received (150 kB of tensors take a while to come in while
  // the engine holds every core) rather than leave without it. Nothing else: not counted in flight, not admitted.
  // Empty when the model or version is not served.
  class Arrival {
   public:
    struct State;  // serving_core.cpp's

   private:
    friend class ServingCore;
    std::shared_ptr<State> state_;
  };
  Arrival expect(const std::string& name, const std::string& version) const;
  // ProtocolError 503 while draining, 404 naming a model (or version) not served. `arrival`'s announcement carries
  // over when it named the version admitted to (a reload since: the new version's own).
  Admission admit(const std::string& name, const std::string& version, Arrival arrival = {});

  // The one request path. `read` gives the request (a protocol's body parsed: ProtocolError naming what is wrong);
  // inputs named in shared memory are read out on a worker; the input becomes the model's rows, which its batcher
  // runs; `done` gets 200 and the response, or the HTTP status (400, 404, 413, 500, 503) and message. Once, on any
  // thread: here when the request fails early, else on the instance thread or a worker. A failure counts against
  // the model (Triton's nv_inference_request_failure).
  using Read = std::function<InferRequest()>;
  using InferDone = std::function<void(int status, const std::string& error, InferResponse response)>;
  void infer(const Admission& admission, Read read, InferDone done);
  // Work a front must not do on its own thread (a large body's parse on the event loop): on a worker.
  void offload(std::function<void()> job);

  // The startup lines: one per model (its source, arch, engine and batch sizes), then the batching settings.
  std::vector<std::string> describe() const;
  // Prometheus' text: Triton's metric names per model, convnets' own, and the process'; the HTTP front's open
  // connections given.
  std::string metrics(int open_connections) const;
  // Refuses new requests from now on; returns how many are in flight.
  int begin_drain();
  int in_flight() const;
  // Each model's requests answered and failed, for the line the process ends with.
  std::string answered() const;
  // The batchers run what is queued, then the workers finish theirs: after it nothing answers into the fronts.
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace convnets::serve
