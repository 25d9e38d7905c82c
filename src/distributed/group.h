// The process group of a data-parallel run: c10d TCPStore rendezvous, a Gloo or NCCL backend, heartbeats, and failures that name the rank at fault.
#pragma once

#include "core/error.h"
#include "distributed/env.h"
#include "models/layers.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

namespace convnets::distributed {

// A distributed failure: a lost, hung or failed rank, or a rendezvous that
// could not complete. Its message names the rank (or the address) at fault.
class DistributedError : public Error {
 public:
  using Error::Error;
};

// The backend a run uses: "auto" is NCCL for a CUDA device, else Gloo. Throws
// for NCCL without a CUDA device, naming the flag, before any rendezvous.
std::string resolve_backend(const std::string& backend, const c10::Device& device);

// Fails at once when MASTER_ADDR does not resolve, or, for the process that
// serves the store (rank 0 / node 0), when it is not an address of this
// machine. The launcher checks it before starting workers; so does each rank.
// Returns whether every address it resolves to is loopback.
bool check_master_address(const WorkerEnv& env, bool serves_store);

// torch.distributed's default group, for one job: rank 0 serves a c10d
// TCPStore at MASTER_ADDR:MASTER_PORT (unless torchrun's agent already does),
// every rank checks in with its world size and rank, then the backend (NCCL
// for CUDA devices, Gloo otherwise) connects through the same store. A
// thread publishes a heartbeat and the step reached, so that when a
// collective fails or times out the survivors can say which rank stopped.
class Group : public models::BatchNormSync {
 public:
  class Pending;  // an asynchronous collective

  // Throws DistributedError within `env.timeout` (at once for an unresolvable
  // address, a port in use, a WORLD_SIZE that differs between ranks or a rank
  // taken twice). `backend`: "auto" (nccl on CUDA, else gloo), "gloo", "nccl".
  Group(const WorkerEnv& env, const c10::Device& device, const std::string& backend = "auto");
  ~Group() override;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return env_.rank; }
  int world_size() const override { return env_.world_size; }
  const WorkerEnv& env() const { return env_; }
  const std::string& backend() const { return backend_; }

  // Sum over ranks in place, started now; wait() blocks until it is done.
  std::shared_ptr<Pending> all_reduce_async(const at::Tensor& t, const char* what);
  void wait(Pending& p);
  void all_reduce_sum(at::Tensor& t) override;
  at::Tensor all_gather(const at::Tensor& t) override;
  void broadcast(at::Tensor& t, int root = 0);
  // Logical OR over ranks: every rank learns whether any rank raised `flag`.
  bool any(bool flag);

  // Reported with the heartbeat: how far this rank got.
  void set_progress(std::int64_t step) { step_.store(step); }
  // The most Gloo collectives this process has seen being launched at once (start() serializes them: 1 once any
  // ran). Process-wide, as the race it guards against was.
  static int gloo_launch_peak();

  // Best effort: leaves `message` in the store for the other ranks' diagnosis.
  void publish_failure(const std::string& message) noexcept;

  // Why the job broke, after `cause` (a failed or timed-out collective during
  // `what`): a published failure, the store host gone, a silent (dead or
  // stopped) rank, or one stuck behind. Takes a few heartbeat intervals.
  [[noreturn]] void fail(const std::string& what, const std::string& cause);

 private:
  struct Impl;
  // Issues a collective through `launch` (which fills in the Pending's work); a failure to issue it goes through fail().
  std::shared_ptr<Pending> start(const char* what, const std::function<void(Pending&)>& launch);
  void heartbeat_loop();
  at::Tensor on_backend_device(const at::Tensor& t) const;
  std::string diagnose();

  WorkerEnv env_;
  std::string backend_;
  std::unique_ptr<Impl> impl_;
  std::atomic<std::int64_t> step_{0};
  std::atomic<bool> stop_{false};
  std::thread heartbeat_;
};

}  // namespace convnets::distributed
