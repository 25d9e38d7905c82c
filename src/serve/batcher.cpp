#include "serve/batcher.h"

#include <ATen/ops/cat.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <utility>

namespace convnets::serve {
namespace {

std::int64_t micros(Batcher::Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}

bool same_kind(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes().slice(1) == b.sizes().slice(1);
}

Outcome refused(int status, std::string error) {
  Outcome o;
  o.status = status;
  o.error = std::move(error);
  return o;
}

// A completion that throws must not take the instance thread with it.
void complete(std::function<void(Outcome)>& done, Outcome o) {
  try {
    done(std::move(o));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "convnets serve: answering a request failed: %s\n", e.what());
  }
}

}  // namespace

std::vector<std::int64_t> serving_graph_sizes(std::int64_t max_batch_size) {
  std::vector<std::int64_t> sizes;
  for (std::int64_t s = 1; s < max_batch_size; s *= 2) sizes.push_back(s);
  sizes.push_back(max_batch_size);
  return sizes;
}

BatchingOptions batching_for_graphs(BatchingOptions b, const std::vector<std::int64_t>& graph_sizes) {
  if (!b.preferred_batch_sizes.empty()) return b;
  std::int64_t largest = 0;
  for (auto s : graph_sizes) {
    if (s <= b.max_batch_size) largest = std::max(largest, s);
  }
  // 1 as the preferred size would send each request alone, never waiting --max-queue-delay-us for others.
  if (largest > 1) b.preferred_batch_sizes = {largest};
  return b;
}

Batcher::Batcher(BatchingOptions options, Run run) : options_(std::move(options)), run_(std::move(run)) {
  options_.validate();
  try {
    for (int i = 0; i < options_.instances; ++i) instances_.emplace_back([this] { instance_loop(); });
  } catch (...) {
    finish();
    for (auto& t : instances_) t.join();
    throw;
  }
}

Batcher::~Batcher() {
  finish();
  for (auto& t : instances_) t.join();
}

std::future<Outcome> Batcher::submit(at::Tensor rows, std::optional<std::int64_t> timeout_us) {
  auto promise = std::make_shared<std::promise<Outcome>>();
  auto future = promise->get_future();
  submit(std::move(rows), timeout_us, [promise](Outcome o) { promise->set_value(std::move(o)); });
  return future;
}

void Batcher::submit(at::Tensor rows, std::optional<std::int64_t> timeout_us, std::function<void(Outcome)> done) {
  if (!rows.defined() || rows.dim() < 1 || rows.size(0) < 1) return complete(done, refused(400, "the request holds no rows"));
  if (rows.size(0) > options_.max_batch_size) {
    return complete(done, refused(400, "the request's batch of " + std::to_string(rows.size(0)) + " exceeds the model's " +
                                           "max_batch_size of " + std::to_string(options_.max_batch_size)));
  }
  Job job;
  job.rows = std::move(rows);
  job.queued = Clock::now();
  // Beyond a day a timeout means none; the cap also keeps a client's 2^63-1 from overflowing the clock.
  constexpr std::int64_t kDayUs = std::int64_t{86'400} * 1'000'000;
  job.deadline = timeout_us && *timeout_us > 0 && *timeout_us <= kDayUs
                     ? job.queued + std::chrono::microseconds(*timeout_us)
                     : Clock::time_point::max();
  job.done = std::move(done);
  std::optional<Outcome> now;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finishing_) {
      now = refused(503, "the server is shutting down: no new requests are taken");
    } else if (static_cast<std::int64_t>(queue_.size()) >= options_.max_queue_size) {
      ++stats_.refused_full;
      now = refused(503, "Exceeds maximum queue size: " + std::to_string(options_.max_queue_size) +
                             " requests are waiting (--max-queue-size)");
    } else {
      queue_.push_back(std::move(job));
    }
  }
  if (now) return complete(job.done, std::move(*now));
  changed_.notify_all();
}

std::shared_ptr<void> Batcher::announce() {
  // Without known arrivals nothing waits on them: no count, and no instance woken as each request is answered.
  if (!options_.known_arrivals) return nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++announced_;
  }
  return std::shared_ptr<void>(nullptr, [this](void*) {
    bool leave = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --announced_;
      leave = !queue_.empty() && static_cast<std::int64_t>(queue_.size()) >= announced_;
    }
    // One fewer on its way: a queue that now holds every request left may leave (next_batch's test).
    if (leave) changed_.notify_all();
  });
}

void Batcher::finish() {
  std::unique_lock<std::mutex> lock(mutex_);
  finishing_ = true;
  changed_.notify_all();
  changed_.wait(lock, [this] { return queue_.empty() && busy_ == 0; });
}

BatcherStats Batcher::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  BatcherStats s = stats_;
  s.pending = static_cast<std::int64_t>(queue_.size());
  return s;
}

std::int64_t Batcher::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<std::int64_t>(queue_.size());
}

std::int64_t Batcher::preferred_within(std::int64_t rows) const {
  std::int64_t best = 0;
  for (auto p : options_.preferred_batch_sizes) {
    if (p <= rows) best = std::max(best, p);
  }
  return best;
}

std::vector<Batcher::Job> Batcher::next_batch(std::unique_lock<std::mutex>& lock,
                                              std::vector<std::pair<Job, Outcome>>& expired) {
  const auto delay = std::chrono::microseconds(options_.max_queue_delay_us);
  std::int64_t limit = options_.max_batch_size;
  for (;;) {
    limit = options_.max_batch_size;
    changed_.wait(lock, [this] { return !queue_.empty() || finishing_; });
    if (queue_.empty()) return {};
    const auto& first = queue_.front().rows;
    std::int64_t rows = 0;
    for (const auto& j : queue_) {
      if (same_kind(j.rows, first) && rows + j.rows.size(0) <= options_.max_batch_size) rows += j.rows.size(0);
    }
    const auto until = queue_.front().queued + delay;
    // As Triton: the largest preferred size that the queue can fill leaves at once, cut to that size.
    if (const auto p = preferred_within(rows)) {
      limit = p;
      break;
    }
    if (rows >= options_.max_batch_size || finishing_ || Clock::now() >= until) break;
    // Every request the server holds is queued: nothing can join this batch before new clients send, so waiting
    // would only add latency (a lone request at concurrency 1 waited out the whole delay).
    if (options_.known_arrivals && static_cast<std::int64_t>(queue_.size()) >= announced_) break;
    changed_.wait_until(lock, until);
  }
  // The oldest request decides the kind; later ones of that kind join while they fit, and requests whose
  // timeout has passed are answered instead of run.
  std::vector<Job> batch;
  std::int64_t rows = 0;
  const auto now = Clock::now();
  const at::Tensor kind = queue_.front().rows;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (it->deadline <= now) {
      ++stats_.timed_out;
      Outcome o;
      o.status = 503;
      o.error = "Request timeout expired: no batch took it within its timeout";
      o.queue_us = micros(now - it->queued);
      expired.emplace_back(std::move(*it), std::move(o));
      it = queue_.erase(it);
      continue;
    }
    if (same_kind(it->rows, kind) && rows + it->rows.size(0) <= limit) {
      rows += it->rows.size(0);
      batch.push_back(std::move(*it));
      it = queue_.erase(it);
      continue;
    }
    ++it;
  }
  return batch;
}

void Batcher::instance_loop() {
  for (;;) {
    std::vector<Job> batch;
    std::vector<std::pair<Job, Outcome>> expired;
    bool done = false;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      batch = next_batch(lock, expired);
      // Counted busy while it answers the expired, so that finish() waits for those answers too.
      if (!batch.empty() || !expired.empty()) ++busy_;
      done = batch.empty() && expired.empty() && finishing_ && queue_.empty();
    }
    if (done) {
      changed_.notify_all();  // finish() waits for this
      return;
    }
    for (auto& [job, outcome] : expired) complete(job.done, std::move(outcome));
    if (batch.empty()) {
      if (!expired.empty()) {
        std::lock_guard<std::mutex> lock(mutex_);
        --busy_;
      }
      changed_.notify_all();
      continue;  // every request taken had timed out
    }
    const auto start = Clock::now();
    std::vector<at::Tensor> parts;
    for (const auto& j : batch) parts.push_back(j.rows);
    Outcome shared;
    try {
      shared.logits = run_(parts.size() == 1 ? parts[0] : at::cat(parts, 0));
    } catch (const std::exception& e) {
      shared.status = 500;
      shared.error = e.what();
    } catch (...) {
      shared.status = 500;
      shared.error = "the forward pass failed with an exception that is not a std::exception";
    }
    const auto end = Clock::now();
    std::int64_t total = 0;
    for (const auto& j : batch) total += j.rows.size(0);
    if (shared.status == 200 && (!shared.logits.defined() || shared.logits.dim() < 1 || shared.logits.size(0) != total)) {
      shared.status = 500;
      shared.error = "the engine gave " + std::to_string(shared.logits.defined() ? shared.logits.size(0) : 0) +
                     " rows of logits for a batch of " + std::to_string(total);
    }
    std::vector<Outcome> outcomes(batch.size());
    std::int64_t row = 0, queue_us = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      Outcome& o = outcomes[i];
      const auto& j = batch[i];
      o.status = shared.status;
      o.error = shared.error;
      o.queue_us = micros(start - j.queued);
      o.compute_us = micros(end - start);
      o.batch_rows = total;
      queue_us += o.queue_us;
      if (shared.status == 200) o.logits = shared.logits.narrow(0, row, j.rows.size(0));
      row += j.rows.size(0);
    }
    // The statistics first: a client that has its answer finds its pass counted (in /metrics, in stats()).
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.executions;
      stats_.queue_us += queue_us;
      stats_.compute_us += micros(end - start) * static_cast<std::int64_t>(batch.size());
      if (shared.status == 200) {
        stats_.inferences += row;
        ++stats_.batch_sizes[row];
      } else {
        stats_.failed += static_cast<std::int64_t>(batch.size());
      }
    }
    for (std::size_t i = 0; i < batch.size(); ++i) complete(batch[i].done, std::move(outcomes[i]));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --busy_;
    }
    changed_.notify_all();
  }
}

}  // namespace convnets::serve
