// `convnets bench data|train|infer`: input-pipeline throughput on a dataset; model training and inference speed on synthetic data.
#include "bench/checkpoint_bench.h"
#include "bench/save_bench.h"
#include "core/stats.h"
#include "bench/model_bench.h"
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

struct BenchDataArgs {
  std::string location;
  int workers = 0;
  int size = 224;
  bool train = false, eval = false;
  std::int64_t batch_size = 64;
  std::int64_t images = 2000;
  int prefetch = 2;
  std::string dct_scaling = "auto";
  std::string bad_images = "skip";
  std::int64_t max_image_pixels = codec::kDefaultMaxImagePixels;
  std::uint64_t seed = 0;
  std::string backend = "cpu";
  std::string augment, interpolation = "bilinear";
  double reprob = 0;
  int crop_padding = 0;
  bool drop_last = false;
  int rank = 0, world_size = 1;
  std::string save_batches;
  bool json = false;
};

void run_bench_data(const BenchDataArgs& a) {
  using Clock = std::chrono::steady_clock;
  const bool train = !a.eval;
  data::PipelineOptions o;
  o.train = train;
  o.image_size = a.size;
  o.batch_size = a.batch_size;
  o.workers = a.workers;
  o.prefetch = a.prefetch;
  o.seed = a.seed;
  o.drop_last = a.drop_last;  // default off: every image counts once per pass
  o.rank = a.rank;
  o.world_size = a.world_size;
  if (a.dct_scaling != "auto") o.dct_scaling = a.dct_scaling == "on";
  o.max_image_pixels = a.max_image_pixels;
  o.bad_images = a.bad_images;
  o.interpolation = a.interpolation;
  o.augment = a.augment;  // with the ImageNet mean as its fill, as timm's default
  o.reprob = a.reprob;    // boxes drawn on the loader threads; the fill runs on the training device
  o.crop_padding = a.crop_padding;
  // gpu: the loader threads only entropy-decode; the device stage runs here
  // on CUDA when there is one (else the figures are the CPU side alone).
  o.device_decode = a.backend == "gpu";
  const bool device_stage = o.device_decode && torch::cuda::is_available();
  const data::TransformOptions t = data::transform_options(o);  // the options' errors before the files'
  auto dataset = data::open_dataset(a.location, train ? "train" : "val");
  const auto loader_ptr = data::make_loader(dataset, o);
  data::Loader& loader = *loader_ptr;
  // --save-batches: what the loader yielded, to compare with another loader
  // (the Python package's) batch for batch.
  NamedTensors saved;

  if (!a.json) {
    std::printf("dataset     %s\n", dataset->description().c_str());
    if (a.world_size > 1)
      std::printf("rank        %d of %d: %lld samples per epoch\n", a.rank, a.world_size,
                  static_cast<long long>(loader.samples_per_epoch()));
    std::printf("transform   %s %d (%s), DCT scaling %s; %d workers, batch %lld\n",
                !train ? "resize + centre crop"
                : a.crop_padding > 0 ? ("RandomResizedCrop + RandomCrop(padding=" + std::to_string(a.crop_padding) +
                                        ") + flip").c_str()
                                     : "RandomResizedCrop + flip",
                a.size,
                train ? a.interpolation.c_str() : data::filter_name(t.filter), t.dct_scaling ? "on" : "off",
                loader.workers(), static_cast<long long>(a.batch_size));
    if (!a.augment.empty() || a.reprob > 0)
      std::printf("augment     %s; random erasing p %g (boxes here, fill on the device)\n",
                  a.augment.empty() ? "none" : a.augment.c_str(), a.reprob);
    if (o.device_decode)
      std::printf("backend     gpu: loader threads entropy-decode; %s\n",
                  device_stage ? "IDCT, colour, resize on cuda:0"
                               : "no CUDA device, so only that CPU side is measured (decode = entropy decoding)");
  }
  // The first batch per worker fills the pipeline and the page cache: not timed.
  const std::int64_t warmup = std::min<std::int64_t>(loader.workers(), loader.batches_per_epoch());
  std::int64_t seen_batches = 0, timed_images = 0;
  data::EpochStats sum;
  Clock::time_point t0 = Clock::now();
  data::Batch batch;
  for (std::int64_t epoch = 0; timed_images < a.images; ++epoch) {
    loader.start_epoch(epoch);
    while (loader.next(batch)) {
      if (device_stage) data::decode_on_device(*batch.encoded, at::Device(at::kCUDA, 0), at::kHalf);
      if (!a.save_batches.empty() && batch.images.defined()) {
        const std::string key = std::to_string(epoch) + "." + std::to_string(batch.number);
        saved.emplace_back("images." + key, batch.images);
        saved.emplace_back("labels." + key, batch.labels);
        if (batch.erase.defined()) saved.emplace_back("erase." + key, batch.erase);
      }
      if (++seen_batches == warmup) t0 = Clock::now();
      else if (seen_batches > warmup) timed_images += batch.labels.size(0);
      if (timed_images >= a.images) break;
    }
    const data::EpochStats s = loader.stats();
    sum += s;
    if (s.bad_images > 0 && !a.json)
      std::printf("epoch %lld: %lld bad images replaced (%zu distinct files so far)\n", static_cast<long long>(epoch),
                  static_cast<long long>(s.bad_images), loader.bad_files().size());
  }
  if (device_stage) torch::cuda::synchronize();
  if (!a.save_batches.empty()) {
    if (saved.empty()) throw Error("--save-batches saves decoded pixels: leave out --data-backend gpu");
    save_safetensors(a.save_batches, saved, {{"format", "convnets-batches/1"}});
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const double rate = timed_images / seconds;
  const std::int64_t total_images = sum.images, bad = sum.bad_images;
  const double per = 1e3 / static_cast<double>(total_images);
  nlohmann::ordered_json r = {{"dataset", dataset->description()},
                              {"mode", train ? "train" : "eval"},
                              {"rank", a.rank},
                              {"world_size", a.world_size},
                              {"samples_per_epoch", loader.samples_per_epoch()},
                              {"size", a.size},
                              {"dct_scaling", t.dct_scaling},
                              {"workers", loader.workers()},
                              {"batch_size", a.batch_size},
                              {"timed_images", timed_images},
                              {"seconds", seconds},
                              {"images_per_s", rate},
                              {"images_per_s_per_worker", rate / loader.workers()},
                              {"read_ms", sum.read_s * per},
                              {"decode_ms", sum.decode_s * per},
                              {"transform_ms", sum.transform_s * per},
                              {"bad_images", bad},
                              {"backend", a.backend},
                              {"device_stage", device_stage},
                              {"device_decoded_fraction", total_images > 0 ? double(sum.device_images) / double(total_images) : 0.0}};
  if (a.json) {
    std::cout << dump_json(r, 2) << '\n';
    return;
  }
  std::printf("images/s    %.1f  (%.1f per worker, %lld images in %.2f s)\n", rate, rate / loader.workers(),
              static_cast<long long>(timed_images), seconds);
  std::printf("per image   read %.3f ms, decode %.3f ms, transform %.3f ms (mean over %lld)\n",
              r["read_ms"].get<double>(), r["decode_ms"].get<double>(), r["transform_ms"].get<double>(),
              static_cast<long long>(total_images));
  std::printf("bad images  %lld\n", static_cast<long long>(bad));
}

struct BenchModelArgs {
  bench::ModelBenchOptions options;
  std::string device = "auto", precision = "fp32", memory_format = "nhwc", json;
  std::vector<std::string> engines{"auto"};
  std::string checkpoint;
  bool as_float = false, arch_given = false;
  bool no_cuda_graph = false;
  bool infer_graphs = true;  // bench infer's --no-cuda-graph (add_graph_options)
  distributed::LaunchOptions launch;
};

// Where a bench worker started by the scaling launcher leaves its JSON.
constexpr const char* kBenchOut = "CONVNETS_BENCH_OUT";
// Set for the data-parallel leg: its workers form a process group even when there is one of them, so that
// `--nproc-per-node 1` measures the gradient all-reduce on NCCL against the lone process (as DDP on one GPU does)
// rather than running the lone process twice. The GPU machine's first run showed 0 buckets there.
constexpr const char* kBenchGroup = "CONVNETS_BENCH_GROUP";

nlohmann::json read_json(const std::string& path) {
  if (!std::ifstream(path)) throw Error("bench: the workers left no results in " + path);
  return read_json_file(path, "bench worker results");
}

// `bench train --nproc-per-node N`: one process alone, then N together, on
// the same synthetic step; scaling efficiency = total / (N x one alone).
void run_scaling(BenchModelArgs& a, const distributed::WorkerEnv& plan) {
  if (plan.world_size != plan.local_world_size) {
    throw Error("bench train measures one machine: leave out --nnodes", "run `convnets train` across machines");
  }
  char pattern[] = "/tmp/convnets-bench-XXXXXX";
  if (!::mkdtemp(pattern)) throw SystemError("bench: cannot create a folder", pattern);
  const std::string dir = pattern;
  const std::string one = dir + "/one.json", many = dir + "/many.json";
  const double grace = a.launch.timeout_s + 15;
  distributed::WorkerEnv single = plan;
  single.local_world_size = single.world_size = 1;
  // The lone process gets one worker's share of the CPU threads (as each GPU
  // process has its own GPU), so the efficiency measures what communication costs.
  std::vector<std::pair<std::string, std::string>> env{{kBenchOut, one}};
  if (!std::getenv("OMP_NUM_THREADS")) {
    const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
    env.emplace_back("OMP_NUM_THREADS", std::to_string(std::max(1u, cpus / static_cast<unsigned>(plan.world_size))));
  }
  int rc = distributed::launch_workers(single, distributed::program_args(), grace, env);
  if (rc == 0) {
    rc = distributed::launch_workers(plan, distributed::program_args(), grace, {{kBenchOut, many}, {kBenchGroup, "1"}});
  }
  if (rc != 0) {
    std::filesystem::remove_all(dir);
    throw Error("bench train: a worker failed (exit code " + std::to_string(rc) + "); its error is above");
  }
  auto j1 = read_json(one), jn = read_json(many);
  std::filesystem::remove_all(dir);
  const int n = plan.world_size;
  std::cout << "convnets bench train: " << jn["arch"].get<std::string>() << ", " << jn["precision"].get<std::string>()
            << ", " << jn["image_size"] << "px, " << jn["device"].get<std::string>() << ", " << n
            << (n == 1 ? " process" : " processes") << " (data-parallel) vs 1, LibTorch " << jn["torch_version"].get<std::string>() << "\n\n"
            << "| Batch/process | img/s per process | Total img/s | 1 process img/s | Scaling efficiency | "
               "All-reduce/step (MiB) | Buckets | Exposed comm (ms/step) |\n"
            << "|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (std::size_t i = 0; i < jn["rows"].size(); ++i) {
    auto& r = jn["rows"][i];
    const auto& s = j1["rows"][i];
    if (!r.value("fits", false) || !s.value("fits", false)) {
      std::cout << "| " << r["batch"] << " | out of memory |\n";
      continue;
    }
    const double base = s["images_per_s"].get<double>(), total = r["total_images_per_s"].get<double>();
    r["single_process_images_per_s"] = base;
    r["scaling_efficiency"] = total / (n * base);
    char line[256];
    std::snprintf(line, sizeof line, "| %lld | %.1f | %.1f | %.1f | %.1f%% | %.1f | %lld | %.2f |\n",
                  r["batch"].get<long long>(), r["images_per_s"].get<double>(), total, base,
                  100.0 * total / (n * base), r.value("allreduce_mb", 0.0), r.value("buckets", 0LL),
                  r.value("comm_wait_ms", 0.0));
    std::cout << line;
  }
  std::cout << std::flush;
  if (!a.json.empty()) write_file_atomically(a.json, dump_json(jn, 2) + "\n");
}

// bench train --save-every: the three kinds of block side by side, and the JSON of every block.
void run_save_bench(const BenchModelArgs& a) {
  const auto& o = a.options;
  if (o.batch_sizes.size() != 1) throw Error("--save-every: give one --batch-sizes value, not " +
                                             std::to_string(o.batch_sizes.size()));
  if (!o.data.empty()) throw Error("--save-every: times synthetic steps; leave --data out");
  const auto r = bench::bench_saves(o);
  std::printf("%s at %d px, batch %lld, %s %s: a checkpoint of %lld tensors, %.1f MB (weights, SGD momentum), saved "
              "after the first step of each block of %d steps; %d blocks of each kind, in turn\n",
              o.arch.c_str(), r.image_size, static_cast<long long>(r.batch), o.runtime.device.str().c_str(),
              o.runtime.precision.c_str(), static_cast<long long>(r.tensors), r.file_bytes / 1e6, o.save_every,
              o.saves);
  std::printf("| Save | Block (ms, median) | Over the block without a save (ms) | The save's step (ms, median) | "
              "Other steps (ms, median) | Waited at the block's end (ms, median) |\n|---|---:|---:|---:|---:|---:|\n");
  const double plain = median(r.kinds.front().block_ms);
  for (const auto& k : r.kinds) {
    const auto cell = [](const std::vector<double>& v) {
      char text[32];
      std::snprintf(text, sizeof text, "%.1f", median(v));
      return v.empty() ? std::string("-") : std::string(text);
    };
    std::printf("| %s | %.1f | %+.1f | %s | %s | %s |\n", k.kind.c_str(), median(k.block_ms),
                median(k.block_ms) - plain, cell(k.save_step_ms).c_str(), cell(k.other_ms).c_str(),
                cell(k.waited_ms).c_str());
  }
  std::printf("the last background write took %.1f ms from its start to its rename\n", r.write_s * 1e3);
  if (a.json.empty()) return;
  nlohmann::ordered_json j = {{"tool", "convnets"}, {"mode", "train-save-every"}, {"arch", o.arch},
                              {"device", o.runtime.device.str()}, {"precision", o.runtime.precision},
                              {"batch", r.batch}, {"image_size", r.image_size}, {"save_every", o.save_every},
                              {"saves", o.saves}, {"tensors", r.tensors}, {"file_bytes", r.file_bytes},
                              {"background_write_ms", r.write_s * 1e3}};
  for (const auto& k : r.kinds) {
    j["kinds"][k.kind] = {{"block_ms", k.block_ms}, {"save_step_ms", k.save_step_ms}, {"other_ms", k.other_ms},
                          {"waited_ms", k.waited_ms}};
  }
  write_file_atomically(a.json, dump_json(j, 2) + "\n");
}

void run_bench_model(BenchModelArgs& a) {
  auto& o = a.options;
  const auto role = o.train ? distributed::resolve(a.launch) : distributed::Resolved{};
  if (role.role == distributed::Role::Launcher) return run_scaling(a, role.worker);
  const distributed::WorkerEnv* worker = role.role == distributed::Role::Worker ? &role.worker : nullptr;
  if (o.save_every > 0 && worker) throw Error("--save-every: times one process; leave out --nproc-per-node");
  o.runtime = runtime::resolve_runtime(a.device, a.precision, a.memory_format, worker ? worker->local_rank : 0);
  if (o.save_every > 0) {
    o.cuda_graph = !a.no_cuda_graph;
    return run_save_bench(a);
  }
  if (!o.train) {
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
  }
  o.cuda_graph = o.train ? !a.no_cuda_graph : a.infer_graphs;
  (void)layers::parse_fusion_mode(o.fusion);
  std::unique_ptr<distributed::Group> group;
  if (worker && (worker->world_size > 1 || std::getenv(kBenchGroup))) {
    group = std::make_unique<distributed::Group>(*worker, o.runtime.device, "auto");
    o.group = group.get();
  }
  const auto rows = bench::run_model_bench(o);
  if (group && group->rank() != 0) return;
  if (const char* out = std::getenv(kBenchOut)) {
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
                    o.arch + ", " + o.runtime.precision + ", " + (o.train ? "training" : "inference") +
                    "); the largest batch that fits is " + std::to_string(r.largest_fitting),
                r.largest_fitting > 0 ? "use --batch-sizes " + std::to_string(r.largest_fitting) + " or less"
                                      : "not even one image fits: use a smaller --image-size or model");
  }
}

struct BenchCheckpointArgs {
  bench::CheckpointBenchOptions options;
  std::string json;
};

void run_bench_checkpoint(const BenchCheckpointArgs& a) {
  const auto& o = a.options;
  const auto r = bench::bench_checkpoint(o);
  const double mb = r.file_bytes / 1e6, save = median(r.save_ms), save_plain = median(r.save_plain_ms),
               load = median(r.load_ms), load_plain = median(r.load_plain_ms), sum = median(r.checksum_ms);
  std::printf("%s checkpoint (weights%s, SGD momentum): %lld tensors, %.1f MB, in %s, loaded from %s\n",
              o.arch.c_str(), o.ema ? ", EMA" : "", static_cast<long long>(r.tensors), mb,
              o.folder.empty() ? std::filesystem::temp_directory_path().c_str() : o.folder.c_str(),
              o.cold ? "the disk" : "the page cache");
  std::printf("| Round | Save (ms) | Save, no checksums | Load (ms) | Load, no checksums | One CRC-32C pass |\n"
              "|---:|---:|---:|---:|---:|---:|\n");
  for (std::size_t i = 0; i < r.save_ms.size(); ++i) {
    std::printf("| %zu | %.1f | %.1f | %.1f | %.1f | %.1f |\n", i + 1, r.save_ms[i], r.save_plain_ms[i], r.load_ms[i],
                r.load_plain_ms[i], r.checksum_ms[i]);
  }
  std::printf("medians: save %.1f ms against %.1f (%+.1f %%), load %.1f ms against %.1f (%+.1f %%); one CRC-32C pass "
              "%.1f ms (%.1f GB/s)\n",
              save, save_plain, 100 * (save / save_plain - 1), load, load_plain, 100 * (load / load_plain - 1), sum,
              mb / sum);
  if (!a.json.empty()) {
    const nlohmann::ordered_json j = {{"tool", "convnets"},          {"mode", "checkpoint"},
                                      {"arch", o.arch},              {"num_classes", o.num_classes},
                                      {"ema", o.ema},                {"cold", o.cold},
                                      {"tensors", r.tensors},
                                      {"file_bytes", r.file_bytes},  {"save_ms", r.save_ms},
                                      {"save_plain_ms", r.save_plain_ms}, {"load_ms", r.load_ms},
                                      {"load_plain_ms", r.load_plain_ms}, {"checksum_ms", r.checksum_ms}};
    write_file_atomically(a.json, dump_json(j, 2) + "\n");
  }
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
  args->options.train = train;
  args->options.train_step = train::make_bench_step;  // the training floor's step, handed down
  auto* cmd = bench.add_subcommand(
      train ? "train" : "infer",
      train ? "Training images/s on synthetic data (forward, backward, loss scaling, SGD) per batch size"
            : "Inference images/s and latency avg/p90/p95/p99 on synthetic data per batch size");
  auto& o = args->options;
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
    cmd->add_flag("--no-cuda-graph", args->no_cuda_graph, "Run the step eagerly instead of replaying a CUDA graph");
    cmd->add_option("--fusion", o.fusion,
                    "auto (each residual block's verified paths timed at the first step, the fastest kept and cached) "
                    "| none | bn | normconv, as train's --fusion")
        ->capture_default_str();
    cmd->add_option("--tuning-cache", o.tuning_cache,
                    "--fusion auto's cache of timed choices (default: $XDG_CACHE_HOME/convnets/tuning.json; none: no "
                    "file), as train's");
    cmd->add_flag_callback("--no-fused-bn", [&o] { o.fusion = "none"; }, "--fusion none");
    cmd->add_flag_callback("--norm-conv", [&o] { o.fusion = "normconv"; }, "--fusion normconv");
    cmd->add_flag_callback("--no-norm-conv", [&o] { o.fusion = "bn"; }, "--fusion bn");
    cmd->add_option("--profile", o.profile,
                    "After timing the last batch size, profile more steps (Kineto: host ops, GPU kernels) into this "
                    "Chrome trace file (bench/profile_families.py sums its kernels by family)");
    cmd->add_option("--profile-steps", o.profile_steps, "Steps under the profiler with --profile")
        ->check(CLI::Range(1, 1000))
        ->capture_default_str();
    cmd->add_option("--bucket-mb", o.bucket_mb, "Data-parallel: gradient all-reduce bucket size in MiB")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    cmd->add_option("--data", o.data,
                    "Also train from this image folder or list file (its train split) through the real loader");
    cmd->add_option("--data-backend", o.data_backends,
                    "Comma-separated: synthetic (device-resident random batch), cpu (loader threads decode), "
                    "gpu (entropy decoding on the loader threads, the rest on the GPU)")
        ->delimiter(',')
        ->capture_default_str();
    cmd->add_option("--workers", o.workers, "Loader threads for --data (0: one per CPU)")->check(CLI::Range(0, 1024));
    cmd->add_option("--save-every", o.save_every,
                    "Instead of the rows: what a checkpoint costs the steps around it, in blocks of this many steps "
                    "with a save after the first, synchronous (as at an epoch's end) or in the background "
                    "(train's --checkpoint-interval), against blocks without one")
        ->check(CLI::Range(1, 100000));
    cmd->add_option("--saves", o.saves, "--save-every: blocks of each kind")->check(CLI::Range(1, 1000))->capture_default_str();
    cmd->add_option("--save-dir", o.save_dir, "--save-every: folder of the checkpoint (default: the system's temporary one)");
    add_launch_flags(cmd, args->launch);
  } else {
    add_fold_bn_option(cmd, o.fold_bn, "before timing: ");
    cmd->add_option("--engine", args->engines,
                    std::string("Comma-separated engines, timed side by side: ") + deploy::kEngineHelp)
        ->delimiter(',')
        ->check(CLI::IsMember(options::engine.values))
        ->capture_default_str();
    cmd->add_option("--checkpoint", args->checkpoint,
                    "Time this checkpoint, weights file (with --arch) or exported .onnx instead of random weights; "
                    "a QAT checkpoint or an INT8 export runs as INT8 (OpenVINO: INT8 kernels)");
    cmd->add_flag("--float", args->as_float, "A QAT checkpoint: time its float weights instead of the INT8 network");
    add_graph_options(cmd, args->infer_graphs, o.graph_batch_sizes, o.graph_memory_mb, o.fused_conv);
  }
  cmd->add_option("--json", args->json, "Also write the results as JSON to this file");
  cmd->callback([args] { run_bench_model(*args); });
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks: input pipeline, training and inference speed");
  bench->require_subcommand(1);
  auto args = std::make_shared<BenchDataArgs>();
  auto* cmd = bench->add_subcommand("data", "Images/s of read + decode + transform + batching on a dataset");
  cmd->add_option("location", args->location,
                  "Image folder (DIR/<class>/..., or DIR with train/ and val/), list file, IDX folder, or synthetic[:N]")
      ->required();
  cmd->add_option("--workers", args->workers, "Decoding threads (default: one per CPU)")->check(CLI::Range(0, 1024));
  cmd->add_option("--image-size,--size", args->size, "Output side in pixels (default 224)")->check(CLI::Range(1, 8192));
  auto* train = cmd->add_flag("--train", args->train, "RandomResizedCrop + flip (the default)");
  auto* eval = cmd->add_flag("--eval", args->eval, "Resize to size/0.875 + centre crop");
  train->excludes(eval);
  cmd->add_option("--batch-size", args->batch_size, "Images per batch (default 64)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--images", args->images, "Images to time after warm-up (default 2000)")->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--prefetch", args->prefetch, "Batches prepared ahead per worker (default 2)")->check(CLI::Range(1, 64));
  cmd->add_option("--dct-scaling", args->dct_scaling, "JPEG DCT-domain downscaling: auto (train on, eval off), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_option("--bad-images", args->bad_images, "skip (replace and report) or fail (stop at the first)")
      ->check(CLI::IsMember(options::bad_images.values));
  cmd->add_option("--max-image-pixels", args->max_image_pixels, codec::kMaxImagePixelsHelp)->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", args->seed, "Shuffle and augmentation seed (default 0)");
  cmd->add_option("--data-backend", args->backend,
                  "cpu (threads decode fully) or gpu (threads entropy-decode; the rest runs on the GPU when present)")
      ->check(CLI::IsMember({"cpu", "gpu"}));
  cmd->add_option("--augment", args->augment, "Train: augmentation policy (autoaugment, or timm's rand-m9-mstd0.5 ...)");
  cmd->add_option("--interpolation,--train-interpolation", args->interpolation,
                  "bilinear | bicubic | random (train only: timm's, either per image)")
      ->check(CLI::IsMember(options::train_interpolation.values));
  cmd->add_flag("--drop-last", args->drop_last,
                "Drop each epoch's final partial batch (train: ranks then get whole batches in turn, as `train`)");
  cmd->add_option("--rank", args->rank, "The shard of this rank (default 0)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--world-size", args->world_size, "Ranks the data is split over (default 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--save-batches", args->save_batches,
                  "Write every batch loaded (uint8 images, labels, erasing boxes) to this safetensors file, keyed "
                  "images.EPOCH.BATCH");
  cmd->add_option("--reprob", args->reprob, "Train: random erasing probability (draws the boxes)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--crop-padding", args->crop_padding,
                  "Train: then torchvision's RandomCrop(size, padding=N): shifts of up to N px, zero fill")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->callback([args] { run_bench_data(*args); });
  add_model_bench(*bench, true);
  add_model_bench(*bench, false);
  add_bench_serve(*bench);
  add_bench_checkpoint(*bench);
}

}  // namespace convnets::cli
