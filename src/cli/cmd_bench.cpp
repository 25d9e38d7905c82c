// `convnets bench data|train|infer`: input-pipeline throughput on a dataset; model training and inference speed on synthetic data.
#include "bench/checkpoint_bench.h"
#include "bench/data_bench.h"
#include "bench/save_bench.h"
#include "bench/scaling.h"
#include "core/stats.h"
#include "bench/infer_bench.h"
#include "bench/train_bench.h"
#include "cli/commands.h"
#include "cli/launch.h"
#include "core/error.h"
#include "core/json.h"
#include "core/options.h"
#include "data/pipeline.h"
#include "deploy/engine.h"
#include "distributed/env.h"
#include "distributed/group.h"
#include "distributed/launcher.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "models/fusion.h"
#include "models/registry.h"
#include "train/bench_step.h"

#include <CLI/CLI.hpp>
#include <torch/cuda.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>

namespace convnets::cli {
namespace {

struct BenchModelArgs {
  bool is_train = true;
  bench::TrainBenchOptions train;
  bench::InferBenchOptions infer;
  std::string device = "auto", precision = "fp32", memory_format = "nhwc", json;
  std::vector<std::string> engines{"auto"};
  std::string checkpoint;
  bool as_float = false, arch_given = false;
  bool no_cuda_graph = false;
  bool infer_graphs = true;  // bench infer's --no-cuda-graph (add_graph_options)
  distributed::LaunchOptions launch;

  bench::ModelBenchOptions& common() { return is_train ? static_cast<bench::ModelBenchOptions&>(train) : infer; }
};

// `bench train --nproc-per-node N`: the lone process and the N together (bench/scaling.h), printed and written.
void run_scaling(BenchModelArgs& a, const distributed::WorkerEnv& plan) {
  const auto report = bench::run_scaling(plan, a.launch.timeout_s + 15);
  std::cout << report.table << std::flush;
  if (!a.json.empty()) write_file_atomically(a.json, dump_json(report.record, 2) + "\n");
}

// bench train --save-every: the three kinds of block side by side, and the JSON of every block.
void run_save_bench(const BenchModelArgs& a) {
  const auto r = bench::bench_saves(a.train);
  std::cout << bench::format_save_bench(a.train, r) << std::flush;
  if (!a.json.empty()) write_file_atomically(a.json, dump_json(bench::to_json(a.train, r), 2) + "\n");
}

// The rows printed (or, in a worker of the scaling launcher, written where it reads them) and written as --json; a
// batch that did not fit fails the command after its row is shown.
template <typename Options, typename Row>
void report_rows(const BenchModelArgs& a, const Options& o, const std::vector<Row>& rows, const std::string& what) {
  if (const char* out = std::getenv(bench::kBenchOut)) {
    write_file_atomically(out, dump_json(bench::to_json(o, rows), 2) + "\n");
    return;
  }
  std::cout << bench::format_table(o, rows) << std::flush;
  if (!a.json.empty()) {
    auto j = bench::to_json(o, rows);
    // The figures' provenance: bench/compare.py copies it into the run's summary.json.
    std::string command;
    for (const auto& arg : distributed::program_args()) {
      command += command.empty() ? std::string("convnets") : " " + arg;  // not the binary's path on this machine
    }
    j["command"] = command;
    write_file_atomically(a.json, dump_json(j, 2) + "\n");
  }
  for (const auto& r : rows) {
    if (r.fits) continue;
    throw Error("--batch-sizes " + std::to_string(r.batch) + ": out of memory on " + o.runtime.device.str() + " (" +
                    o.arch + ", " + o.runtime.precision + ", " + what +
                    "); the largest batch that fits is " + std::to_string(r.largest_fitting),
                r.largest_fitting > 0 ? "use --batch-sizes " + std::to_string(r.largest_fitting) + " or less"
                                      : "not even one image fits: use a smaller --image-size or model");
  }
}

void run_bench_train(BenchModelArgs& a) {
  auto& o = a.train;
  const auto role = distributed::resolve(a.launch);
  if (role.role == distributed::Role::Launcher) return run_scaling(a, role.worker);
  const distributed::WorkerEnv* worker = role.role == distributed::Role::Worker ? &role.worker : nullptr;
  if (o.save_every > 0 && worker) throw Error("--save-every: times one process; leave out --nproc-per-node");
  o.runtime = runtime::resolve_runtime(a.device, a.precision, a.memory_format, worker ? worker->local_rank : 0);
  o.cuda_graph = !a.no_cuda_graph;
  if (o.save_every > 0) return run_save_bench(a);
  (void)models::parse_fusion_mode(o.fusion);
  std::unique_ptr<distributed::Group> group;
  if (worker && (worker->world_size > 1 || std::getenv(bench::kBenchGroup))) {
    group = std::make_unique<distributed::Group>(*worker, o.runtime.device, "auto");
    o.group = group.get();
  }
  const auto rows = bench::run_train_bench(o);
  if (group && group->rank() != 0) return;
  report_rows(a, o, rows, "training");
}

void run_bench_infer(BenchModelArgs& a) {
  auto& o = a.infer;
  o.runtime = runtime::resolve_runtime(a.device, a.precision, a.memory_format, 0);
  if (a.engines.empty()) throw Error("--engine: expected at least one of auto, torch, openvino");
  o.engines.clear();
  for (const auto& e : a.engines) o.engines.push_back(deploy::resolve_engine(e, o.runtime));
  if (!a.checkpoint.empty()) {
    deploy::InferenceOptions io;
    io.device = a.device, io.precision = a.precision, io.memory_format = a.memory_format;
    io.fold_bn = o.fold_bn;
    io.cuda_graph = a.infer_graphs, io.graph_batch_sizes = o.graph_batch_sizes, io.graph_memory_mb = o.graph_memory_mb;
    io.fused_conv = o.fused_conv;
    io.as_float = a.as_float;
    if (a.arch_given) io.arch = o.arch;  // a training checkpoint names its own
    io.num_classes = o.num_classes;       // a plain weights file's classifier
    bench::set_checkpoint(o, a.checkpoint, io);
  }
  o.cuda_graph = a.infer_graphs;
  report_rows(a, o, bench::run_infer_bench(o), "inference");
}

struct BenchCheckpointArgs {
  bench::CheckpointBenchOptions options;
  std::string json;
};

void run_bench_checkpoint(const BenchCheckpointArgs& a) {
  const auto r = bench::bench_checkpoint(a.options);
  std::cout << bench::format_checkpoint_bench(a.options, r) << std::flush;
  if (!a.json.empty()) write_file_atomically(a.json, dump_json(bench::to_json(a.options, r), 2) + "\n");
}

void add_bench_checkpoint(CLI::App& bench) {
  auto args = std::make_shared<BenchCheckpointArgs>();
  auto* cmd = bench.add_subcommand(
      "checkpoint", "Milliseconds to save and to load a training checkpoint of an arch, with its checksums and without");
  auto& o = args->options;
  cmd->add_option("--arch", o.arch, "Architecture (see `convnets models`)")->capture_default_str();
  cmd->add_option("--num-classes", o.num_classes, "Classifier outputs")->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  cmd->add_flag("!--no-ema", o.ema, "Without the EMA weights (a run without --ema)");
  cmd->add_option("--iterations", o.iterations, "Rounds timed (each saves and loads both files), after one untimed")
      ->capture_default_str()->check(CLI::Range(1, 1000));
  cmd->add_option("--dir", o.folder, "Folder to write the files in (default: the system's temporary folder)");
  cmd->add_flag("--cold", o.cold,
                "Load each file from the disk: its pages dropped from the page cache first (posix_fadvise)");
  cmd->add_option("--json", args->json, "Also write the results as JSON to this file");
  cmd->callback([args] { run_bench_checkpoint(*args); });
}

void add_model_bench(CLI::App& bench, bool train) {
  auto args = std::make_shared<BenchModelArgs>();
  args->is_train = train;
  args->train.train_step = train::make_bench_step;  // the training floor's step, handed down
  auto* cmd = bench.add_subcommand(
      train ? "train" : "infer",
      train ? "Training images/s on synthetic data (forward, backward, loss scaling, SGD) per batch size"
            : "Inference images/s and latency avg/p90/p95/p99 on synthetic data per batch size");
  auto& o = args->common();
  if (!train) o.batch_sizes = {1, 64, 256};
  auto* arch = cmd->add_option("--arch", o.arch, "Architecture (see `convnets models`)")->capture_default_str();
  arch->each([args](const std::string&) { args->arch_given = true; });
  cmd->add_option("--precision", args->precision, "fp32, tf32, amp (fp16 autocast + loss scaling) or bf16")
      ->check(CLI::IsMember(options::precision.values))
      ->capture_default_str();
  cmd->add_option("--device", args->device, "auto (CUDA when present), cuda or cpu")
      ->check(CLI::IsMember(options::device.values))
      ->capture_default_str();
  cmd->add_option("--memory-format", args->memory_format, "nhwc (channels-last) or nchw")
      ->check(CLI::IsMember(options::memory_format.values))
      ->capture_default_str();
  cmd->add_option("--batch-sizes", o.batch_sizes, "Comma-separated batch sizes")->delimiter(',')->capture_default_str();
  cmd->add_option("--image-size", o.image_size, "Input side in pixels (default: the arch's)")->check(CLI::Range(8, 4096));
  cmd->add_option("--num-classes", o.num_classes, "Classifier outputs")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "Untimed iterations first (cuDNN autotuning, graph capture)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  cmd->add_option("--iterations", o.iterations, "Timed iterations per batch size")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  if (train) {
    auto& t = args->train;
    cmd->add_flag("--no-cuda-graph", args->no_cuda_graph, "Run the step eagerly instead of replaying a CUDA graph");
    cmd->add_option("--fusion", t.fusion,
                    "auto (each residual block's verified paths timed at the first step, the fastest kept and cached) "
                    "| none | bn | normconv, as train's --fusion")
        ->capture_default_str();
    cmd->add_option("--tuning-cache", t.tuning_cache,
                    "--fusion auto's cache of timed choices (default: $XDG_CACHE_HOME/convnets/tuning.json; none: no "
                    "file), as train's");
    cmd->add_flag_callback("--no-fused-bn", [&t] { t.fusion = "none"; }, "--fusion none");
    cmd->add_flag_callback("--norm-conv", [&t] { t.fusion = "normconv"; }, "--fusion normconv");
    cmd->add_flag_callback("--no-norm-conv", [&t] { t.fusion = "bn"; }, "--fusion bn");
    cmd->add_option("--profile", t.profile,
                    "After timing the last batch size, profile more steps (Kineto: host ops, GPU kernels) into this "
                    "Chrome trace file (bench/profile_families.py sums its kernels by family)");
    cmd->add_option("--profile-steps", t.profile_steps, "Steps under the profiler with --profile")
        ->check(CLI::Range(1, 1000))
        ->capture_default_str();
    cmd->add_option("--bucket-mb", t.bucket_mb, "Data-parallel: gradient all-reduce bucket size in MiB")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    cmd->add_option("--data", t.data,
                    "Also train from this image folder or list file (its train split) through the real loader");
    cmd->add_option("--data-backend", t.data_backends,
                    "Comma-separated: synthetic (device-resident random batch), cpu (loader threads decode), "
                    "gpu (entropy decoding on the loader threads, the rest on the GPU)")
        ->delimiter(',')
        ->capture_default_str();
    cmd->add_option("--workers", t.workers, "Loader threads for --data (0: one per CPU)")->check(CLI::Range(0, 1024));
    cmd->add_option("--save-every", t.save_every,
                    "Instead of the rows: what a checkpoint costs the steps around it, in blocks of this many steps "
                    "with a save after the first, synchronous (as at an epoch's end) or in the background "
                    "(train's --checkpoint-interval), against blocks without one")
        ->check(CLI::Range(1, 100000));
    cmd->add_option("--saves", t.saves, "--save-every: blocks of each kind")->check(CLI::Range(1, 1000))->capture_default_str();
    cmd->add_option("--save-dir", t.save_dir, "--save-every: folder of the checkpoint (default: the system's temporary one)");
    add_launch_flags(cmd, args->launch);
  } else {
    auto& in = args->infer;
    add_fold_bn_option(cmd, in.fold_bn, "before timing: ");
    cmd->add_option("--engine", args->engines,
                    std::string("Comma-separated engines, timed side by side: ") + deploy::kEngineHelp)
        ->delimiter(',')
        ->check(CLI::IsMember(options::engine.values))
        ->capture_default_str();
    cmd->add_option("--checkpoint", args->checkpoint,
                    "Time this checkpoint, weights file (with --arch) or exported .onnx instead of random weights; "
                    "a QAT checkpoint or an INT8 export runs as INT8 (OpenVINO: INT8 kernels)");
    cmd->add_flag("--float", args->as_float, "A QAT checkpoint: time its float weights instead of the INT8 network");
    add_graph_options(cmd, args->infer_graphs, in.graph_batch_sizes, in.graph_memory_mb, in.fused_conv);
  }
  cmd->add_option("--json", args->json, "Also write the results as JSON to this file");
  cmd->callback([args] { args->is_train ? run_bench_train(*args) : run_bench_infer(*args); });
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks: input pipeline, training and inference speed");
  bench->require_subcommand(1);
  struct DataArgs {
    bench::DataBenchOptions o;
    bool train = false, json = false;
  };
  auto args = std::make_shared<DataArgs>();
  auto* cmd = bench->add_subcommand("data", "Images/s of read + decode + transform + batching on a dataset");
  cmd->add_option("location", args->o.location,
                  "Image folder (DIR/<class>/..., or DIR with train/ and val/), list file, IDX folder, or synthetic[:N]")
      ->required();
  cmd->add_option("--workers", args->o.workers, "Decoding threads (default: one per CPU)")->check(CLI::Range(0, 1024));
  cmd->add_option("--image-size,--size", args->o.size, "Output side in pixels (default 224)")->check(CLI::Range(1, 8192));
  auto* train = cmd->add_flag("--train", args->train, "RandomResizedCrop + flip (the default)");
  auto* eval = cmd->add_flag("--eval", args->o.eval, "Resize to size/0.875 + centre crop");
  train->excludes(eval);
  cmd->add_option("--batch-size", args->o.batch_size, "Images per batch (default 64)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--images", args->o.images, "Images to time after warm-up (default 2000)")->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--prefetch", args->o.prefetch, "Batches prepared ahead per worker (default 2)")->check(CLI::Range(1, 64));
  cmd->add_option("--dct-scaling", args->o.dct_scaling, "JPEG DCT-domain downscaling: auto (train on, eval off), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_option("--bad-images", args->o.bad_images, "skip (replace and report) or fail (stop at the first)")
      ->check(CLI::IsMember(options::bad_images.values));
  cmd->add_option("--max-image-pixels", args->o.max_image_pixels, codec::kMaxImagePixelsHelp)->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", args->o.seed, "Shuffle and augmentation seed (default 0)");
  cmd->add_option("--data-backend", args->o.backend,
                  "cpu (threads decode fully) or gpu (threads entropy-decode; the rest runs on the GPU when present)")
      ->check(CLI::IsMember({"cpu", "gpu"}));
  cmd->add_option("--augment", args->o.augment, "Train: augmentation policy (autoaugment, or timm's rand-m9-mstd0.5 ...)");
  cmd->add_option("--interpolation,--train-interpolation", args->o.interpolation,
                  "bilinear | bicubic | random (train only: timm's, either per image)")
      ->check(CLI::IsMember(options::train_interpolation.values));
  cmd->add_flag("--drop-last", args->o.drop_last,
                "Drop each epoch's final partial batch (train: ranks then get whole batches in turn, as `train`)");
  cmd->add_option("--rank", args->o.rank, "The shard of this rank (default 0)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--world-size", args->o.world_size, "Ranks the data is split over (default 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--save-batches", args->o.save_batches,
                  "Write every batch loaded (uint8 images, labels, erasing boxes) to this safetensors file, keyed "
                  "images.EPOCH.BATCH");
  cmd->add_option("--reprob", args->o.reprob, "Train: random erasing probability (draws the boxes)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--crop-padding", args->o.crop_padding,
                  "Train: then torchvision's RandomCrop(size, padding=N): shifts of up to N px, zero fill")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->callback([args] {
    const auto record = bench::run_data_bench(args->o, [&](const std::string& line) {
      if (!args->json) std::cout << line << '\n';
    });
    std::cout << (args->json ? dump_json(record, 2) + "\n" : bench::format_data_bench(record)) << std::flush;
  });
  add_model_bench(*bench, true);
  add_model_bench(*bench, false);
  add_bench_serve(*bench);
  add_bench_checkpoint(*bench);
}

}  // namespace convnets::cli
