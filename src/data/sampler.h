// Per-epoch sample order with torch.utils.data.DistributedSampler's semantics: seeded shuffle, padding, rank slicing.
#pragma once

#include <cstdint>
#include <vector>

namespace convnets::data {

struct ShardOptions {
  int rank = 0, world_size = 1;
  bool shuffle = true;
  std::uint64_t seed = 0;
  // DistributedSampler's drop_last: trim the tail so shards divide evenly
  // instead of padding with repeats from the start.
  bool drop_tail = false;
  // The unit dealt to ranks in turn: 1 deals samples (DistributedSampler);
  // a training loader deals whole batches, so that rank r's k-th batch is
  // global micro-batch k * world_size + r, the same images one process sees
  // as its (k * world_size + r)-th batch: data-parallel and accumulated runs
  // see the same micro-batches.
  std::int64_t block = 1;
  // false: neither pad nor trim; every sample lands on exactly one rank and
  // ranks may differ by one block (exact sharded evaluation).
  bool pad = true;
};

// The indices rank `rank` visits in `epoch`: torch.randperm(n) from a CPU
// generator seeded with seed + epoch (the same permutation Python draws),
// padded (or with drop_tail trimmed) to a multiple of world_size * block,
// then every world_size-th block from block `rank` on.
std::vector<std::int64_t> shard_indices(std::size_t n, const ShardOptions& o, std::int64_t epoch);

// How many indices each rank gets per epoch (DistributedSampler.num_samples);
// validates the options as shard_indices does.
std::size_t shard_size(std::size_t n, const ShardOptions& o);

}  // namespace convnets::data
