// POSIX tar archives as WebDataset shards hold them: a bounds-checked member scanner (ustar, PAX and GNU long names) and the ustar header writer.
#pragma once

#include "core/error.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace convnets::data::tar {

constexpr std::size_t kBlock = 512;
// A member above this is refused before any of it is read: no image a
// decoder accepts (--max-image-pixels) comes near it, and a damaged size
// field must not turn into a gigabyte allocation per sample.
constexpr std::uint64_t kMaxMemberBytes = std::uint64_t(1) << 30;
// PAX extended headers and GNU long-name records hold a few short records;
// anything larger is damage, not a name.
constexpr std::uint64_t kMaxExtendedHeaderBytes = 64 * 1024;

struct Member {
  std::string name;          // the full member name (PAX path, GNU long name, or ustar prefix/name); never a path here
  std::uint64_t header = 0;  // offset of its header block (of its first extended header, if any)
  std::uint64_t offset = 0;  // offset of its data
  std::uint64_t size = 0;
};

struct Listing {
  std::vector<Member> members;  // regular files, in archive order
  // Members passed over, each "NAME: why" (a link, a device, a member cut
  // short by the end of the file, one above kMaxMemberBytes).
  std::vector<std::string> skipped;
  bool truncated = false;  // the file ends inside a header or a member's data
};

// Reads up to `size` bytes at `offset` into `buf`; returns how many it read
// (fewer only at the end of the file). Throws on an I/O error.
using ReadAt = std::function<std::size_t(std::uint64_t offset, void* buf, std::size_t size)>;

// Walks the headers of the `file_size`-byte archive `name` (read through
// `read`, data skipped, never followed as paths). A header that fails its
// checksum, a malformed or negative size field, an oversized extended header
// or a file that is no tar at all throws Error naming `name` and the byte
// offset: after such a header the rest of the archive cannot be located.
// Truncation keeps the members that are whole.
Listing scan(const ReadAt& read, std::uint64_t file_size, const std::string& name);

// The 512-byte ustar header of a regular file (mode 0644, owner 0, mtime 0,
// so that the same input packs to the same bytes). Names up to 100 bytes, or
// up to 256 split at a '/' into prefix and name; longer throws Error.
void ustar_header(const std::string& name, std::uint64_t size, std::uint8_t out[kBlock]);

// Bytes of zero padding after `size` bytes of data, to the next block.
inline std::size_t padding(std::uint64_t size) { return static_cast<std::size_t>((kBlock - size % kBlock) % kBlock); }

}  // namespace convnets::data::tar
