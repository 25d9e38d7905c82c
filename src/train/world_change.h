// A resume on another number of processes: the checkpoint's images per optimizer step kept through the per-process
// batch and gradient accumulation (DLE's --optimizer-batch-size semantics), or the nearest split said aloud.
#pragma once

#include "train/config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace convnets::train {

// The per-process batch and micro-batches that carry `global` images a step over `world` processes, no micro-batch
// larger than `max_batch`: the fewest micro-batches of equal size that make `global` exactly, or, where none does
// (256 over 3 processes), the fewest that come nearest to it (2 of 43: 258), `exact` false.
struct BatchSplit {
  std::int64_t batch = 0, micro_batches = 0, global = 0;
  bool exact = false;
};
BatchSplit split_global_batch(std::int64_t global, std::int64_t max_batch, std::int64_t world);

// The images a step of the checkpoint whose metadata is `meta` trained: its record's images_per_step, or for a
// checkpoint written before it was recorded, its --optimizer-batch-size, else its batch times its world size.
std::int64_t checkpoint_images_per_step(const nlohmann::json& meta);

// Under --resume-batch recipe, when `world` differs from the world of the checkpoint whose metadata is `meta`:
// where this run's flags would change its images per step, sets c.batch_size and c.optimizer_batch_size to
// split_global_batch's; either way returns the start line that says what the processes were and are (and where the
// split is not exact, the images per step and LR it changes to). "" on the same world or under as-given.
std::string keep_images_per_step(TrainConfig& c, const nlohmann::json& meta, std::int64_t world);

}  // namespace convnets::train
