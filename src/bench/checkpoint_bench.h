// `bench checkpoint`: how long a training checkpoint of an arch takes to save and to load, with its checksums and
// without, so that what they cost is measured rather than estimated.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace convnets::bench {

struct CheckpointBenchOptions {
  std::string arch = "resnet50";
  std::int64_t num_classes = 1000;
  bool ema = true;      // the state `train --ema` saves: weights, EMA weights and SGD's momentum
  int iterations = 5;   // rounds timed (after one untimed), each saving and loading both files
  std::string folder;   // where the files are written ("": the system's temporary folder)
  // Each file's pages dropped from the page cache before it is loaded (posix_fadvise DONTNEED after its fsync):
  // a load from the disk, as a resume on another machine or after a reboot reads it. Otherwise from memory.
  bool cold = false;
};

struct CheckpointBenchResult {
  std::uint64_t file_bytes = 0;
  std::int64_t tensors = 0;
  // Each round's milliseconds: the file saved (write, fsync, rename) and loaded (read, and verify where it has
  // checksums) with its CRC-32C checksums and without, and one CRC-32C pass over the same bytes on one core.
  std::vector<double> save_ms, save_plain_ms, load_ms, load_plain_ms, checksum_ms;
};

// Throws Error naming the file when the folder cannot be written; the files are removed after.
CheckpointBenchResult bench_checkpoint(const CheckpointBenchOptions& options);

// The rounds' table and the medians' line, as `bench checkpoint` prints them; and its JSON record.
std::string format_checkpoint_bench(const CheckpointBenchOptions& options, const CheckpointBenchResult& result);
nlohmann::ordered_json to_json(const CheckpointBenchOptions& options, const CheckpointBenchResult& result);

}  // namespace convnets::bench
