// `bench train --save-every N`: what a checkpoint saved mid-epoch costs the training steps around it, saved
// synchronously (as at an epoch's end) and in the background (--checkpoint-interval), against steps with no save.
#pragma once

#include "bench/train_bench.h"

#include <cstdint>
#include <string>
#include <vector>

namespace convnets::bench {

// One kind of block: `every` steps, the first of them followed by a save of this kind (none for "none").
struct SaveBlocks {
  std::string kind;                // none | sync | background
  std::vector<double> block_ms;    // each block's time, from its first step to its end; a background write is
                                   // waited for at the block's end, as the next save would wait for it
  std::vector<double> save_step_ms;  // the first step of each block with its save (the snapshot, in background)
  std::vector<double> other_ms;      // the block's other steps, each
  std::vector<double> waited_ms;     // background: the wait at the block's end for a write still running
};

struct SaveBenchResult {
  std::int64_t batch = 0;
  int image_size = 0;
  std::uint64_t file_bytes = 0;
  std::int64_t tensors = 0;
  std::vector<SaveBlocks> kinds;  // none, sync, background
  double write_s = 0;             // the last background write, start to rename
};

// Blocks of the three kinds in turn (none, sync, background, `options.saves` times), so that each kind meets the
// same machine; options.batch_sizes' first batch, synthetic data, the step `train` runs (options.train_step).
// Throws Error naming the folder when it cannot be written; the files are removed after.
SaveBenchResult bench_saves(const TrainBenchOptions& options);

// The kinds side by side, as `bench train --save-every` prints them; and the JSON of every block.
std::string format_save_bench(const TrainBenchOptions& options, const SaveBenchResult& result);
nlohmann::ordered_json to_json(const TrainBenchOptions& options, const SaveBenchResult& result);

}  // namespace convnets::bench
