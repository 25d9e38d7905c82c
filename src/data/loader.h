// The threaded batch loader: worker threads decode and transform samples into (pinned) uint8 batches, in a deterministic order.
#pragma once

#include "data/dataset.h"
#include "data/device_decode.h"
#include "data/sampler.h"
#include "data/transforms.h"

#include <ATen/core/Tensor.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace convnets::data {

enum class BadImagePolicy { Skip, Fail };

struct LoaderOptions {
  std::int64_t batch_size = 64;
  int workers = 0;       // 0: one per online CPU
  int prefetch = 2;      // batches prepared ahead, per worker
  bool drop_last = true; // drop the epoch's final partial batch (training)
  ShardOptions shard;    // shuffle, seed, rank and world size
  BadImagePolicy bad_images = BadImagePolicy::Skip;
  bool pin_memory = true;  // only takes effect when CUDA is available
  // Hybrid decoding: workers entropy-decode JPEGs and hand over coefficient
  // batches (Batch::encoded) for decode_on_device instead of pixels.
  bool device_decode = false;
  // timm's random erasing: boxes drawn here per sample (Batch::erase), filled
  // on the device after normalisation (apply_random_erasing).
  ErasingParams erasing;
  // Where bad-image reports go (one line per distinct file); stderr if empty.
  std::function<void(const std::string&)> warn;
  // Once every batch of the epoch is claimed, go on building epoch + 1's first batches (within the same prefetch
  // depth), which start_epoch(epoch + 1) then keeps. Without it the next epoch's first batch waits for one worker
  // to build all of it alone: about 0.4 s per epoch at batch 256, 37 % of an H200's step time on a 3,000-file set
  // (docs/history/gpu-run-2-2026-11-26-h200.md). For training loaders, whose next epoch is certain.
  bool lookahead = false;
};

struct Batch {
  at::Tensor images;                  // uint8 [B, size, size, channels], pinned when CUDA is present
  std::shared_ptr<const EncodedBatch> encoded;  // instead of images, with LoaderOptions::device_decode
  at::Tensor labels;                  // int64 [B]
  at::Tensor erase;                   // int32 [B, count, 4] (top, left, height, width; height 0: none), with erasing
  std::vector<std::int64_t> indices;  // dataset index per row, after bad-image replacement
  std::int64_t number = 0;            // position within the epoch
};

struct EpochStats {
  std::int64_t images = 0;
  std::int64_t bad_images = 0;  // samples replaced because their file was bad
  double read_s = 0, decode_s = 0, transform_s = 0;  // summed over workers
  std::int64_t device_images = 0;  // device_decode: decoded from coefficients on the device (the rest by the CPU)

  EpochStats& operator+=(const EpochStats& o) {
    images += o.images, bad_images += o.bad_images, device_images += o.device_images;
    read_s += o.read_s, decode_s += o.decode_s, transform_s += o.transform_s;
    return *this;
  }
};

// Batches come out in sampler order whatever the worker count: each sample's
// randomness is Rng(seed, epoch, index), and a bad sample is replaced by the
// next good index, so 1 and 16 workers give bit-identical epochs.
class Loader {
 public:
  Loader(DatasetPtr dataset, std::shared_ptr<const Transform> transform, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  std::int64_t samples_per_epoch() const { return samples_; }
  std::int64_t batches_per_epoch() const { return batches_; }
  int workers() const { return static_cast<int>(threads_.size()); }
  const Dataset& dataset() const { return *dataset_; }

  // Starts (or restarts) an epoch; batches still in flight are discarded,
  // except, with LoaderOptions::lookahead, those already built for this very
  // epoch when it follows the previous one from its first batch.
  // `first_batch` skips the batches before it without loading them: a run
  // resumed mid-epoch sees exactly the batches the interrupted run had left.
  void start_epoch(std::int64_t epoch, std::int64_t first_batch = 0);
  // The next batch of the epoch, or false when it is over. Rethrows a worker's
  // error (a bad image under BadImagePolicy::Fail, or anything unexpected).
  bool next(Batch& out);
  // next() that gives up after `timeout`, so that a caller can look at other
  // things (an interpreter's pending signals) while the workers decode.
  enum class Wait { Batch, End, Timeout };
  Wait next_for(Batch& out, std::chrono::milliseconds timeout);
  // Ends the epoch now: batches in flight are dropped and each worker gives
  // up the batch it builds after its current sample, then waits for the next
  // start_epoch(). next() afterwards throws, as before any start_epoch().
  void stop();
  bool active() const;
  std::int64_t epoch() const;
  // Totals over the batches returned so far in this epoch.
  EpochStats stats() const;
  // Every distinct bad file seen since construction.
  std::vector<std::string> bad_files() const;

 private:
  struct Result {
    Batch batch;
    EpochStats stats;
    std::exception_ptr error;
  };
  struct Worker;
  using Order = std::shared_ptr<const std::vector<std::int64_t>>;
  void run(Worker& w);
  Result build(Worker& w, const std::vector<std::int64_t>& order, std::int64_t number, std::int64_t epoch,
               std::int64_t generation);
  // One sample into dst (pixels) or, when dst is null, into the worker's EncodedBatchBuilder.
  std::int64_t fill(Worker& w, std::int64_t index, std::int64_t epoch, std::uint8_t* dst, EpochStats& stats);
  // The bad-image policy for sample `index`: throws under Fail, else records and warns once.
  void skip_bad(std::int64_t index, const codec::DecodeError& error);

  DatasetPtr dataset_;
  std::shared_ptr<const Transform> transform_;
  LoaderOptions options_;
  std::int64_t samples_ = 0, batches_ = 0;
  bool pinned_ = false;

  mutable std::mutex mutex_;
  std::condition_variable work_cv_, ready_cv_, idle_cv_;
  // Shared with the workers that build from them, so an epoch can start while they still read the last one's.
  Order order_, ahead_order_;  // ahead_order_: epoch_ + 1's, with lookahead
  std::int64_t epoch_ = 0, next_claim_ = 0, next_return_ = 0, ahead_claim_ = 0;
  // Bumped (under mutex_) by every start_epoch, stop and the destructor; a
  // worker reads it between samples without the lock to give up a stale batch.
  std::atomic<std::int64_t> generation_{0};
  int in_flight_ = 0;
  bool active_ = false, stopping_ = false;
  std::map<std::pair<std::int64_t, std::int64_t>, Result> ready_;  // by (epoch, batch number)
  EpochStats stats_;

  mutable std::mutex bad_mutex_;
  std::set<std::int64_t> bad_indices_;
  std::vector<std::string> bad_files_;

  std::vector<std::unique_ptr<Worker>> workers_state_;
  std::vector<std::thread> threads_;
};

// BadImagePolicy from the --bad-images value; the error names the flag.
BadImagePolicy parse_bad_image_policy(const std::string& value);

// uint8 [B, H, W, C] -> dtype [B, C, H, W] in `format` memory on `device`:
// (x / 255 - mean) / std as one multiply-add kernel that reads uint8 and
// writes `dtype` (on CUDA the casts happen inside that one pass). The permute
// of NHWC is already a channels-last NCHW view, so that layout costs nothing.
at::Tensor normalize_batch(const at::Tensor& images, const std::array<double, 3>& mean,
                           const std::array<double, 3>& std, at::Device device, at::ScalarType dtype,
                           at::MemoryFormat format = at::MemoryFormat::ChannelsLast);

// normalize_batch's float32 NCHW result on the CPU, computed on the calling
// thread alone, for callers whose own threads must keep the cores (the
// OpenVINO engine): LibTorch's OpenMP pool, once a parallel op wakes it,
// spins after the op and takes them.
at::Tensor normalize_batch_serial(const at::Tensor& images, const std::array<double, 3>& mean,
                                  const std::array<double, 3>& std);

// timm's RandomErasing fill on a normalised batch [B, C, H, W] (in place of
// `x`, returned): each box of `boxes` (Batch::erase) gets N(0, 1) noise per
// element (pixel), one N(0, 1) colour per channel (rand), or 0, the mean
// (const). Noise comes from the device's default generator.
at::Tensor apply_random_erasing(const at::Tensor& x, const at::Tensor& boxes, const std::string& mode);

}  // namespace convnets::data
