#include "bench/model_bench.h"

#include "core/compat.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/memory.h"
#include "deploy/engine.h"
#include "models/registry.h"

#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdio>
#include <new>

namespace convnets::bench {
namespace {

std::string device_description(const c10::Device& device) {
  if (device.is_cuda()) return device.str() + " (" + at::cuda::getCurrentDeviceProperties()->name + ")";
  return device.str() + " (" + std::to_string(at::get_num_threads()) + " threads)";
}

}  // namespace

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

void release_cached_memory() {
  // Without this the trimmed-never heap (core/memory.h) keeps the failed
  // attempt's pages and the bisection under-reports what fits.
  release_host_memory();
  c10::cuda::CUDACachingAllocator::emptyCache();
}

int input_size(const ModelBenchOptions& o) {
  return o.image_size > 0 ? o.image_size : find_architecture(o.arch).preprocessing.input_size;
}

void check_model_bench(const ModelBenchOptions& o, bool by_name) {
  if (by_name) find_architecture(o.arch);  // a bad name fails before any work
  if (o.batch_sizes.empty()) throw Error("--batch-sizes: expected at least one batch size");
  for (auto b : o.batch_sizes) {
    if (b < 1) throw Error("--batch-sizes: " + std::to_string(b) + " is not a batch size (expected >= 1)");
  }
  if (o.iterations < 1) throw Error("--iterations: expected >= 1");
}

std::string table_heading(const ModelBenchOptions& o, const std::string& verb, const std::string& source,
                          const std::string& variant, const std::string& engines) {
  const auto& rt = o.runtime;
  const int size = input_size(o);
  return "convnets bench " + verb + ": " + o.arch + source + ", " + rt.precision + variant + ", " +
         (rt.channels_last ? "nhwc" : "nchw") + ", " + std::to_string(size) + "x" + std::to_string(size) + ", " +
         device_description(rt.device) + ", " + compat::engine_versions() + engines + "\n\n";
}

nlohmann::ordered_json json_heading(const ModelBenchOptions& o, const std::string& mode) {
  const auto& rt = o.runtime;
  return {{"tool", "convnets"},
          {"mode", mode},
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
          {"openvino_version", deploy::openvino_version()},
          {"cpu_bf16", cpu_bf16_instructions()}};
}

void add_row_json(const ModelBenchOptions& o, const BenchRow& r, nlohmann::ordered_json& row) {
  row["batch"] = r.batch;
  row["fits"] = r.fits;
  if (!r.fits) {
    row["largest_fitting"] = r.largest_fitting;
    return;
  }
  row["images_per_s"] = r.images_per_s;
  row["mean_ms"] = r.mean_ms;
  if (o.runtime.device.is_cuda()) row["peak_memory_mb"] = r.peak_memory_mb;
}

std::string ms(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

}  // namespace convnets::bench
