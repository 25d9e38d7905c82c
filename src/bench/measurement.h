// What `bench train` and `bench infer` share for one row: a model of the arch built with seeded random weights, the synthetic uint8 batch on the device, the warm-up and the timed iterations, and the row's closing figures.
#pragma once

#include "bench/model_bench.h"
#include "models/registry.h"

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <vector>

namespace convnets::bench {

void synchronize(const c10::Device& device);

// One row's set-up and timing. A checkpoint (bench infer --checkpoint) brings its own network: `model` stays null
// and `arch` too (its arch may be a layer list it carries, with no registry name).
struct Measurement {
  Measurement(const ModelBenchOptions& options, std::int64_t batch, bool build_model);

  const ModelBenchOptions& o;
  const ArchInfo* arch = nullptr;
  Preprocessing pre;
  Network model;
  at::Tensor images, labels;  // the loader's uint8 NHWC batch on the device: each iteration pays its normalisation
  BenchRow row;
  std::vector<double> times_ms;  // each timed iteration, where `sync_each`
  double first_step_s = 0;       // the first warm-up iteration, synchronised, where `first_timed`

  // `warmup` iterations (the first one's seconds kept where `first_timed`), then `iterations` timed; each
  // synchronised where `sync_each` (latency), else one synchronisation at the end (throughput as training sees
  // it: the host runs ahead). The timed iterations' seconds.
  double timed(int warmup, int iterations, bool sync_each, bool first_timed, const std::function<void()>& iteration);
  // images/s from the seconds, and the device's peak memory over the row.
  BenchRow finish(double seconds, int iterations);
};

}  // namespace convnets::bench
