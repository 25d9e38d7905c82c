// What `bench train` and `bench infer` share: the model and timing options, a row's closing figures, the loop over batch sizes with its out-of-memory probe, and the opening of the table and of the JSON record.
#pragma once

#include "runtime/runtime.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace convnets::bench {

struct ModelBenchOptions {
  std::string arch = "resnet50";
  runtime::Runtime runtime;
  std::vector<std::int64_t> batch_sizes{256};
  int image_size = 0;  // 0: the arch's own input size
  std::int64_t num_classes = 1000;
  int warmup = 10, iterations = 50;
  bool cuda_graph = true;  // training: whole-step capture; inference: a CUDA graph per batch size (deploy/graph_engine.h)
};

// The figures every row has, whichever verb timed it.
struct BenchRow {
  std::int64_t batch = 0;
  bool fits = true;
  std::int64_t largest_fitting = 0;  // set when it does not fit (0: not even batch 1)
  double peak_memory_mb = 0;  // CUDA: the most the caching allocator held allocated during the row (warm-up included)
  double images_per_s = 0;
  double mean_ms = 0;  // per iteration (a step, or a forward)
};

// True for an allocation failure of the CPU or CUDA allocator.
bool is_out_of_memory(const std::exception& e);
// The allocators' cached memory given back, so that an out-of-memory probe that failed leaves nothing held.
void release_cached_memory();
// The side of the images timed: --image-size, else the arch's own.
int input_size(const ModelBenchOptions& options);
// --batch-sizes and --iterations as a row needs them; `by_name`: the arch is a registry name (not a checkpoint's).
void check_model_bench(const ModelBenchOptions& options, bool by_name);

// One row per batch size from `measure(batch, warmup, iterations)`. A batch that does not fit yields fits = false
// and the largest batch that does: bisection between the last that fitted and it, one iteration a probe.
template <typename Row>
std::vector<Row> rows_by_batch(const ModelBenchOptions& o, const std::function<Row(std::int64_t, int, int)>& measure) {
  std::vector<Row> rows;
  std::int64_t last_fit = 0;
  const auto fits = [&](std::int64_t batch) {
    try {
      measure(batch, 1, 1);
      release_cached_memory();
      return true;
    } catch (const std::exception& e) {
      if (!is_out_of_memory(e)) throw;
      release_cached_memory();
      return false;
    }
  };
  for (const auto batch : o.batch_sizes) {
    try {
      rows.push_back(measure(batch, o.warmup, o.iterations));
      last_fit = std::max(last_fit, batch);
      continue;
    } catch (const std::exception& e) {
      if (!is_out_of_memory(e)) throw;
    }
    release_cached_memory();
    Row row;
    row.batch = batch;
    row.fits = false;
    std::int64_t lo = last_fit < batch ? last_fit : 0, hi = batch;
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
    row.largest_fitting = lo;
    rows.push_back(row);
  }
  return rows;
}

// "convnets bench VERB: ARCH<source>, PRECISION<variant>, nhwc, 224x224, DEVICE, VERSIONS<engines>", a blank line.
std::string table_heading(const ModelBenchOptions& o, const std::string& verb, const std::string& source,
                          const std::string& variant, const std::string& engines);
// The record's fields either verb has (its machine, versions, model and timing), "rows" still to add.
nlohmann::ordered_json json_heading(const ModelBenchOptions& o, const std::string& mode);
// A row's shared figures into its JSON object.
void add_row_json(const ModelBenchOptions& o, const BenchRow& r, nlohmann::ordered_json& row);
// Milliseconds as the tables print them.
std::string ms(double v);

}  // namespace convnets::bench
