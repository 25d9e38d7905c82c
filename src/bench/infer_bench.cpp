#include "bench/infer_bench.h"

#include "bench/measurement.h"

#include "core/stats.h"
#include "deploy/engine.h"
#include "deploy/graph_engine.h"
#include "models/graph.h"

#include <ATen/cuda/CUDAEvent.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <optional>

namespace convnets::bench {
namespace {

InferBenchRow measure(const InferBenchOptions& o, std::int64_t batch, int warmup, int iterations,
                      const std::string& engine_name) {
  const bool from_checkpoint = !o.checkpoint.empty();
  Measurement m(o, batch, /*build_model=*/!from_checkpoint);
  const auto& rt = o.runtime;
  const auto* arch = m.arch;
  const auto& pre = m.pre;
  const auto& images = m.images;
  auto& model = m.model;
  auto& times_ms = m.times_ms;
  InferBenchRow row;
  row.engine = engine_name;
  if (model && o.fold_bn) fold_batchnorm(*model);
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
  const double seconds = m.timed(warmup, iterations, true, false, iteration);
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
  static_cast<BenchRow&>(row) = m.finish(seconds, iterations);
  return row;
}

}  // namespace

void set_checkpoint(InferBenchOptions& o, const std::string& path, deploy::InferenceOptions io) {
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

std::vector<InferBenchRow> run_infer_bench(const InferBenchOptions& o) {
  check_model_bench(o, /*by_name=*/o.checkpoint.empty());
  std::vector<InferBenchRow> rows;
  for (const auto& engine : o.engines) {
    auto engine_rows = rows_by_batch<InferBenchRow>(o, [&](std::int64_t batch, int warmup, int iterations) {
      return measure(o, batch, warmup, iterations, engine);
    });
    for (auto& r : engine_rows) r.engine = engine;
    rows.insert(rows.end(), engine_rows.begin(), engine_rows.end());
  }
  return rows;
}

std::string format_table(const InferBenchOptions& o, const std::vector<InferBenchRow>& rows) {
  const auto& rt = o.runtime;
  // The OpenVINO version where a row runs it (the LibTorch one is always said).
  const bool openvino = std::find(o.engines.begin(), o.engines.end(), "openvino") != o.engines.end();
  std::string out = table_heading(o, "infer", o.checkpoint.empty() ? "" : " from " + o.checkpoint,
                                  std::string(o.quantized ? ", INT8" : "") + (o.fold_bn ? ", BN folded" : ""),
                                  openvino ? ", OpenVINO " + deploy::openvino_version() : "");
  out += "| Engine | Batch | Throughput (img/s) | Latency avg (ms) | p90 | p95 | p99 |\n"
         "|:---|---:|---:|---:|---:|---:|---:|\n";
  std::string gpu_lines;
  for (const auto& r : rows) {
    if (rt.device.is_cuda() && r.fits && r.gpu_p50_ms > 0) {
      char line[256];
      std::snprintf(line, sizeof line, "GPU compute (CUDA events), %s batch %lld: mean %.3f ms, median %.3f, p90 %.3f, p99 %.3f",
                    r.engine.c_str(), static_cast<long long>(r.batch), r.gpu_mean_ms, r.gpu_p50_ms, r.gpu_p90_ms,
                    r.gpu_p99_ms);
      gpu_lines += std::string(line) + (r.graphs.empty() ? "" : " (" + r.graphs + ")") + "\n";
    }
    out += "| " + r.engine + " | " + std::to_string(r.batch) + " | ";
    if (!r.fits) {
      out += "out of memory; largest batch that fits: " + std::to_string(r.largest_fitting) + " |\n";
      continue;
    }
    char ips[32];
    std::snprintf(ips, sizeof ips, "%.1f", r.images_per_s);
    out += std::string(ips) + " | " + ms(r.mean_ms) + " | " + ms(r.p90_ms) + " | " + ms(r.p95_ms) + " | " +
           ms(r.p99_ms) + " |\n";
  }
  if (!gpu_lines.empty()) out += "\n" + gpu_lines;
  return out;
}

nlohmann::ordered_json to_json(const InferBenchOptions& o, const std::vector<InferBenchRow>& rows) {
  auto j = json_heading(o, "infer");
  j["fold_bn"] = o.fold_bn;
  j["checkpoint"] = o.checkpoint;
  j["quantized"] = o.quantized;
  j["rows"] = nlohmann::ordered_json::array();
  for (const auto& r : rows) {
    nlohmann::ordered_json row;
    add_row_json(o, r, row);
    row["engine"] = r.engine;
    if (r.fits) {
      row["p50_ms"] = r.p50_ms, row["p90_ms"] = r.p90_ms, row["p95_ms"] = r.p95_ms, row["p99_ms"] = r.p99_ms;
      if (o.runtime.device.is_cuda()) {
        row["gpu_mean_ms"] = r.gpu_mean_ms, row["gpu_p50_ms"] = r.gpu_p50_ms, row["gpu_p90_ms"] = r.gpu_p90_ms;
        row["gpu_p99_ms"] = r.gpu_p99_ms, row["graphs"] = r.graphs;
      }
    }
    j["rows"].push_back(row);
  }
  return j;
}

}  // namespace convnets::bench
