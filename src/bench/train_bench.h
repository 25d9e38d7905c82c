// `bench train`: training images/s per batch size, the step `train` runs on synthetic data or fed from files through the real loader, with where the time goes.
#pragma once

#include "bench/model_bench.h"
#include "distributed/grad_sync.h"
#include "distributed/group.h"
#include "io/safetensors.h"
#include "models/network.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace convnets::bench {

struct TrainBenchOptions;

// One training step as `bench train` times it: forward, loss, backward and the
// optimizer update, as `train` runs them. The training floor makes it
// (train/bench_step.h) and the caller hands it in, so that bench/ stands
// below train/ and includes none of it.
class TimedTrainStep {
 public:
  virtual ~TimedTrainStep() = default;
  // `input`: the normalised batch on the device; `labels` there too.
  virtual void run(const at::Tensor& input, const at::Tensor& labels) = 0;
  virtual bool graphed() const = 0;  // replayed as one CUDA graph
  // Which BatchNorm layers and blocks run fused (runtime::describe_fusion's account).
  virtual std::string fused_bn() const = 0;
  // What the step tuner chose at the first step, and its own seconds (runtime::tune_fusion): "" and 0 before.
  virtual std::string tuning() const = 0;
  virtual double tuning_seconds() const = 0;
  // The data-parallel all-reduce's figures; null without a group.
  virtual const distributed::ReducerStats* sync_stats() const = 0;
  // What `train` checkpoints of this step (the weights, the optimizer's state), live: `bench train --save-every`.
  virtual NamedTensors state() const = 0;
};
using TrainStepFactory =
    std::function<std::unique_ptr<TimedTrainStep>(NetworkImpl& model, const runtime::Runtime& rt,
                                                  const TrainBenchOptions& options)>;

struct TrainBenchOptions : ModelBenchOptions {
  TrainStepFactory train_step;  // required
  std::string fusion = "auto";  // --fusion (models/fusion.h): auto | none | bn | normconv
  std::string tuning_cache;     // --tuning-cache ("": the default file; none: no file)
  // After the timed iterations of the last batch size, this many more steps under LibTorch's profiler (Kineto: host
  // ops and GPU kernels), its Chrome trace written to `profile` (bench/profile_families.py reads it).
  std::string profile;
  int profile_steps = 5;
  // bench/save_bench.h instead of the rows: blocks of this many steps, each with one checkpoint saved
  // synchronously, one saved in the background, or none, `saves` of each kind, into `save_dir` ("": temporary).
  int save_every = 0;
  int saves = 3;
  std::string save_dir;
  // DLE's ResNet-50 recipe pieces, so the step does what training does.
  double label_smoothing = 0.1, momentum = 0.875, weight_decay = 3.0517578125e-05;
  // Data-parallel training: gradients all-reduced in buckets as `train` does.
  distributed::Group* group = nullptr;
  double bucket_mb = 25;
  // Training from files: for each backend, a row per batch size whose input
  // comes from `data` (synthetic: a device-resident random batch, no loader;
  // cpu: decoded by the loader threads; gpu: hybrid device decoding).
  std::string data;
  std::vector<std::string> data_backends{"synthetic"};
  int workers = 0;  // loader threads (0: one per CPU)
};

struct TrainBenchRow : BenchRow {
  bool cuda_graph = false;
  std::string fused_bn;     // TimedTrainStep::fused_bn
  std::string tuning;       // TimedTrainStep::tuning
  double tuning_s = 0;      // the tuner's time inside the first step
  double first_step_s = 0;  // the first step, synchronised (tuning, cuDNN's plans, the capture)
  // Data-parallel rows: images_per_s is this process's, total sums all processes.
  int processes = 1;
  double total_images_per_s = 0;
  std::int64_t buckets = 0;
  double allreduce_mb = 0;  // gradient bytes all-reduced per step
  double comm_wait_ms = 0;  // per step, waiting for all-reduces after backward (not hidden by overlap)
  // Rows that read files: where the time goes.
  std::string data_backend = "synthetic";
  int workers = 0;
  double read_ms = 0, decode_ms = 0, augment_ms = 0;  // loader CPU time per image (summed over its threads)
  double wait_ms = 0;          // per step: the training loop waiting for the next batch
  double input_ms = 0;         // per step: host time to enqueue the copy and the device-side decode or normalisation
  double device_ms = 0;        // per batch, synchronised: host-to-device copy + device decode/normalise alone
  double device_fraction = 0;  // images decoded on the device (gpu backend)
};

// The synthetic rows (one per batch size, out-of-memory probed), then each file backend's.
std::vector<TrainBenchRow> run_train_bench(const TrainBenchOptions& options);

// The DLE-README-style table, and the JSON record (with device and versions).
std::string format_table(const TrainBenchOptions& options, const std::vector<TrainBenchRow>& rows);
nlohmann::ordered_json to_json(const TrainBenchOptions& options, const std::vector<TrainBenchRow>& rows);

}  // namespace convnets::bench
