#include "data/sampler.h"

#include "core/error.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randperm.h>

#include <numeric>
#include <string>

namespace convnets::data {

std::size_t shard_size(std::size_t n, const ShardOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    throw Error("rank " + std::to_string(o.rank) + " is not in 0.." + std::to_string(o.world_size - 1) +
                " for world size " + std::to_string(o.world_size));
  if (n == 0) throw Error("cannot shard an empty dataset");
  if (o.drop_tail && n < static_cast<std::size_t>(o.world_size))
    throw Error("dataset of " + std::to_string(n) + " samples is smaller than the world size " +
                std::to_string(o.world_size) + ": every rank would get nothing");
  const std::size_t w = static_cast<std::size_t>(o.world_size);
  std::size_t per_rank;
  if (o.drop_tail && n % w != 0) {
    per_rank = (n - w) / w + ((n - w) % w != 0);  // math.ceil((n - w) / w)
  } else {
    per_rank = (n + w - 1) / w;
  }
  return per_rank;
}

std::vector<std::int64_t> shard_indices(std::size_t n, const ShardOptions& o, std::int64_t epoch) {
  const std::size_t per_rank = shard_size(n, o);
  std::vector<std::int64_t> order(n);
  if (o.shuffle) {
    auto gen = at::detail::createCPUGenerator(o.seed + static_cast<std::uint64_t>(epoch));
    const at::Tensor perm = at::randperm(static_cast<std::int64_t>(n), gen, at::TensorOptions().dtype(at::kLong));
    const std::int64_t* p = perm.data_ptr<std::int64_t>();
    order.assign(p, p + n);
  } else {
    std::iota(order.begin(), order.end(), 0);
  }
  const std::size_t w = static_cast<std::size_t>(o.world_size);
  const std::size_t total = per_rank * w;
  if (total > n) {  // pad by repeating from the start, as often as needed
    for (std::size_t k = 0, base = n; order.size() < total; ++k) order.push_back(order[k % base]);
  } else {
    order.resize(total);
  }
  std::vector<std::int64_t> mine;
  mine.reserve(per_rank);
  for (std::size_t k = static_cast<std::size_t>(o.rank); k < total; k += w) mine.push_back(order[k]);
  return mine;
}

}  // namespace convnets::data
