#include "bench/measurement.h"

#include "core/stats.h"
#include "deploy/engine.h"
#include "deploy/graph_engine.h"
#include "models/graph.h"

#include <ATen/cuda/CUDAEvent.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <optional>

namespace convnets::bench {

BenchRow measure_infer(const ModelBenchOptions& o, std::int64_t batch, int warmup, int iterations,
                       const std::string& engine_name) {
  const bool from_checkpoint = !o.checkpoint.empty();
  Measurement m(o, batch, /*build_model=*/!from_checkpoint);
  const auto& rt = o.runtime;
  const auto* arch = m.arch;
  const auto& pre = m.pre;
  const auto& images = m.images;
  auto& model = m.model;
  auto& times_ms = m.times_ms;
  BenchRow& row = m.row;
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
  return m.finish(seconds, iterations);
}

}  // namespace convnets::bench
