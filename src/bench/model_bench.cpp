#include "bench/model_bench.h"

#include "core/autocast.h"
#include "core/stats.h"
#include "core/compat.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/memory.h"
#include "data/pipeline.h"
#include "deploy/engine.h"
#include "deploy/graph_engine.h"
#include "models/graph.h"
#include "models/registry.h"
#include "runtime/evaluate.h"

#include <torch/cuda.h>
#include <torch/torch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <numeric>
#include <optional>
#include <set>

namespace convnets::bench {
namespace {

using Clock = std::chrono::steady_clock;

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

void release_cached_memory() {
  // Without this the trimmed-never heap (core/memory.h) keeps the failed
  // attempt's pages and the bisection under-reports what fits.
  release_host_memory();
  c10::cuda::CUDACachingAllocator::emptyCache();
}

int input_size(const ModelBenchOptions& o) {
  return o.image_size > 0 ? o.image_size : find_architecture(o.arch).preprocessing.input_size;
}

// One batch size, measured from a freshly built model, so earlier sizes leave
// neither weights nor cached blocks behind.
// Training input from files through the real loader, with the time of each stage.
struct FileInput {
  std::unique_ptr<data::Loader> loader;
  std::int64_t epoch = 0;
  data::EpochStats done;  // totals of finished epochs
  double wait_s = 0, input_s = 0;
  std::int64_t steps = 0;

  FileInput(const ModelBenchOptions& o, std::int64_t batch, int size, bool device_decode) {
    data::PipelineOptions lo;
    lo.image_size = size;
    lo.batch_size = batch;
    lo.workers = o.workers;
    lo.prefetch = 4;
    lo.drop_last = true;
    lo.device_decode = device_decode;
    loader = data::make_loader(data::open_dataset(o.data, "train"), lo);
    loader->start_epoch(0);
  }
  data::Batch next() {
    data::Batch b;
    if (!loader->next(b)) {
      done += loader->stats();
      loader->start_epoch(++epoch);
      loader->next(b);
    }
    return b;
  }
  data::EpochStats totals() const {
    data::EpochStats t = done;
    t += loader->stats();
    return t;
  }
};

// `steps` more iterations under LibTorch's Kineto profiler (host ops; on CUDA its kernels and copies through CUPTI,
// those a CUDA graph replays too), written as a Chrome trace, as torch.profiler's export_chrome_trace writes one.
template <typename Iteration>
void profile_steps(const std::string& path, int steps, const c10::Device& device, Iteration&& iteration) {
  namespace prof = torch::profiler::impl;
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
  std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  if (device.is_cuda()) {
    activities.insert(prof::ActivityType::CUDA);
    // What torch.profiler sets when CUDA graphs are about (torch/profiler/profiler.py; pytorch#75504): CUPTI torn
    // down and re-initialised around a replayed graph loses or breaks its kernel records.
    ::setenv("TEARDOWN_CUPTI", "0", 0);
    ::setenv("DISABLE_CUPTI_LAZY_REINIT", "1", 0);
  }
  std::remove(path.c_str());  // a trace left by an earlier run must not pass for this one's
  synchronize(device);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  // Disabled however the steps end: a profiler left on would record the rest of the run.
  struct Stop {
    std::unique_ptr<torch::autograd::profiler::ProfilerResult> result;
    ~Stop() {
      if (!result) torch::autograd::profiler::disableProfiler();
    }
  } stop;
  for (int i = 0; i < steps; ++i) iteration();
  synchronize(device);
  stop.result = torch::autograd::profiler::disableProfiler();
  stop.result->save(path);
  if (!std::ifstream(path)) throw Error("--profile " + path + ": the profiler wrote no trace there");
}

BenchRow measure(const ModelBenchOptions& o, std::int64_t batch, int warmup, int iterations,
                 const std::string& backend, const std::string& engine_name = "torch") {
  const auto& rt = o.runtime;
  // A checkpoint's arch may be a layer list it carries (no registry name):
  // InferenceModel resolves it; only random weights need the registry.
  const bool from_checkpoint = !o.train && !o.checkpoint.empty();
  const ArchInfo* arch = from_checkpoint ? nullptr : &find_architecture(o.arch);
  Preprocessing pre = arch ? arch->preprocessing : Preprocessing{};
  pre.input_size = input_size(o);
  // A checkpoint brings its own network (InferenceModel below); otherwise
  // random weights, seeded so every row times the same model.
  Network model;
  if (!from_checkpoint) {
    torch::manual_seed(0);
    ModelOptions mo;
    mo.num_classes = o.num_classes;
    model = build_model(*arch, mo);
    runtime::prepare_model(*model, rt);
    if (!o.train && o.fold_bn) fold_batchnorm(*model);
  }
  const auto device_opts = torch::TensorOptions().device(rt.device);
  // Synthetic data lives on the device as the loader's uint8 NHWC batch: each
  // iteration still pays the normalisation pass that real data needs.
  const auto images = torch::randint(0, 256, {batch, pre.input_size, pre.input_size, 3}, device_opts.dtype(torch::kByte));
  const auto labels = torch::randint(0, o.num_classes, {batch}, device_opts.dtype(torch::kLong));
  std::optional<FileInput> files;
  if (backend != "synthetic") files.emplace(o, batch, pre.input_size, runtime::use_device_decode(backend, rt));

  // The row's own peak: a larger batch fits where a smaller peak at the same batch leaves room (issue 58).
  if (rt.device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(rt.device.index());
  BenchRow row;
  row.batch = batch;
  row.data_backend = backend;
  row.engine = engine_name;
  std::vector<double> times_ms;
  auto timed = [&](auto&& iteration, bool sync_each) {
    for (int i = 0; i < warmup; ++i) {
      const auto t0 = Clock::now();
      iteration();
      if (i == 0 && o.train) {
        // The first step alone: what a second run's tuning cache shortens.
        synchronize(rt.device);
        row.first_step_s = std::chrono::duration<double>(Clock::now() - t0).count();
      }
    }
    synchronize(rt.device);
    const auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) {
      const auto t0 = Clock::now();
      iteration();
      if (sync_each) {
        synchronize(rt.device);
        times_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
    }
    synchronize(rt.device);
    return std::chrono::duration<double>(Clock::now() - start).count();
  };

  double seconds = 0;
  if (o.train) {
    if (!o.train_step) throw Error("bench train: no training step was given (ModelBenchOptions::train_step)");
    const auto stepper = o.train_step(*model, rt, o);
    auto iteration = [&] {
      if (!files) {
        stepper->run(runtime::network_input(images, pre, rt), labels);
        return;
      }
      const auto t0 = Clock::now();
      const data::Batch b = files->next();
      const auto t1 = Clock::now();
      const at::Tensor input = runtime::batch_input(b, pre, rt);
      const at::Tensor labels_on_device = b.labels.to(rt.device, true);
      const auto t2 = Clock::now();
      stepper->run(input, labels_on_device);
      files->wait_s += std::chrono::duration<double>(t1 - t0).count();
      files->input_s += std::chrono::duration<double>(t2 - t1).count();
      ++files->steps;
    };
    // Throughput as training sees it: the host runs ahead, one sync at the end.
    seconds = timed(iteration, false);
    // Known once the warm-up has built (and captured) the step: whether it replays, which blocks fell back.
    row.cuda_graph = stepper->graphed();
    row.fused_bn = stepper->fused_bn();
    row.tuning = stepper->tuning();
    row.tuning_s = stepper->tuning_seconds();
    row.mean_ms = seconds * 1e3 / iterations;
    if (!o.profile.empty() && !files && batch == o.batch_sizes.back()) {
      profile_steps(o.profile, o.profile_steps, rt.device, iteration);
    }
    if (files) {
      const data::EpochStats st = files->totals();
      const double per_image = st.images > 0 ? 1e3 / static_cast<double>(st.images) : 0;
      row.workers = files->loader->workers();
      row.read_ms = st.read_s * per_image;
      row.decode_ms = st.decode_s * per_image;
      row.augment_ms = st.transform_s * per_image;
      row.device_fraction = st.images > 0 ? static_cast<double>(st.device_images) / static_cast<double>(st.images) : 0;
      row.wait_ms = files->wait_s * 1e3 / static_cast<double>(files->steps);
      row.input_ms = files->input_s * 1e3 / static_cast<double>(files->steps);
      // The copy and device stage alone, synchronised, on a few more batches.
      const int probes = 5;
      double device_s = 0;
      for (int i = 0; i < probes; ++i) {
        const data::Batch b = files->next();
        synchronize(rt.device);
        const auto t0 = Clock::now();
        const at::Tensor x = runtime::batch_input(b, pre, rt);
        synchronize(rt.device);
        device_s += std::chrono::duration<double>(Clock::now() - t0).count();
      }
      row.device_ms = device_s * 1e3 / probes;
    }
    if (const auto* sync = stepper->sync_stats()) {
      const auto& st = *sync;
      row.processes = o.group->world_size();
      row.buckets = st.buckets;
      row.allreduce_mb = static_cast<double>(st.bytes_per_step) / (1 << 20);
      row.comm_wait_ms = st.steps > 0 ? st.exposed_wait_s * 1e3 / static_cast<double>(st.steps) : 0;
    }
  } else {
    if (model) model->eval();  // null: the checkpoint's InferenceModel sets its own
    c10::InferenceMode inference;
    std::unique_ptr<deploy::InferenceModel> loaded;
    std::unique_ptr<deploy::Engine> built;
    if (from_checkpoint) {
      deploy::InferenceOptions io = o.checkpoint_options;
      io.engine = engine_name;
      loaded = std::make_unique<deploy::InferenceModel>(o.checkpoint, io);
    } else {
      deploy::EngineSpec spec;
      spec.arch = arch->name;
      spec.model = model;
      spec.pre = pre;
      spec.num_classes = o.num_classes;
      spec.rt = rt;
      // The torch engine on CUDA as classify, eval and serve run it: a CUDA graph per batch size.
      built = engine_name == "torch" && rt.device.is_cuda() && o.cuda_graph
                  ? deploy::make_graphed_engine(std::move(spec), {o.graph_batch_sizes, o.graph_memory_mb, o.fused_conv})
                  : deploy::make_engine(engine_name, std::move(spec));
    }
    const deploy::Engine& engine = loaded ? loaded->engine() : *built;
    std::vector<double> gpu_ms;
    std::optional<at::cuda::CUDAEvent> start, stop;
    if (rt.device.is_cuda()) start.emplace(cudaEventDefault), stop.emplace(cudaEventDefault);
    // From the uint8 batch to float logits, as eval and classify run it; on CUDA the forward pass alone timed on
    // the GPU too (the normalisation of the pixels comes before the first event).
    auto iteration = [&] {
      if (!start) {
        engine.logits(images);
        return;
      }
      const auto input = engine.input(images);
      start->record();
      engine.logits_of_input(input);
      stop->record();
      stop->synchronize();
      gpu_ms.push_back(start->elapsed_time(*stop));
    };
    // Latency: each batch from input to logits, synchronised.
    seconds = timed(iteration, true);
    row.mean_ms = seconds * 1e3 / iterations;
    row.p50_ms = percentile(times_ms, 50);
    row.p90_ms = percentile(times_ms, 90);
    row.p95_ms = percentile(times_ms, 95);
    row.p99_ms = percentile(times_ms, 99);
    if (!gpu_ms.empty()) {
      // The timed iterations only: the warm-up's (captures among them) come first.
      gpu_ms.erase(gpu_ms.begin(), gpu_ms.begin() + std::min<std::size_t>(gpu_ms.size(), warmup));
      row.gpu_mean_ms = std::accumulate(gpu_ms.begin(), gpu_ms.end(), 0.0) / static_cast<double>(gpu_ms.size());
      row.gpu_p50_ms = percentile(gpu_ms, 50);
      row.gpu_p90_ms = percentile(gpu_ms, 90);
      row.gpu_p99_ms = percentile(gpu_ms, 99);
    }
    row.graphs = deploy::describe_graphs(engine);
  }
  row.images_per_s = static_cast<double>(batch) * iterations / seconds;
  row.total_images_per_s = row.images_per_s;
  if (rt.device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(rt.device.index());
    const auto aggregate = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    row.peak_memory_mb = static_cast<double>(stats.allocated_bytes[aggregate].peak) / (1 << 20);
  }
  if (o.group && o.train) {
    auto t = torch::full({1}, row.images_per_s, torch::kDouble);
    o.group->all_reduce_sum(t);
    row.total_images_per_s = t.item<double>();
  }
  return row;
}

bool fits(const ModelBenchOptions& o, std::int64_t batch, const std::string& engine) {
  try {
    measure(o, batch, 1, 1, "synthetic", engine);
    release_cached_memory();
    return true;
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) throw;
    release_cached_memory();
    return false;
  }
}

std::string device_description(const c10::Device& device) {
  if (device.is_cuda()) return device.str() + " (" + at::cuda::getCurrentDeviceProperties()->name + ")";
  return device.str() + " (" + std::to_string(at::get_num_threads()) + " threads)";
}

// The OpenVINO version where an infer row runs it (the LibTorch one is always said).
std::string engines_line(const ModelBenchOptions& o) {
  if (o.train || std::find(o.engines.begin(), o.engines.end(), "openvino") == o.engines.end()) return "";
  return ", OpenVINO " + deploy::openvino_version();
}

std::string ms(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

}  // namespace

void set_checkpoint(ModelBenchOptions& o, const std::string& path, deploy::InferenceOptions io) {
  io.engine = o.engines.empty() ? "auto" : o.engines.front();
  io.image_size = o.image_size;
  const deploy::InferenceModel probe(path, io);
  o.checkpoint = path;
  o.checkpoint_options = io;
  o.arch = probe.arch().name;
  o.image_size = probe.preprocessing().input_size;
  o.num_classes = probe.num_classes();
  o.quantized = probe.quantized();
}

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) return true;
  const std::string what = e.what();
  // CUDA: "CUDA out of memory."; DefaultCPUAllocator: "can't allocate memory"
  // or "not enough memory". oneDNN (LibTorch's CPU convolutions) allocates its
  // scratchpad while it creates a primitive and reports that failing as "could
  // not create a primitive": seen under an address-space limit in a fresh clone
  // (bench_cli), at a batch larger than one that had just run with the same
  // primitives, so the size is what changed.
  return what.find("out of memory") != std::string::npos || what.find("can't allocate memory") != std::string::npos ||
         what.find("not enough memory") != std::string::npos ||
         what.find("could not create a primitive") != std::string::npos;
}

std::vector<BenchRow> run_model_bench(const ModelBenchOptions& o) {
  if (o.checkpoint.empty()) find_architecture(o.arch);  // a bad name fails before any work
  if (o.batch_sizes.empty()) throw Error("--batch-sizes: expected at least one batch size");
  for (auto b : o.batch_sizes) {
    if (b < 1) throw Error("--batch-sizes: " + std::to_string(b) + " is not a batch size (expected >= 1)");
  }
  if (o.iterations < 1) throw Error("--iterations: expected >= 1");
  if (o.data_backends.empty()) throw Error("--data-backend: expected at least one of synthetic, cpu, gpu");
  for (const auto& b : o.data_backends) {
    if (b != "synthetic" && b != "cpu" && b != "gpu")
      throw Error("--data-backend " + b + ": expected synthetic, cpu or gpu");
    if (b != "synthetic" && o.data.empty())
      throw Error("--data-backend " + b + " reads files: give --data (an image folder or list file)");
    if (b != "synthetic" && !o.train) throw Error("--data-backend " + b + ": only bench train reads files");
  }
  std::vector<BenchRow> rows;
  const bool synthetic =
      std::find(o.data_backends.begin(), o.data_backends.end(), "synthetic") != o.data_backends.end();
  for (const auto& engine : o.train ? std::vector<std::string>{"torch"} : o.engines) {
    std::int64_t last_fit = 0;
    for (const auto batch : synthetic ? o.batch_sizes : std::vector<std::int64_t>{}) {
      try {
        rows.push_back(measure(o, batch, o.warmup, o.iterations, "synthetic", engine));
        last_fit = std::max(last_fit, batch);
        continue;
      } catch (const std::exception& e) {
        if (!is_out_of_memory(e)) throw;
      }
      release_cached_memory();
      BenchRow row;
      row.batch = batch;
      row.engine = engine;
      row.fits = false;
      std::int64_t lo = last_fit < batch ? last_fit : 0, hi = batch;
      while (hi - lo > 1) {
        const std::int64_t mid = lo + (hi - lo) / 2;
        (fits(o, mid, engine) ? lo : hi) = mid;
      }
      row.largest_fitting = lo;
      rows.push_back(row);
    }
  }
  // Then the same step fed from files, backend by backend.
  for (const auto& backend : o.data_backends) {
    if (backend == "synthetic") continue;
    for (const auto batch : o.batch_sizes) rows.push_back(measure(o, batch, o.warmup, o.iterations, backend));
  }
  return rows;
}

std::string format_table(const ModelBenchOptions& o, const std::vector<BenchRow>& rows) {
  const auto& rt = o.runtime;
  const int size = input_size(o);
  std::string out = std::string("convnets bench ") + (o.train ? "train" : "infer") + ": " + o.arch +
                    (o.checkpoint.empty() ? "" : " from " + o.checkpoint) + ", " + rt.precision +
                    (o.quantized ? ", INT8" : "") + (!o.train && o.fold_bn ? ", BN folded" : "") + ", " +
                    (rt.channels_last ? "nhwc" : "nchw") + ", " + std::to_string(size) + "x" +
                    std::to_string(size) + ", " + device_description(rt.device) + ", " +
                    compat::engine_versions() + engines_line(o) + "\n\n";
  if (o.train) {
    // Where the run could fuse at all; on the CPU every row would say "not on CUDA".
    if (rt.device.is_cuda() && !rows.empty() && !rows.front().fused_bn.empty()) {
      out += "fused BN: " + rows.front().fused_bn + "\n\n";
    }
    for (const auto& r : rows) {
      if (r.tuning.empty() || r.data_backend != "synthetic") continue;
      char line[160];
      std::snprintf(line, sizeof line, "batch %lld: first step %.2f s, of which the step tuner %.2f s; ",
                    static_cast<long long>(r.batch), r.first_step_s, r.tuning_s);
      out += line + r.tuning + "\n\n";
    }
    out += "| Batch | Throughput (img/s) | Step (ms) | CUDA graph |\n|---:|---:|---:|:---|\n";
  } else {
    out += "| Engine | Batch | Throughput (img/s) | Latency avg (ms) | p90 | p95 | p99 |\n"
           "|:---|---:|---:|---:|---:|---:|---:|\n";
  }
  bool any_files = false;
  std::string gpu_lines;
  for (const auto& r : rows) {
    if (!o.train && rt.device.is_cuda() && r.fits && r.gpu_p50_ms > 0) {
      char line[256];
      std::snprintf(line, sizeof line, "GPU compute (CUDA events), %s batch %lld: mean %.3f ms, median %.3f, p90 %.3f, p99 %.3f",
                    r.engine.c_str(), static_cast<long long>(r.batch), r.gpu_mean_ms, r.gpu_p50_ms, r.gpu_p90_ms,
                    r.gpu_p99_ms);
      gpu_lines += std::string(line) + (r.graphs.empty() ? "" : " (" + r.graphs + ")") + "\n";
    }
    if (r.data_backend != "synthetic") {
      any_files = true;
      continue;
    }
    out += "| " + (o.train ? "" : r.engine + " | ") + std::to_string(r.batch) + " | ";
    if (!r.fits) {
      out += "out of memory; largest batch that fits: " + std::to_string(r.largest_fitting) + " |\n";
      continue;
    }
    char ips[32];
    std::snprintf(ips, sizeof ips, "%.1f", r.images_per_s);
    out += std::string(ips) + " | " + ms(r.mean_ms) + " | ";
    out += o.train ? std::string(r.cuda_graph ? "yes" : "no") + " |\n"
                   : ms(r.p90_ms) + " | " + ms(r.p95_ms) + " | " + ms(r.p99_ms) + " |\n";
  }
  if (!gpu_lines.empty()) out += "\n" + gpu_lines;
  if (!any_files) return out;
  // Training from files: throughput against the synthetic row of the same
  // batch in this run, and where the time goes. Loader stages are CPU time per
  // image summed over its threads, so 1000 / (read + decode + augment) is what
  // one core sustains.
  out += "\nFrom " + o.data + " (train transform at " + std::to_string(size) + " px):\n\n";
  out += "| Data | Batch | Threads | img/s | vs synthetic | read | decode | augment | img/s per core | wait (ms/step) | "
         "input (ms/step) | copy+device (ms/batch) | compute (ms/step) | on device |\n"
         "|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& r : rows) {
    if (r.data_backend == "synthetic") continue;
    const BenchRow* synth = nullptr;
    for (const auto& q : rows)
      if (q.data_backend == "synthetic" && q.batch == r.batch && q.fits) synth = &q;
    char buf[512];
    const double cpu_ms = r.read_ms + r.decode_ms + r.augment_ms;
    std::snprintf(buf, sizeof buf, "| %s | %lld | %d | %.1f | %s | %.3f | %.3f | %.3f | %.0f | %.2f | %.2f | %.2f | %s | %.0f%% |\n",
                  r.data_backend.c_str(), static_cast<long long>(r.batch), r.workers, r.images_per_s,
                  synth ? (std::to_string(static_cast<int>(100.0 * r.images_per_s / synth->images_per_s + 0.5)) + "%").c_str()
                        : "-",
                  r.read_ms, r.decode_ms, r.augment_ms, cpu_ms > 0 ? 1e3 / cpu_ms : 0.0, r.wait_ms, r.input_ms,
                  r.device_ms, synth ? ms(synth->mean_ms).c_str() : "-", 100.0 * r.device_fraction);
    out += buf;
  }
  return out;
}

nlohmann::ordered_json to_json(const ModelBenchOptions& o, const std::vector<BenchRow>& rows) {
  const auto& rt = o.runtime;
  nlohmann::ordered_json j = {{"tool", "convnets"},
                              {"mode", o.train ? "train" : "infer"},
                              {"arch", o.arch},
                              {"precision", rt.precision},
                              {"memory_format", rt.channels_last ? "nhwc" : "nchw"},
                              {"image_size", input_size(o)},
                              {"device", device_description(rt.device)},
                              {"torch_version", TORCH_VERSION},
                              {"engine", compat::engine_versions()},
                              {"convnets_version", CONVNETS_VERSION},
                              {"warmup", o.warmup},
                              {"iterations", o.iterations},
                              {"fold_bn", !o.train && o.fold_bn},
                              {"checkpoint", o.checkpoint},
                              {"quantized", o.quantized},
                              {"openvino_version", deploy::openvino_version()},
                              {"cpu_bf16", cpu_bf16_instructions()},
                              {"data", o.data},
                              {"rows", nlohmann::ordered_json::array()}};
  for (const auto& r : rows) {
    nlohmann::ordered_json row = {{"batch", r.batch}, {"fits", r.fits}, {"data_backend", r.data_backend}};
    if (!o.train) row["engine"] = r.engine;
    if (r.data_backend != "synthetic") {
      row["workers"] = r.workers;
      row["read_ms_per_image"] = r.read_ms, row["decode_ms_per_image"] = r.decode_ms;
      row["augment_ms_per_image"] = r.augment_ms, row["wait_ms_per_step"] = r.wait_ms;
      row["input_ms_per_step"] = r.input_ms, row["copy_device_ms_per_batch"] = r.device_ms;
      row["device_decoded_fraction"] = r.device_fraction;
    }
    if (!r.fits) {
      row["largest_fitting"] = r.largest_fitting;
    } else {
      row["images_per_s"] = r.images_per_s;
      row["mean_ms"] = r.mean_ms;
      if (o.runtime.device.is_cuda()) row["peak_memory_mb"] = r.peak_memory_mb;
      if (o.train) {
        row["cuda_graph"] = r.cuda_graph;
        row["fused_bn"] = r.fused_bn;
        row["tuning"] = r.tuning;
        row["tuning_s"] = r.tuning_s;
        row["first_step_s"] = r.first_step_s;
        row["processes"] = r.processes;
        row["total_images_per_s"] = r.total_images_per_s;
        if (o.group) {  // a data-parallel run, of one process too
          row["buckets"] = r.buckets, row["allreduce_mb"] = r.allreduce_mb, row["comm_wait_ms"] = r.comm_wait_ms;
        }
      } else {
        row["p50_ms"] = r.p50_ms, row["p90_ms"] = r.p90_ms, row["p95_ms"] = r.p95_ms, row["p99_ms"] = r.p99_ms;
        if (o.runtime.device.is_cuda()) {
          row["gpu_mean_ms"] = r.gpu_mean_ms, row["gpu_p50_ms"] = r.gpu_p50_ms, row["gpu_p90_ms"] = r.gpu_p90_ms;
          row["gpu_p99_ms"] = r.gpu_p99_ms, row["graphs"] = r.graphs;
        }
      }
    }
    j["rows"].push_back(row);
  }
  return j;
}

}  // namespace convnets::bench
