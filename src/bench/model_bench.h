// `bench train|infer`: images/s and per-batch latency of a model on synthetic data, per batch size, with out-of-memory probing.
#pragma once

#include "deploy/inference.h"
#include "distributed/grad_sync.h"
#include "distributed/group.h"
#include "io/safetensors.h"
#include "models/network.h"
#include "runtime/runtime.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace convnets::bench {

struct ModelBenchOptions;

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
                                                  const ModelBenchOptions& options)>;

struct ModelBenchOptions {
  std::string arch = "resnet50";
  bool train = true;  // false: inference
  TrainStepFactory train_step;  // needed when `train`
  runtime::Runtime runtime;
  std::vector<std::int64_t> batch_sizes{256};
  int image_size = 0;  // 0: the arch's own input size
  std::int64_t num_classes = 1000;
  int warmup = 10, iterations = 50;
  bool cuda_graph = true;  // training: whole-step capture; inference: a CUDA graph per batch size (deploy/graph_engine.h)
  std::vector<std::int64_t> graph_batch_sizes;  // inference on CUDA: declared graph sizes (empty: each on first use)
  double graph_memory_mb = 4096;
  bool fused_conv = true;  // inference on CUDA graphs with fold_bn: conv+bias+act as one cuDNN graph (--no-fused-conv)
  std::string fusion = "auto";  // training: --fusion (models/fusion.h): auto | none | bn | normconv
  std::string tuning_cache;     // training: --tuning-cache ("": the default file; none: no file)
  // Training: after the timed iterations of the last batch size, this many more steps under LibTorch's profiler
  // (Kineto: host ops and GPU kernels), its Chrome trace written to `profile` (bench/profile_families.py reads it).
  std::string profile;
  int profile_steps = 5;
  // Training: bench/save_bench.h instead of the rows: blocks of this many steps, each with one checkpoint saved
  // synchronously, one saved in the background, or none, `saves` of each kind, into `save_dir` ("": temporary).
  int save_every = 0;
  int saves = 3;
  std::string save_dir;
  bool fold_bn = false;    // inference: BatchNorm folded into the convs first (fold_batchnorm)
  // inference: the engines to time side by side, each resolved
  // (deploy::resolve_engine: torch, openvino); OpenVINO always folds BN.
  std::vector<std::string> engines{"torch"};
  // inference: time this checkpoint, weights file or exported ONNX (a QAT
  // checkpoint or an INT8 export as INT8) instead of random weights of
  // `arch`; `checkpoint_options` open it (the engine is set per row), and
  // arch, image_size and num_classes are its own (set_checkpoint).
  std::string checkpoint;
  deploy::InferenceOptions checkpoint_options;
  bool quantized = false;
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

struct BenchRow {
  std::int64_t batch = 0;
  std::string engine = "torch";
  bool fits = true;
  std::int64_t largest_fitting = 0;  // set when it does not fit (0: not even batch 1)
  bool cuda_graph = false;
  std::string fused_bn;  // training: TimedTrainStep::fused_bn
  std::string tuning;    // training: TimedTrainStep::tuning
  double tuning_s = 0;   // training: the tuner's time inside the first step
  double first_step_s = 0;  // training: the first step, synchronised (tuning, cuDNN's plans, the capture)
  double peak_memory_mb = 0;  // CUDA: the most the caching allocator held allocated during the row (warm-up included)
  // Inference on CUDA: the GPU's time per forward pass, CUDA events around it (the copy into the graph's input, the
  // replay, the logits' copy), as trtexec's "GPU Compute Time"; and which graphs the engine held.
  double gpu_mean_ms = 0, gpu_p50_ms = 0, gpu_p90_ms = 0, gpu_p99_ms = 0;
  std::string graphs;
  double images_per_s = 0;
  double mean_ms = 0, p50_ms = 0, p90_ms = 0, p95_ms = 0, p99_ms = 0;  // per iteration (a step, or a forward)
  // Data-parallel rows: images_per_s is this process's, total sums all processes.
  int processes = 1;
  double total_images_per_s = 0;
  std::int64_t buckets = 0;
  double allreduce_mb = 0;   // gradient bytes all-reduced per step
  double comm_wait_ms = 0;   // per step, waiting for all-reduces after backward (not hidden by overlap)
  // Rows that read files: where the time goes.
  std::string data_backend = "synthetic";
  int workers = 0;
  double read_ms = 0, decode_ms = 0, augment_ms = 0;  // loader CPU time per image (summed over its threads)
  double wait_ms = 0;     // per step: the training loop waiting for the next batch
  double input_ms = 0;    // per step: host time to enqueue the copy and the device-side decode or normalisation
  double device_ms = 0;   // per batch, synchronised: host-to-device copy + device decode/normalise alone
  double device_fraction = 0;  // images decoded on the device (gpu backend)
};

// Opens `path` once with `io` (engine: the first of `options.engines`) and
// takes its arch, input size, class count and whether it is INT8 into
// `options`; a file an engine cannot run fails here, naming it.
void set_checkpoint(ModelBenchOptions& options, const std::string& path, deploy::InferenceOptions io);

// True for an allocation failure of the CPU or CUDA allocator.
bool is_out_of_memory(const std::exception& e);

// Runs every batch size. One that does not fit yields fits = false and the
// largest batch that does (bisection between the last that fitted and it).
std::vector<BenchRow> run_model_bench(const ModelBenchOptions& options);

// The DLE-README-style table and the JSON record (with device and versions).
std::string format_table(const ModelBenchOptions& options, const std::vector<BenchRow>& rows);
nlohmann::ordered_json to_json(const ModelBenchOptions& options, const std::vector<BenchRow>& rows);

}  // namespace convnets::bench
