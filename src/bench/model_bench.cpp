#include "bench/model_bench.h"

#include "bench/measurement.h"

#include "core/compat.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "deploy/engine.h"
#include "models/registry.h"

#include <torch/cuda.h>
#include <torch/torch.h>
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <cstdio>
#include <new>

namespace convnets::bench {
namespace {

using Clock = std::chrono::steady_clock;

BenchRow measure(const ModelBenchOptions& o, std::int64_t batch, int warmup, int iterations,
                 const std::string& backend, const std::string& engine = "torch") {
  return o.train ? measure_train(o, batch, warmup, iterations, backend)
                 : measure_infer(o, batch, warmup, iterations, engine);
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
