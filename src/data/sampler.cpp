#include "data/sampler.h"

#include "core/error.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randperm.h>

#include <numeric>
#include <string>

namespace convnets::data {

namespace {

void check(std::size_t n, const ShardOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    throw Error("rank " + std::to_string(o.rank) + " is not in 0.." + std::to_string(o.world_size - 1) +
                " for world size " + std::to_string(o.world_size));
  if (o.block < 1) throw Error("shard block must be at least 1, got " + std::to_string(o.block));
  if (n == 0) throw Error("cannot shard an empty dataset");
  const std::size_t unit = static_cast<std::size_t>(o.world_size) * static_cast<std::size_t>(o.block);
  if (o.pad && o.drop_tail && n < unit)
    throw Error("dataset of " + std::to_string(n) + " samples is smaller than the world size " +
                std::to_string(o.world_size) + (o.block > 1 ? " x " + std::to_string(o.block) : std::string()) +
                ": every rank would get nothing");
}

// How many indices are dealt in all: n, or padded / trimmed to whole rounds.
std::size_t dealt(std::size_t n, const ShardOptions& o) {
  const std::size_t unit = static_cast<std::size_t>(o.world_size) * static_cast<std::size_t>(o.block);
  if (!o.pad) return n;
  if (o.drop_tail) return n / unit * unit;
  return (n + unit - 1) / unit * unit;
}

// Whether position k of the dealt order goes to `rank`.
bool mine(std::size_t k, const ShardOptions& o) {
  return (k / static_cast<std::size_t>(o.block)) % static_cast<std::size_t>(o.world_size) ==
         static_cast<std::size_t>(o.rank);
}

}  // namespace

std::size_t shard_size(std::size_t n, const ShardOptions& o) {
  check(n, o);
  const std::size_t total = dealt(n, o);
  const std::size_t unit = static_cast<std::size_t>(o.world_size) * static_cast<std::size_t>(o.block);
  const std::size_t b = static_cast<std::size_t>(o.block);
  std::size_t count = total / unit * b;  // whole rounds
  const std::size_t rest = total % unit;  // only without padding: a partial round
  const std::size_t start = static_cast<std::size_t>(o.rank) * b;
  if (rest > start) count += std::min(b, rest - start);
  return count;
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
  const std::size_t total = dealt(n, o);
  if (total > n) {  // pad by repeating from the start, as often as needed
    for (std::size_t k = 0, base = n; order.size() < total; ++k) order.push_back(order[k % base]);
  } else {
    order.resize(total);
  }
  std::vector<std::int64_t> out;
  out.reserve(per_rank);
  for (std::size_t k = 0; k < total; ++k) {
    if (mine(k, o)) out.push_back(order[k]);
  }
  return out;
}

}  // namespace convnets::data
