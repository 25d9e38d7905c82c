#include "bench/save_bench.h"

#include "core/error.h"
#include "models/registry.h"
#include "runtime/background_save.h"
#include "runtime/checkpoint.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>

namespace convnets::bench {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

SaveBenchResult bench_saves(const ModelBenchOptions& o) {
  namespace fs = std::filesystem;
  if (!o.train_step) throw Error("bench train --save-every: no training step was given (ModelBenchOptions::train_step)");
  if (o.save_every < 1) throw Error("--save-every must be at least 1, got " + std::to_string(o.save_every));
  const auto& rt = o.runtime;
  const ArchInfo& arch = find_architecture(o.arch);
  Preprocessing pre = arch.preprocessing;
  pre.input_size = o.image_size > 0 ? o.image_size : pre.input_size;
  torch::manual_seed(0);
  ModelOptions mo;
  mo.num_classes = o.num_classes;
  Network model = build_model(arch, mo);
  runtime::prepare_model(*model, rt);
  const auto device_opts = torch::TensorOptions().device(rt.device);
  const std::int64_t batch = o.batch_sizes.front();
  const auto images = torch::randint(0, 256, {batch, pre.input_size, pre.input_size, 3}, device_opts.dtype(torch::kByte));
  const auto labels = torch::randint(0, o.num_classes, {batch}, device_opts.dtype(torch::kLong));
  const auto stepper = o.train_step(*model, rt, o);

  const fs::path folder = o.save_dir.empty() ? fs::temp_directory_path() : fs::path(o.save_dir);
  const auto path = (folder / ("convnets-bench-save-" + std::to_string(::getpid()) + ".safetensors")).string();
  struct Remove {
    std::string path;
    ~Remove() {
      std::error_code ignored;
      fs::remove(path, ignored);
    }
  } remove{path};
  // The keys `train` writes, with values of this bench's own.
  const nlohmann::json meta = {{"format", runtime::kCheckpointFormat}, {"arch", o.arch}, {"bench", "save-every"}};

  const auto sync = [&] {
    if (rt.device.is_cuda()) torch::cuda::synchronize();
  };
  const auto step = [&] { stepper->run(runtime::network_input(images, pre, rt), labels); };
  for (int i = 0; i < std::max(o.warmup, 1); ++i) step();
  sync();

  SaveBenchResult r;
  r.batch = batch;
  r.image_size = pre.input_size;
  for (const char* kind : {"none", "sync", "background"}) r.kinds.emplace_back().kind = kind;
  runtime::BackgroundSaver saver;
  for (int round = 0; round < o.saves; ++round) {
    for (auto& k : r.kinds) {
      const auto block_start = Clock::now();
      for (int s = 0; s < o.save_every; ++s) {
        const auto t0 = Clock::now();
        step();
        sync();
        if (s == 0 && k.kind == "sync") runtime::save_checkpoint(path, stepper->state(), meta);
        if (s == 0 && k.kind == "background") saver.save(path, stepper->state(), meta);
        (s == 0 && k.kind != "none" ? k.save_step_ms : k.other_ms).push_back(ms_since(t0));
      }
      if (k.kind == "background") {
        const auto t0 = Clock::now();
        saver.wait();
        k.waited_ms.push_back(ms_since(t0));
        r.write_s = saver.last_write_s();
      }
      k.block_ms.push_back(ms_since(block_start));
    }
  }
  const auto state = stepper->state();
  r.tensors = static_cast<std::int64_t>(state.size());
  r.file_bytes = fs::file_size(path);
  return r;
}

}  // namespace convnets::bench
