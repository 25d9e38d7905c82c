// `convnets pack`: a dataset written as WebDataset tar shards with DALI index files, each shard committed atomically.
#pragma once

#include "data/dataset.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace convnets::data {

struct PackOptions {
  std::string output;                              // the folder the shards go to
  std::uint64_t shard_size = std::uint64_t(256) << 20;  // bytes per shard, reached before a new one starts
  bool shuffle = false;                            // a seeded permutation, so that each shard mixes classes
  std::uint64_t seed = 0;
  std::function<void(const std::string&)> progress;  // one line per shard written
};

struct PackSummary {
  std::string split;
  std::vector<std::string> shards;  // paths, in order
  std::size_t samples = 0;
  std::uint64_t bytes = 0;  // of the .tar files
  std::vector<std::string> skipped;  // "NAME: why", one per source sample left out
};

// Writes `dataset` as OUTPUT/SPLIT-NNNNNN.tar: per sample KEY.cls (the label
// as decimal text) then KEY.jpg or KEY.png (the file's own bytes, never
// re-encoded; raw pixels such as IDX become PNG), KEY the sample's position
// in the written order; plus SPLIT-NNNNNN.idx for DALI. A shard is written to
// a temporary name and renamed when whole, its index after it, so an
// interrupted pack leaves only whole shards under final names. Source files
// that cannot be read or are no JPEG/PNG are skipped and listed.
PackSummary pack_split(const Dataset& dataset, const std::string& split, const PackOptions& options);

// OUTPUT/classes.txt: the class names, one per line, in label order.
void write_class_names(const std::vector<std::string>& classes, const std::string& output);

}  // namespace convnets::data
