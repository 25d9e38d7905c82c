#include "bench/measurement.h"

#include "models/registry.h"
#include "runtime/runtime.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/cuda.h>
#include <torch/torch.h>

namespace convnets::bench {

using Clock = std::chrono::steady_clock;

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

Measurement::Measurement(const ModelBenchOptions& options, std::int64_t batch, bool build) : o(options) {
  const auto& rt = o.runtime;
  arch = build ? &find_architecture(o.arch) : nullptr;
  pre = arch ? arch->preprocessing : Preprocessing{};
  pre.input_size = input_size(o);
  if (build) {
    torch::manual_seed(0);  // every row times the same model
    ModelOptions mo;
    mo.num_classes = o.num_classes;
    model = build_model(*arch, mo);
    runtime::prepare_model(*model, rt);
  }
  const auto on_device = torch::TensorOptions().device(rt.device);
  images = torch::randint(0, 256, {batch, pre.input_size, pre.input_size, 3}, on_device.dtype(torch::kByte));
  labels = torch::randint(0, o.num_classes, {batch}, on_device.dtype(torch::kLong));
  // The row's own peak: a larger batch fits where a smaller peak at the same batch leaves room (issue 58).
  if (rt.device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(rt.device.index());
  row.batch = batch;
}

double Measurement::timed(int warmup, int iterations, bool sync_each, bool first_timed,
                          const std::function<void()>& iteration) {
  const auto& device = o.runtime.device;
  for (int i = 0; i < warmup; ++i) {
    const auto t0 = Clock::now();
    iteration();
    if (i == 0 && first_timed) {
      // The first step alone: what a second run's tuning cache shortens.
      synchronize(device);
      first_step_s = std::chrono::duration<double>(Clock::now() - t0).count();
    }
  }
  synchronize(device);
  const auto start = Clock::now();
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = Clock::now();
    iteration();
    if (sync_each) {
      synchronize(device);
      times_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
  }
  synchronize(device);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

BenchRow Measurement::finish(double seconds, int iterations) {
  const auto& rt = o.runtime;
  row.mean_ms = seconds * 1e3 / iterations;
  row.images_per_s = static_cast<double>(row.batch) * iterations / seconds;
  if (rt.device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(rt.device.index());
    const auto aggregate = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    row.peak_memory_mb = static_cast<double>(stats.allocated_bytes[aggregate].peak) / (1 << 20);
  }
  return row;
}

}  // namespace convnets::bench
