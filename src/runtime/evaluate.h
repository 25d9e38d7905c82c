// Validation: top-1/top-k accuracy, loss, throughput and per-batch latency percentiles over a loader's epoch.
#pragma once

#include "data/loader.h"
#include "data/pipeline.h"
#include "models/network.h"
#include "runtime/runtime.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace convnets::runtime {

struct EvalResult {
  std::int64_t images = 0;
  std::int64_t k = 5;          // top-k reported (capped at the class count)
  double top1 = 0, topk = 0;   // percent
  double loss = 0;             // cross-entropy, no smoothing
  double total_ips = 0;        // images/s including data loading
  double compute_ips = 0;      // images/s of forward passes alone
  double latency_mean_ms = 0, latency_p50_ms = 0, latency_p90_ms = 0, latency_p95_ms = 0, latency_p99_ms = 0,
         latency_max_ms = 0;

  // With per-class results asked for (else undefined), on the CPU, int64:
  at::Tensor confusion;  // [classes, classes]: images of class row whose top-1 prediction was column
  at::Tensor topk_hits;  // [classes]: images of the class with it among their top-k

  // DLE's metric names: <prefix>.top1, .top5, .loss, .compute_ips, .total_ips,
  // .compute_latency (the mean) / _at95 / _at99 / _at100 (seconds, as DLE logs
  // them), and convnets' .compute_latency_mean / _at50 / _at90.
  nlohmann::ordered_json to_dllogger(const std::string& prefix) const;
};

// One class's results, from the confusion matrix as scikit-learn's
// classification_report defines them: recall = top-1 accuracy on the class's
// own images, precision = the share of its top-1 predictions that were right,
// F1 their harmonic mean; 0 where a ratio has no images (sklearn's
// zero_division=0).
struct ClassResult {
  std::int64_t images = 0, predicted = 0, correct = 0, topk_correct = 0;
  double top1 = 0, topk = 0, precision = 0, recall = 0, f1 = 0;  // percent
};
std::vector<ClassResult> per_class_results(const EvalResult& r);

// The validation loader: `options` (batch size, workers, ranks, bad-image
// policy, pixel limit) with every sample once, in order, through the eval
// transform (resize + centre crop) of `pre`.
std::unique_ptr<data::Loader> make_eval_loader(data::DatasetPtr dataset, const Preprocessing& pre,
                                               data::PipelineOptions options);

// Runs one epoch of `loader` (eval transform, no shuffling) in eval mode.
// `phase` names the progress line (empty: no progress output); print_every as Progress.
// In a data-parallel run each rank evaluates its own shard (no sample twice,
// none left out) and `sum_over_ranks` adds the counts up: the result is the
// whole set's; throughput and latency are this rank's.
EvalResult evaluate(NetworkImpl& model, data::Loader& loader, const Runtime& rt, const Preprocessing& pre,
                    std::int64_t top_k, const std::string& phase, std::int64_t print_every,
                    const std::function<void(at::Tensor&)>& sum_over_ranks = {});

// The same over any engine: `input` turns a loader batch's pixels into the
// engine's input, `logits` (timed as the compute) runs it. `device` is where
// the logits land.
struct EvalForward {
  std::function<at::Tensor(const at::Tensor& pixels)> input;
  std::function<at::Tensor(const at::Tensor& input)> logits;
  c10::Device device = c10::kCPU;
};
// `per_class`: also the confusion matrix and per-class top-k hits (EvalResult).
EvalResult evaluate(const EvalForward& forward, data::Loader& loader, std::int64_t top_k, const std::string& phase,
                    std::int64_t print_every, const std::function<void(at::Tensor&)>& sum_over_ranks = {},
                    bool per_class = false);


}  // namespace convnets::runtime
