#include "bench/train_bench.h"

#include "bench/measurement.h"

#include "core/error.h"
#include "data/pipeline.h"
#include "runtime/runtime.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>

namespace convnets::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Training input from files through the real loader, with the time of each stage.
struct FileInput {
  std::unique_ptr<data::Loader> loader;
  std::int64_t epoch = 0;
  data::EpochStats done;  // totals of finished epochs
  double wait_s = 0, input_s = 0;
  std::int64_t steps = 0;

  FileInput(const TrainBenchOptions& o, std::int64_t batch, int size, bool device_decode) {
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

TrainBenchRow measure(const TrainBenchOptions& o, std::int64_t batch, int warmup, int iterations,
                      const std::string& backend) {
  Measurement m(o, batch, /*build_model=*/true);
  const auto& rt = o.runtime;
  const auto& pre = m.pre;
  const auto& images = m.images;
  const auto& labels = m.labels;
  auto& model = m.model;
  TrainBenchRow row;
  row.data_backend = backend;
  std::optional<FileInput> files;
  if (backend != "synthetic") files.emplace(o, batch, pre.input_size, runtime::use_device_decode(backend, rt));
  if (!o.train_step) throw Error("bench train: no training step was given (TrainBenchOptions::train_step)");
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
  const double seconds = m.timed(warmup, iterations, false, true, iteration);
  // Known once the warm-up has built (and captured) the step: whether it replays, which blocks fell back.
  row.cuda_graph = stepper->graphed();
  row.fused_bn = stepper->fused_bn();
  row.tuning = stepper->tuning();
  row.tuning_s = stepper->tuning_seconds();
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
  static_cast<BenchRow&>(row) = m.finish(seconds, iterations);
  row.first_step_s = m.first_step_s;
  row.total_images_per_s = row.images_per_s;
  if (o.group) {
    auto t = torch::full({1}, row.images_per_s, torch::kDouble);
    o.group->all_reduce_sum(t);
    row.total_images_per_s = t.item<double>();
  }
  return row;
}

}  // namespace

std::vector<TrainBenchRow> run_train_bench(const TrainBenchOptions& o) {
  check_model_bench(o, /*by_name=*/true);
  if (o.data_backends.empty()) throw Error("--data-backend: expected at least one of synthetic, cpu, gpu");
  for (const auto& b : o.data_backends) {
    if (b != "synthetic" && b != "cpu" && b != "gpu")
      throw Error("--data-backend " + b + ": expected synthetic, cpu or gpu");
    if (b != "synthetic" && o.data.empty())
      throw Error("--data-backend " + b + " reads files: give --data (an image folder or list file)");
  }
  std::vector<TrainBenchRow> rows;
  if (std::find(o.data_backends.begin(), o.data_backends.end(), "synthetic") != o.data_backends.end()) {
    rows = rows_by_batch<TrainBenchRow>(o, [&](std::int64_t batch, int warmup, int iterations) {
      return measure(o, batch, warmup, iterations, "synthetic");
    });
  }
  // Then the same step fed from files, backend by backend.
  for (const auto& backend : o.data_backends) {
    if (backend == "synthetic") continue;
    for (const auto batch : o.batch_sizes) rows.push_back(measure(o, batch, o.warmup, o.iterations, backend));
  }
  return rows;
}

std::string format_table(const TrainBenchOptions& o, const std::vector<TrainBenchRow>& rows) {
  const auto& rt = o.runtime;
  std::string out = table_heading(o, "train", "", "", "");
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
  bool any_files = false;
  for (const auto& r : rows) {
    if (r.data_backend != "synthetic") {
      any_files = true;
      continue;
    }
    out += "| " + std::to_string(r.batch) + " | ";
    if (!r.fits) {
      out += "out of memory; largest batch that fits: " + std::to_string(r.largest_fitting) + " |\n";
      continue;
    }
    char ips[32];
    std::snprintf(ips, sizeof ips, "%.1f", r.images_per_s);
    out += std::string(ips) + " | " + ms(r.mean_ms) + " | " + (r.cuda_graph ? "yes" : "no") + " |\n";
  }
  if (!any_files) return out;
  // Training from files: throughput against the synthetic row of the same
  // batch in this run, and where the time goes. Loader stages are CPU time per
  // image summed over its threads, so 1000 / (read + decode + augment) is what
  // one core sustains.
  out += "\nFrom " + o.data + " (train transform at " + std::to_string(input_size(o)) + " px):\n\n";
  out += "| Data | Batch | Threads | img/s | vs synthetic | read | decode | augment | img/s per core | wait (ms/step) | "
         "input (ms/step) | copy+device (ms/batch) | compute (ms/step) | on device |\n"
         "|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& r : rows) {
    if (r.data_backend == "synthetic") continue;
    const TrainBenchRow* synth = nullptr;
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

nlohmann::ordered_json to_json(const TrainBenchOptions& o, const std::vector<TrainBenchRow>& rows) {
  auto j = json_heading(o, "train");
  j["data"] = o.data;
  j["rows"] = nlohmann::ordered_json::array();
  for (const auto& r : rows) {
    nlohmann::ordered_json row;
    add_row_json(o, r, row);
    row["data_backend"] = r.data_backend;
    if (r.data_backend != "synthetic") {
      row["workers"] = r.workers;
      row["read_ms_per_image"] = r.read_ms, row["decode_ms_per_image"] = r.decode_ms;
      row["augment_ms_per_image"] = r.augment_ms, row["wait_ms_per_step"] = r.wait_ms;
      row["input_ms_per_step"] = r.input_ms, row["copy_device_ms_per_batch"] = r.device_ms;
      row["device_decoded_fraction"] = r.device_fraction;
    }
    if (r.fits) {
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
    }
    j["rows"].push_back(row);
  }
  return j;
}

}  // namespace convnets::bench
