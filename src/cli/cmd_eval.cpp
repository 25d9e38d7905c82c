// `convnets eval`: accuracy, loss, throughput and latency percentiles of a checkpoint on a validation set.
#include "cli/commands.h"
#include "core/options.h"
#include "core/error.h"
#include "core/json.h"
#include "io/atomic_file.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "deploy/inference.h"
#include "runtime/evaluate.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace convnets::cli {
namespace {

struct EvalArgs {
  std::string data, checkpoint, interpolation, bad_images = "skip";
  std::int64_t max_image_pixels = codec::kDefaultMaxImagePixels;
  std::int64_t batch_size = 256, top_k = 5, max_images = 0;
  int workers = 0;
  double crop_ratio = 0;
  bool json = false, per_class = false;
  std::string per_class_csv;
  deploy::InferenceOptions io;  // num_classes: a plain weights file's width, defaulting to the data's classes
};

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + '"';
}

std::string fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// A row per true class: its results, then its images' top-1 predictions, a column per class (the confusion
// matrix's row), as spreadsheets and pandas.read_csv take it.
std::string per_class_csv(const runtime::EvalResult& r, const std::vector<runtime::ClassResult>& rows,
                          const std::vector<std::string>& names) {
  const std::string k = "top" + std::to_string(r.k);
  std::string out = "class,images,top1," + k + ",precision,recall,f1";
  for (const auto& n : names) out += "," + csv_field("predicted " + n);
  out += '\n';
  const auto n = static_cast<std::int64_t>(rows.size());
  const auto* m = r.confusion.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const auto& x = rows[static_cast<std::size_t>(i)];
    out += csv_field(names[static_cast<std::size_t>(i)]) + ',' + std::to_string(x.images) + ',' + fixed(x.top1, 4) +
           ',' + fixed(x.topk, 4) + ',' + fixed(x.precision, 4) + ',' + fixed(x.recall, 4) + ',' + fixed(x.f1, 4);
    for (std::int64_t j = 0; j < n; ++j) out += ',' + std::to_string(m[i * n + j]);
    out += '\n';
  }
  return out;
}

void print_per_class(const runtime::EvalResult& r, const std::vector<runtime::ClassResult>& rows,
                     const std::vector<std::string>& names) {
  std::size_t width = 5;
  for (const auto& n : names) width = std::max(width, std::min<std::size_t>(n.size(), 40));
  std::printf("\n%-*s %8s %8s %8s %9s %8s %8s\n", static_cast<int>(width), "class", "images", "top-1",
              ("top-" + std::to_string(r.k)).c_str(), "precision", "recall", "F1");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& x = rows[i];
    std::printf("%-*s %8lld %7.2f%% %7.2f%% %8.2f%% %7.2f%% %7.2f%%\n", static_cast<int>(width),
                names[i].substr(0, 40).c_str(), static_cast<long long>(x.images), x.top1, x.topk, x.precision,
                x.recall, x.f1);
  }
  // What a reader looks for first: the largest off-diagonal counts.
  struct Pair {
    std::int64_t count, truth, predicted;
  };
  std::vector<Pair> pairs;
  const auto n = static_cast<std::int64_t>(rows.size());
  const auto* m = r.confusion.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      if (i != j && m[i * n + j] > 0) pairs.push_back({m[i * n + j], i, j});
    }
  }
  std::stable_sort(pairs.begin(), pairs.end(), [](const Pair& a, const Pair& b) { return a.count > b.count; });
  if (pairs.size() > 10) pairs.resize(10);
  if (pairs.empty()) return;
  std::printf("\nmost confused (true -> predicted: images)\n");
  for (const auto& p : pairs) {
    std::printf("  %s -> %s: %lld\n", names[static_cast<std::size_t>(p.truth)].c_str(),
                names[static_cast<std::size_t>(p.predicted)].c_str(), static_cast<long long>(p.count));
  }
}

void run(const EvalArgs& a) {
  if (a.batch_size < 1) throw Error("--batch-size must be at least 1, got " + std::to_string(a.batch_size));
  if (a.top_k < 1) throw Error("--top-k must be at least 1, got " + std::to_string(a.top_k));
  auto ds = data::head(data::open_dataset(a.data, "val"), static_cast<std::size_t>(a.max_images));
  deploy::InferenceOptions io = a.io;
  // A plain weights file's; ImageNet weights may be measured on fewer classes (labels below their width).
  const auto data_classes = static_cast<std::int64_t>(ds->num_classes());
  if (io.num_classes && *io.num_classes < data_classes) {
    throw Error("--num-classes " + std::to_string(*io.num_classes) + ": " + a.data + " has " +
                std::to_string(data_classes) + " classes; the classifier needs at least that many");
  }
  if (!io.num_classes) io.num_classes = data_classes;
  const deploy::InferenceModel model(a.checkpoint, io);
  // Numbered names stand for any of the same count: a checkpoint from before its data's classes were named.
  const bool names_differ = model.has_class_names() && model.class_names() != ds->classes() &&
                            !(data::unnamed_classes(model.class_names()) && model.class_names().size() == ds->num_classes());
  if (model.trained() && (model.has_class_names() ? names_differ
                                                  : model.num_classes() != static_cast<std::int64_t>(ds->num_classes()))) {
    throw Error(a.data + " has " + std::to_string(ds->num_classes()) + " classes that differ from the " +
                    std::to_string(model.num_classes()) + " the checkpoint was trained on",
                "evaluate on data with the same class folders");
  }
  const auto& arch = model.arch();
  const bool quantized = model.quantized();
  Preprocessing pre = model.preprocessing();
  if (a.crop_ratio > 0) pre.crop_ratio = a.crop_ratio;
  if (!a.interpolation.empty()) pre.interpolation = a.interpolation;

  data::PipelineOptions lo;
  lo.batch_size = a.batch_size;
  lo.workers = a.workers;
  lo.bad_images = a.bad_images;
  lo.max_image_pixels = a.max_image_pixels;
  const auto loader = runtime::make_eval_loader(ds, pre, lo);
  if (!a.json) {
    std::cout << "eval: " << arch.name << " from " << a.checkpoint << " on " << ds->description() << '\n'
              << "engine: " << model.describe_engine() << '\n';
  }
  const auto& engine = model.engine();
  runtime::EvalForward forward;
  forward.input = [&](const at::Tensor& pixels) { return engine.input(pixels); };
  forward.logits = [&](const at::Tensor& input) { return engine.logits_of_input(input); };
  forward.device = model.runtime().device;
  const bool per_class = a.per_class || !a.per_class_csv.empty();
  const auto r = runtime::evaluate(forward, *loader, a.top_k, a.json ? "" : "eval", 50, {}, per_class);
  const auto rows = runtime::per_class_results(r);
  const auto& names = ds->classes();
  if (!a.per_class_csv.empty()) write_file_atomically(a.per_class_csv, per_class_csv(r, rows, names));
  if (a.json) {
    auto j = r.to_dllogger("val");
    j["images"] = r.images;
    j["quantized"] = quantized;
    j["engine"] = model.engine_name();
    j["kernel_precisions"] = engine.kernel_precisions();
    j["precision"] = model.runtime().precision;
    if (per_class) {
      auto& list = j["per_class"] = nlohmann::ordered_json::array();
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto& x = rows[i];
        list.push_back({{"class", names[i]}, {"images", x.images}, {"top1", x.top1},
                        {"top" + std::to_string(r.k), x.topk}, {"precision", x.precision}, {"recall", x.recall},
                        {"f1", x.f1}});
      }
      // Rows: the true class; columns: the top-1 prediction (both in "per_class" order).
      nlohmann::ordered_json matrix = nlohmann::ordered_json::array();
      const auto n = static_cast<std::ptrdiff_t>(rows.size());
      const auto* m = r.confusion.data_ptr<std::int64_t>();
      for (std::ptrdiff_t i = 0; i < n; ++i) matrix.push_back(std::vector<std::int64_t>(m + i * n, m + (i + 1) * n));
      j["confusion"] = std::move(matrix);
    }
    std::cout << dump_json(j, 2) << '\n';
    return;
  }
  std::printf("images        %lld\n", static_cast<long long>(r.images));
  std::printf("top-1         %.2f %%\n", r.top1);
  std::printf("top-%-9lld %.2f %%\n", static_cast<long long>(r.k), r.topk);
  std::printf("loss          %.4f\n", r.loss);
  std::printf("images/s      %.1f (forward only %.1f)\n", r.total_ips, r.compute_ips);
  std::printf("latency ms    mean %.2f  p50 %.2f  p90 %.2f  p95 %.2f  p99 %.2f  (batch %lld)\n", r.latency_mean_ms,
              r.latency_p50_ms, r.latency_p90_ms, r.latency_p95_ms, r.latency_p99_ms,
              static_cast<long long>(a.batch_size));
  if (per_class) print_per_class(r, rows, names);
  if (!a.per_class_csv.empty()) std::printf("\nper-class results and confusion matrix: %s\n", a.per_class_csv.c_str());
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "Evaluate a checkpoint: top-1/top-k, loss, images/s, latency percentiles");
  auto a = std::make_shared<EvalArgs>();
  cmd->add_option("DATA", a->data, "validation data (a folder with val/, class folders, list file, IDX folder)")->required();
  cmd->add_option("--checkpoint", a->checkpoint, "training checkpoint or weights (safetensors)")->required();
  // -a/--model, -b, -j and --img-size: timm's validate.py (GPUNet's README), -a and -b DLE's too.
  auto& io = a->io;
  cmd->add_option("-a,--arch,--model", io.arch, "architecture, for plain weights files (timm's gpunet_0 spelling too)");
  cmd->add_option("--num-classes", io.num_classes,
                  "plain weights: the classifier's width, when the data has fewer classes (ImageNet weights on a "
                  "subset; default: the data's class count)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("-b,--batch-size", a->batch_size, "images per batch");
  cmd->add_option("-j,--workers", a->workers, "loader threads (0: one per CPU)")->check(CLI::Range(0, 4096));
  cmd->add_option("--top-k", a->top_k, "report top-k besides top-1 (capped at the class count)");
  cmd->add_option("--max-images", a->max_images, "evaluate only the first N images (0: all)");
  cmd->add_option("--image-size,--img-size", io.image_size, "crop size (default: the checkpoint's)");
  cmd->add_option("--crop-ratio", a->crop_ratio, "resize to size / ratio before the centre crop (default: the checkpoint's)");
  cmd->add_option("--interpolation", a->interpolation, "bilinear | bicubic (default: the checkpoint's)")
      ->check(CLI::IsMember(options::eval_interpolation.values));
  cmd->add_option("--bad-images", a->bad_images, options::bad_images.listed())->check(CLI::IsMember(options::bad_images.values));
  cmd->add_option("--max-image-pixels", a->max_image_pixels, codec::kMaxImagePixelsHelp)->check(CLI::NonNegativeNumber);
  add_inference_options(cmd, io);
  cmd->add_flag("--json", a->json, "print the metrics as JSON (DLLogger names)");
  cmd->add_flag("--per-class", a->per_class,
                "also each class's top-1/top-k, precision, recall and F1, the most confused pairs, and (--json) the "
                "confusion matrix");
  cmd->add_option("--per-class-csv", a->per_class_csv,
                  "write the per-class results and the confusion matrix to this CSV file (implies --per-class)");
  cmd->callback([a] { run(*a); });
}

}  // namespace convnets::cli
