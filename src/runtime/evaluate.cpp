#include "runtime/evaluate.h"

#include "core/autocast.h"
#include "core/stats.h"
#include "core/error.h"
#include "runtime/progress.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>

namespace convnets::runtime {

std::unique_ptr<data::Loader> make_eval_loader(data::DatasetPtr dataset, const Preprocessing& pre,
                                               data::PipelineOptions options) {
  options.train = false;
  options.drop_last = false;
  options.image_size = pre.input_size;
  options.crop_ratio = pre.crop_ratio;
  options.interpolation = pre.interpolation;
  options.augment.clear();
  options.reprob = 0;
  options.device_decode = false;
  return data::make_loader(std::move(dataset), options);
}

nlohmann::ordered_json EvalResult::to_dllogger(const std::string& p) const {
  return {{p + ".top1", top1},
          {p + ".top" + std::to_string(k), topk},
          {p + ".loss", loss},
          {p + ".compute_ips", compute_ips},
          {p + ".total_ips", total_ips},
          {p + ".compute_latency_mean", latency_mean_ms / 1e3},
          {p + ".compute_latency_at50", latency_p50_ms / 1e3},
          {p + ".compute_latency_at90", latency_p90_ms / 1e3},
          {p + ".compute_latency_at95", latency_p95_ms / 1e3},
          {p + ".compute_latency_at99", latency_p99_ms / 1e3},
          {p + ".compute_latency", latency_mean_ms / 1e3},
          {p + ".compute_latency_at100", latency_max_ms / 1e3}};
}

EvalResult evaluate(NetworkImpl& model, data::Loader& loader, const Runtime& rt, const Preprocessing& pre,
                    std::int64_t top_k, const std::string& phase, std::int64_t print_every,
                    const std::function<void(at::Tensor&)>& sum_over_ranks) {
  model.eval();
  EvalForward f;
  f.input = [&](const at::Tensor& pixels) { return network_input(pixels, pre, rt); };
  f.logits = [&](const at::Tensor& input) {
    AutocastGuard autocast(rt.device, rt.autocast);
    return model.forward(input);
  };
  f.device = rt.device;
  return evaluate(f, loader, top_k, phase, print_every, sum_over_ranks);
}

std::vector<ClassResult> per_class_results(const EvalResult& r) {
  if (!r.confusion.defined()) return {};
  const auto c = r.confusion.contiguous();
  const auto n = c.size(0);
  const auto* m = c.data_ptr<std::int64_t>();
  const auto* hits = r.topk_hits.data_ptr<std::int64_t>();
  std::vector<ClassResult> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      out[static_cast<std::size_t>(i)].images += m[i * n + j];
      out[static_cast<std::size_t>(j)].predicted += m[i * n + j];
    }
  }
  const auto ratio = [](std::int64_t a, std::int64_t b) { return b > 0 ? 100.0 * static_cast<double>(a) / static_cast<double>(b) : 0.0; };
  for (std::int64_t i = 0; i < n; ++i) {
    auto& x = out[static_cast<std::size_t>(i)];
    x.correct = m[i * n + i];
    x.topk_correct = hits[i];
    x.top1 = x.recall = ratio(x.correct, x.images);
    x.topk = ratio(x.topk_correct, x.images);
    x.precision = ratio(x.correct, x.predicted);
    x.f1 = x.precision + x.recall > 0 ? 2 * x.precision * x.recall / (x.precision + x.recall) : 0.0;
  }
  return out;
}

EvalResult evaluate(const EvalForward& f, data::Loader& loader, std::int64_t top_k, const std::string& phase,
                    std::int64_t print_every, const std::function<void(at::Tensor&)>& sum_over_ranks,
                    bool per_class) {
  using clock = std::chrono::steady_clock;
  torch::NoGradGuard no_grad;
  const c10::Device device = f.device;
  EvalResult r;
  r.k = std::min<std::int64_t>(top_k, static_cast<std::int64_t>(loader.dataset().num_classes()));
  // Sums stay on the device until the end: no sync per batch beyond timing's.
  auto correct1 = torch::zeros({}, torch::dtype(torch::kLong).device(device));
  auto correctk = torch::zeros_like(correct1);
  auto loss_sum = torch::zeros({}, torch::dtype(torch::kDouble).device(device));
  const auto classes = static_cast<std::int64_t>(loader.dataset().num_classes());
  at::Tensor confusion, topk_hits;
  if (per_class) {
    confusion = torch::zeros({classes * classes}, correct1.options());
    topk_hits = torch::zeros({classes}, correct1.options());
  }
  std::vector<double> latencies;
  double compute_s = 0;
  std::optional<Progress> progress;
  if (!phase.empty()) progress.emplace(phase, loader.batches_per_epoch(), print_every, Progress::stdout_is_terminal());
  loader.start_epoch(0);
  data::Batch batch;
  const auto start = clock::now();
  while (loader.next(batch)) {
    const auto input = f.input(batch.images);
    const auto labels = batch.labels.to(device, /*non_blocking=*/true);
    if (device.is_cuda()) torch::cuda::synchronize();
    const auto t0 = clock::now();
    at::Tensor logits = f.logits(input);
    if (device.is_cuda()) torch::cuda::synchronize();
    if (per_class && logits.size(1) != classes) {
      // The matrix is the data's classes by the data's classes: a prediction outside them has no cell.
      throw Error("per-class results: the network predicts " + std::to_string(logits.size(1)) +
                      " classes, the data has " + std::to_string(classes),
                  "evaluate per class with a classifier of the data's width");
    }
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    compute_s += dt;
    latencies.push_back(dt * 1e3);
    logits = logits.to(torch::kFloat);
    loss_sum += torch::nn::functional::cross_entropy(logits, labels,
                                                     torch::nn::functional::CrossEntropyFuncOptions().reduction(
                                                         torch::kSum))
                    .to(torch::kDouble);
    const auto top = std::get<1>(logits.topk(r.k, 1));
    const auto hits = top.eq(labels.unsqueeze(1));
    correct1 += hits.select(1, 0).sum();
    const auto topk_hit = hits.any(1);
    correctk += topk_hit.sum();
    if (per_class) {
      confusion.index_add_(0, labels * classes + top.select(1, 0), torch::ones_like(labels));
      topk_hits.index_add_(0, labels, topk_hit.to(torch::kLong));
    }
    r.images += batch.labels.size(0);
    const double elapsed = std::chrono::duration<double>(clock::now() - start).count();
    if (progress) progress->update(batch.number + 1, static_cast<double>(r.images) / elapsed, "");
  }
  // Counts are exact in fp64 far beyond any dataset's size.
  auto sums = torch::stack({correct1.to(torch::kDouble), correctk.to(torch::kDouble), loss_sum,
                            torch::full({}, static_cast<double>(r.images), loss_sum.options())})
                  .cpu();
  if (sum_over_ranks) sum_over_ranks(sums);
  if (per_class) {
    // The matrix and the hits in one all-reduce; counts are exact in fp64 (below 2^53).
    auto counts = torch::cat({confusion, topk_hits}).to(torch::kDouble).cpu();
    if (sum_over_ranks) sum_over_ranks(counts);
    counts = counts.to(torch::kLong);
    r.confusion = counts.slice(0, 0, classes * classes).view({classes, classes}).clone();
    r.topk_hits = counts.slice(0, classes * classes).clone();
  }
  const double total_s = std::chrono::duration<double>(clock::now() - start).count();
  const auto* v = sums.data_ptr<double>();
  r.images = static_cast<std::int64_t>(v[3]);
  const double n = std::max(v[3], 1.0);
  r.top1 = 100.0 * v[0] / n;
  r.topk = 100.0 * v[1] / n;
  r.loss = v[2] / n;
  r.total_ips = static_cast<double>(r.images) / total_s;
  r.compute_ips = compute_s > 0 ? static_cast<double>(r.images) / compute_s : 0;
  double sum = 0;
  for (double l : latencies) sum += l;
  r.latency_mean_ms = latencies.empty() ? 0 : sum / static_cast<double>(latencies.size());
  r.latency_p50_ms = percentile(latencies, 50);
  r.latency_p90_ms = percentile(latencies, 90);
  r.latency_p95_ms = percentile(latencies, 95);
  r.latency_p99_ms = percentile(latencies, 99);
  r.latency_max_ms = percentile(latencies, 100);
  char summary[160];
  std::snprintf(summary, sizeof summary, "top-1 %.2f%%  top-%lld %.2f%%  loss %.4f  %.0f img/s", r.top1,
                static_cast<long long>(r.k), r.topk, r.loss, r.total_ips);
  if (progress) progress->finish(summary);
  return r;
}

}  // namespace convnets::runtime
