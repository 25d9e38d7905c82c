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
};

// The indices rank `rank` visits in `epoch`: torch.randperm(n) from a CPU
// generator seeded with seed + epoch (the same permutation Python draws),
// padded to a multiple of world_size, then every world_size-th from rank.
std::vector<std::int64_t> shard_indices(std::size_t n, const ShardOptions& o, std::int64_t epoch);

// How many indices each rank gets per epoch (DistributedSampler.num_samples);
// validates the options as shard_indices does.
std::size_t shard_size(std::size_t n, const ShardOptions& o);

}  // namespace convnets::data
