// `convnets bench data`: images/s of a dataset through the loader (read, decode, transform, batching), with where the time goes.
#pragma once

#include "codec/image.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>

namespace convnets::bench {

struct DataBenchOptions {
  std::string location;  // an image folder, list file, IDX folder, or synthetic[:N]
  int workers = 0;       // decoding threads (0: one per CPU)
  int size = 224;
  bool eval = false;     // resize + centre crop instead of RandomResizedCrop + flip
  std::int64_t batch_size = 64;
  std::int64_t images = 2000;  // timed after the warm-up (the first batch per worker)
  int prefetch = 2;
  std::string dct_scaling = "auto";  // auto (train on, eval off) | on | off
  std::string bad_images = "skip";
  std::int64_t max_image_pixels = codec::kDefaultMaxImagePixels;
  std::uint64_t seed = 0;
  std::string backend = "cpu";  // gpu: the loader threads entropy-decode, the rest on CUDA where there is one
  std::string augment, interpolation = "bilinear";
  double reprob = 0;
  int crop_padding = 0;
  bool drop_last = false;
  int rank = 0, world_size = 1;
  std::string save_batches;  // every batch loaded written to this safetensors file, keyed images.EPOCH.BATCH
};

// Runs the loader until `images` images past the warm-up are timed. `say` gets the lines worth printing as they
// come (the set-up, each epoch's bad images); the result is the record `--json` prints.
nlohmann::ordered_json run_data_bench(const DataBenchOptions& options,
                                      const std::function<void(const std::string&)>& say);

// The record as the lines `bench data` prints at its end.
std::string format_data_bench(const nlohmann::ordered_json& record);

}  // namespace convnets::bench
