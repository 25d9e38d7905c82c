#include "bench/checkpoint_bench.h"

#include "core/stats.h"

#include "core/error.h"
#include "core/crc32c.h"
#include "io/safetensors.h"
#include "io/state_dict.h"
#include "models/registry.h"

#include <torch/torch.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>

namespace convnets::bench {
namespace {

// Where the timed checksums go, so that no compiler drops them.
volatile std::uint32_t sink = 0;

// The file's clean pages (it was fsynced) out of the page cache, so that the next read comes from the disk.
void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw SystemError("cannot open", path);
  const int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (rc != 0) throw Error("posix_fadvise(DONTNEED) failed on " + path + ": " + std::strerror(rc));
}

}  // namespace

CheckpointBenchResult bench_checkpoint(const CheckpointBenchOptions& o) {
  namespace fs = std::filesystem;
  ModelOptions mo;
  mo.num_classes = o.num_classes;
  auto model = build_model(find_architecture(o.arch), mo);
  // What `train` saves (train/run_outputs.cpp's save_run): the weights, their EMA and SGD's momentum, one buffer
  // per parameter; random values, so that no page is a zero page the file system could skip.
  NamedTensors tensors;
  for (auto& [k, t] : state_dict(*model)) tensors.emplace_back("model." + k, t);
  if (o.ema) {
    for (auto& [k, t] : state_dict(*model)) tensors.emplace_back("ema." + k, t.clone());
  }
  for (auto& p : model->named_parameters()) {
    tensors.emplace_back("optimizer.momentum." + p.key(), torch::randn_like(p.value()));
  }
  const fs::path folder = o.folder.empty() ? fs::temp_directory_path() : fs::path(o.folder);
  const auto stem = (folder / ("convnets-bench-checkpoint-" + std::to_string(::getpid()))).string();
  const std::string path = stem + ".safetensors", plain = stem + "-plain.safetensors";
  // The metadata save_checkpoint writes; its values are not read here.
  const std::map<std::string, std::string> meta = {{"convnets", "{}"}, {"format", "pt"}};

  CheckpointBenchResult r;
  r.tensors = static_cast<std::int64_t>(tensors.size());
  struct Remove {
    std::vector<std::string> paths;
    ~Remove() {
      std::error_code ignored;
      for (const auto& p : paths) fs::remove(p, ignored);
    }
  } remove{{path, plain}};
  auto timed = [](auto&& what) {
    const auto start = std::chrono::steady_clock::now();
    what();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  for (int i = -1; i < o.iterations; ++i) {
    // Alternated, each kind first in every other round, so that neither always meets the page cache, the disk or
    // the heap as the other left it.
    const bool summed_first = i % 2 == 0;
    double save = 0, save_plain = 0, load = 0, load_plain = 0;
    const auto save_summed = [&] { save = timed([&] { save_safetensors(path, tensors, meta); }); };
    const auto save_unsummed = [&] {
      save_plain = timed([&] { save_safetensors(plain, tensors, meta, FileChecksums::None); });
    };
    summed_first ? (save_summed(), save_unsummed()) : (save_unsummed(), save_summed());
    if (o.cold) evict(path), evict(plain);
    // Each load's tensors freed before the next one allocates.
    const auto load_summed = [&] { load = timed([&] { load_safetensors(path); }); };
    const auto load_unsummed = [&] { load_plain = timed([&] { load_safetensors(plain); }); };
    summed_first ? (load_summed(), load_unsummed()) : (load_unsummed(), load_summed());
    const double checksum = timed([&] {
      for (const auto& [name, t] : tensors) {
        sink = crc32c(t.data_ptr(), static_cast<std::size_t>(t.numel()) * t.element_size());
      }
    });
    if (i < 0) continue;  // the first round warms the page cache and the allocator
    r.save_ms.push_back(save);
    r.save_plain_ms.push_back(save_plain);
    r.load_ms.push_back(load);
    r.load_plain_ms.push_back(load_plain);
    r.checksum_ms.push_back(checksum);
  }
  r.file_bytes = fs::file_size(path);
  return r;
}

std::string format_checkpoint_bench(const CheckpointBenchOptions& o, const CheckpointBenchResult& r) {
  const double mb = r.file_bytes / 1e6, save = median(r.save_ms), save_plain = median(r.save_plain_ms),
               load = median(r.load_ms), load_plain = median(r.load_plain_ms), sum = median(r.checksum_ms);
  char text[512];
  std::string out;
  std::snprintf(text, sizeof text, "%s checkpoint (weights%s, SGD momentum): %lld tensors, %.1f MB, in %s, loaded from %s\n",
                o.arch.c_str(), o.ema ? ", EMA" : "", static_cast<long long>(r.tensors), mb,
                o.folder.empty() ? std::filesystem::temp_directory_path().c_str() : o.folder.c_str(),
                o.cold ? "the disk" : "the page cache");
  out += text;
  out += "| Round | Save (ms) | Save, no checksums | Load (ms) | Load, no checksums | One CRC-32C pass |\n"
         "|---:|---:|---:|---:|---:|---:|\n";
  for (std::size_t i = 0; i < r.save_ms.size(); ++i) {
    std::snprintf(text, sizeof text, "| %zu | %.1f | %.1f | %.1f | %.1f | %.1f |\n", i + 1, r.save_ms[i],
                  r.save_plain_ms[i], r.load_ms[i], r.load_plain_ms[i], r.checksum_ms[i]);
    out += text;
  }
  std::snprintf(text, sizeof text,
                "medians: save %.1f ms against %.1f (%+.1f %%), load %.1f ms against %.1f (%+.1f %%); one CRC-32C "
                "pass %.1f ms (%.1f GB/s)\n",
                save, save_plain, 100 * (save / save_plain - 1), load, load_plain, 100 * (load / load_plain - 1), sum,
                mb / sum);
  return out + text;
}

nlohmann::ordered_json to_json(const CheckpointBenchOptions& o, const CheckpointBenchResult& r) {
  return {{"tool", "convnets"},          {"mode", "checkpoint"},
          {"arch", o.arch},              {"num_classes", o.num_classes},
          {"ema", o.ema},                {"cold", o.cold},
          {"tensors", r.tensors},
          {"file_bytes", r.file_bytes},  {"save_ms", r.save_ms},
          {"save_plain_ms", r.save_plain_ms}, {"load_ms", r.load_ms},
          {"load_plain_ms", r.load_plain_ms}, {"checksum_ms", r.checksum_ms}};
}

}  // namespace convnets::bench
