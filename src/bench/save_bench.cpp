#include "bench/save_bench.h"

#include "core/stats.h"

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

SaveBenchResult bench_saves(const TrainBenchOptions& o) {
  namespace fs = std::filesystem;
  if (!o.train_step) throw Error("bench train --save-every: no training step was given (TrainBenchOptions::train_step)");
  if (o.save_every < 1) throw Error("--save-every must be at least 1, got " + std::to_string(o.save_every));
  if (o.batch_sizes.size() != 1) {
    throw Error("--save-every: give one --batch-sizes value, not " + std::to_string(o.batch_sizes.size()));
  }
  if (!o.data.empty()) throw Error("--save-every: times synthetic steps; leave --data out");
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

std::string format_save_bench(const TrainBenchOptions& o, const SaveBenchResult& r) {
  char text[512];
  std::snprintf(text, sizeof text,
                "%s at %d px, batch %lld, %s %s: a checkpoint of %lld tensors, %.1f MB (weights, SGD momentum), saved "
                "after the first step of each block of %d steps; %d blocks of each kind, in turn\n",
                o.arch.c_str(), r.image_size, static_cast<long long>(r.batch), o.runtime.device.str().c_str(),
                o.runtime.precision.c_str(), static_cast<long long>(r.tensors), r.file_bytes / 1e6, o.save_every,
                o.saves);
  std::string out = text;
  out += "| Save | Block (ms, median) | Over the block without a save (ms) | The save's step (ms, median) | "
         "Other steps (ms, median) | Waited at the block's end (ms, median) |\n|---|---:|---:|---:|---:|---:|\n";
  const double plain = median(r.kinds.front().block_ms);
  const auto cell = [](const std::vector<double>& v) {
    char value[32];
    std::snprintf(value, sizeof value, "%.1f", median(v));
    return v.empty() ? std::string("-") : std::string(value);
  };
  for (const auto& k : r.kinds) {
    std::snprintf(text, sizeof text, "| %s | %.1f | %+.1f | %s | %s | %s |\n", k.kind.c_str(), median(k.block_ms),
                  median(k.block_ms) - plain, cell(k.save_step_ms).c_str(), cell(k.other_ms).c_str(),
                  cell(k.waited_ms).c_str());
    out += text;
  }
  std::snprintf(text, sizeof text, "the last background write took %.1f ms from its start to its rename\n",
                r.write_s * 1e3);
  return out + text;
}

nlohmann::ordered_json to_json(const TrainBenchOptions& o, const SaveBenchResult& r) {
  nlohmann::ordered_json j = {{"tool", "convnets"}, {"mode", "train-save-every"}, {"arch", o.arch},
                              {"device", o.runtime.device.str()}, {"precision", o.runtime.precision},
                              {"batch", r.batch}, {"image_size", r.image_size}, {"save_every", o.save_every},
                              {"saves", o.saves}, {"tensors", r.tensors}, {"file_bytes", r.file_bytes},
                              {"background_write_ms", r.write_s * 1e3}};
  for (const auto& k : r.kinds) {
    j["kinds"][k.kind] = {{"block_ms", k.block_ms}, {"save_step_ms", k.save_step_ms}, {"other_ms", k.other_ms},
                          {"waited_ms", k.waited_ms}};
  }
  return j;
}

}  // namespace convnets::bench
