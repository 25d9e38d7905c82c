// Triton's dynamic batching for one model: requests queued under a bound, gathered into batches up to a size, a preferred size or a delay, run by a number of instances, each request answered with its own rows.
#pragma once

#include "deploy/triton_config.h"

#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace convnets::serve {

// Triton's settings that shape batching (deploy/triton_config.h), the one struct `serve` and `export` share.
using BatchingOptions = deploy::DynamicBatching;

// The batch sizes a model served on CUDA captures a graph of where --graph-batch-sizes names none: the powers of two
// below max_batch_size and max_batch_size itself (a batch pads up to the next: at most 2x the rows, one graph per
// doubling, as TensorRT's engines are built per optimisation profile).
std::vector<std::int64_t> serving_graph_sizes(std::int64_t max_batch_size);
// Triton's preferred size for a model whose engine replays graphs of `graph_sizes`, unless `b` names its own: the
// largest within max_batch_size, so that a full batch leaves at once and a smaller one takes every row queued (the
// engine pads it up to the next captured graph). Every captured size as a preferred one would cut a queue of 7 rows
// into passes of 4, 2 and 1 where one padded pass of 8 costs about what 4 does.
BatchingOptions batching_for_graphs(BatchingOptions b, const std::vector<std::int64_t>& graph_sizes);

// How one request ended. status 200 with its rows of the logits, or the HTTP status Triton answers with: 503
// for a full queue, an expired timeout or a server shutting down, 500 for a failed forward pass.
struct Outcome {
  int status = 200;
  std::string error;
  at::Tensor logits;  // float32 [rows, classes] on the CPU
  std::int64_t queue_us = 0, compute_us = 0, batch_rows = 0;
};

// What the batcher has done since it started, for /metrics.
struct BatcherStats {
  std::int64_t executions = 0, inferences = 0;  // forward passes, rows through them
  std::int64_t queue_us = 0, compute_us = 0;    // summed over requests (Triton's queue and compute durations)
  std::int64_t refused_full = 0, timed_out = 0, failed = 0;
  std::int64_t pending = 0;                     // requests waiting now
  std::map<std::int64_t, std::int64_t> batch_sizes;  // rows per forward pass -> passes
};

class Batcher {
 public:
  using Clock = std::chrono::steady_clock;
  // `run` takes a batch (rows of one kind stacked on dim 0) and gives its float logits, one row per row. It is
  // called from `instances` threads at once.
  using Run = std::function<at::Tensor(const at::Tensor&)>;

  Batcher(BatchingOptions options, Run run);
  ~Batcher();  // finish(), then joins
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Queues `rows` (dim 0 the batch; the other dims and dtype say which requests it may share a pass with).
  // Answers at once (ready future) when the queue is full or the batcher is finishing. `timeout_us`: the
  // request fails with 503 if no pass has taken it by then, as Triton's request timeout does (answered when the
  // next batch is formed; a timeout over a day is none).
  std::future<Outcome> submit(at::Tensor rows, std::optional<std::int64_t> timeout_us = std::nullopt);
  // The same, the outcome handed to `done` instead: on this thread for a request answered at once, else on the
  // instance thread that ran its pass (or the one that found its timeout passed), outside the batcher's lock. For
  // a front end that must not block a thread per request.
  void submit(at::Tensor rows, std::optional<std::int64_t> timeout_us, std::function<void(Outcome)> done);

  // A request from its arrival at the server to its answer, held by the caller and released by dropping it; with
  // BatchingOptions::known_arrivals off, an empty token that counts nothing.
  std::shared_ptr<void> announce();

  // Refuses new requests, runs every queued one, and returns when the instances are idle.
  void finish();
  BatcherStats stats() const;
  std::int64_t queued() const;  // requests waiting for a pass now
  const BatchingOptions& options() const { return options_; }

 private:
  struct Job {
    at::Tensor rows;
    Clock::time_point queued, deadline;
    std::function<void(Outcome)> done;
  };
  void instance_loop();
  // Under the lock: takes the jobs of the next batch off the queue, waiting for the batch to fill as the
  // options allow; those whose timeout passed go to `expired`, to be answered outside the lock. Empty when
  // finishing with nothing queued.
  std::vector<Job> next_batch(std::unique_lock<std::mutex>& lock, std::vector<std::pair<Job, Outcome>>& expired);
  // The largest preferred batch size that `rows` queued rows can fill; 0 when none.
  std::int64_t preferred_within(std::int64_t rows) const;

  BatchingOptions options_;
  Run run_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> queue_;
  bool finishing_ = false;
  int busy_ = 0;
  std::int64_t announced_ = 0;  // requests between announce() and their token's release
  BatcherStats stats_;
  std::vector<std::thread> instances_;
};

}  // namespace convnets::serve
