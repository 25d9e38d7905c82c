// Fuzz target: WebDataset shards as convnets reads them: the tar header
// scanner (ustar, PAX, GNU long names), the DALI index parser, then a shard
// opened as a dataset with its samples loaded and its epoch order drawn.
#include "data/shards.h"
#include "fuzz_input.h"

#include <algorithm>

using namespace convnets;

namespace {
fuzz::MemFile shard("shard");
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Params p(data, size);
  const int mode = p.byte() % 3;
  try {
    if (mode == 0) {
      const std::uint8_t* d = p.data();
      const std::size_t n = p.size();
      const auto listing = data::tar::scan(
          [&](std::uint64_t off, void* buf, std::size_t len) {
            if (off >= n) return std::size_t(0);
            const std::size_t k = std::min<std::size_t>(len, n - off);
            std::copy(d + off, d + off + k, static_cast<std::uint8_t*>(buf));
            return k;
          },
          n, "fuzz.tar");
      for (const auto& m : listing.members)
        if (m.offset > n || m.size > n - m.offset) __builtin_trap();  // a member outside the archive
    } else if (mode == 1) {
      const std::uint64_t tar_size = p.u16() * 512ULL;
      (void)data::read_dali_index(std::string(reinterpret_cast<const char*>(p.data()), p.size()), "fuzz.idx", tar_size);
    } else {
      const int world = 1 + p.byte() % 3;
      const bool shuffle = p.byte() & 1;
      shard.write(p.data(), p.size());
      const auto ds = data::webdataset({shard.path()}, "fuzz");
      data::SampleData s;
      for (std::size_t i = 0; i < std::min<std::size_t>(ds->size(), 32); ++i) {
        (void)ds->name(i);
        try {
          ds->load(i, s);
        } catch (const Error&) {
        }
      }
      data::ShardOptions o;
      o.world_size = world, o.shuffle = shuffle;
      std::size_t total = 0;
      for (o.rank = 0; o.rank < world; ++o.rank) {
        const auto order = ds->epoch_order(o, 1);
        if (order.size() != ds->epoch_size(o)) __builtin_trap();
        for (auto i : order)
          if (i < 0 || std::size_t(i) >= ds->size()) __builtin_trap();
        total += order.size();
      }
      if (total < ds->size()) __builtin_trap();  // every sample has a rank
    }
  } catch (const Error&) {
  }
  return 0;
}
