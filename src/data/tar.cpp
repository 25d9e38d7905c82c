#include "data/tar.h"

#include <algorithm>
#include <cstring>

namespace convnets::data::tar {

namespace {

// Field offsets and lengths of the ustar header (POSIX.1-1988, pax(1)).
constexpr std::size_t kName = 0, kNameLen = 100, kSize = 124, kSizeLen = 12, kChksum = 148, kChksumLen = 8,
                      kType = 156, kMagic = 257, kPrefix = 345, kPrefixLen = 155;

std::string at(const std::string& archive, std::uint64_t offset) {
  return archive + ": byte " + std::to_string(offset) + ": ";
}

// A NUL-terminated (or field-filling) string field.
std::string field(const std::uint8_t* h, std::size_t off, std::size_t len) {
  const auto* p = reinterpret_cast<const char*>(h + off);
  return std::string(p, strnlen(p, len));
}

// Octal digits (ustar), or base-256 when the first byte has its high bit set
// (GNU tar and Python's tarfile write sizes of 8 GiB and more that way).
// Returns an empty string on success, else what is wrong with the field.
std::string number(const std::uint8_t* f, std::size_t len, std::uint64_t& out) {
  out = 0;
  if (f[0] & 0x80) {
    if (f[0] == 0xff) return "is negative (base-256 with the sign bit set)";
    std::uint64_t v = f[0] & 0x7f;
    for (std::size_t k = 1; k < len; ++k) {
      if (v >> 55) return "is larger than 2^63";
      v = (v << 8) | f[k];
    }
    out = v;
    return {};
  }
  std::size_t k = 0;
  while (k < len && (f[k] == ' ' || f[k] == 0)) ++k;  // leading blanks; an all-blank field is 0
  bool digits = false;
  for (; k < len && f[k] >= '0' && f[k] <= '7'; ++k, digits = true) {
    if (out >> 60) return "is larger than 2^63";
    out = out * 8 + static_cast<std::uint64_t>(f[k] - '0');
  }
  for (; k < len; ++k)
    if (f[k] != ' ' && f[k] != 0) return digits ? "has a non-octal digit" : "is not an octal number";
  return {};
}

bool zero_block(const std::uint8_t* h) {
  return std::all_of(h, h + kBlock, [](std::uint8_t b) { return b == 0; });
}

// The header checksum: the sum of its bytes with the checksum field taken as
// spaces. Old tars summed signed chars; either sum is accepted, as GNU tar does.
bool checksum_ok(const std::uint8_t* h, std::uint64_t stored) {
  std::uint64_t u = 0;
  std::int64_t s = 0;
  for (std::size_t k = 0; k < kBlock; ++k) {
    const bool in_field = k >= kChksum && k < kChksum + kChksumLen;
    u += in_field ? ' ' : h[k];
    s += in_field ? ' ' : static_cast<signed char>(h[k]);
  }
  return stored == u || static_cast<std::int64_t>(stored) == s;
}

// PAX extended header records, "LEN key=value\n" each, LEN counting the
// whole record: returns the path and size they set (others are ignored).
void pax_records(const std::string& data, const std::string& where, std::string& path, std::uint64_t& size,
                 bool& has_size) {
  std::size_t pos = 0;
  while (pos < data.size()) {
    if (data[pos] == 0) break;  // NUL padding after the last record
    std::size_t len = 0, k = pos;
    while (k < data.size() && data[k] >= '0' && data[k] <= '9' && len < data.size()) len = len * 10 + (data[k++] - '0');
    if (k == pos || k >= data.size() || data[k] != ' ' || len <= k - pos + 1 || len > data.size() - pos ||
        data[pos + len - 1] != '\n')
      throw Error(where + "malformed PAX extended header record", "the shard is damaged; re-create it");
    const std::string record = data.substr(k + 1, pos + len - 1 - (k + 1));
    const std::size_t eq = record.find('=');
    if (eq == std::string::npos) throw Error(where + "PAX extended header record without '='");
    const std::string key = record.substr(0, eq), value = record.substr(eq + 1);
    if (key == "path") {
      path = value;
    } else if (key == "size") {
      std::uint64_t v = 0;
      if (value.empty() || value.size() > 19 || !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
        throw Error(where + "PAX size '" + value + "' is not a decimal number below 10^19");
      for (char c : value) v = v * 10 + static_cast<std::uint64_t>(c - '0');
      size = v, has_size = true;
    }
    pos += len;
  }
}

}  // namespace

Listing scan(const ReadAt& read, std::uint64_t file_size, const std::string& name) {
  Listing out;
  std::uint8_t h[kBlock];
  std::uint64_t pos = 0, first_header = 0;
  // Set by extended headers for the member that follows them.
  std::string long_name;
  std::uint64_t pax_size = 0;
  bool pending = false, has_pax_size = false;
  while (pos < file_size) {
    if (file_size - pos < kBlock || read(pos, h, kBlock) != kBlock) {
      out.truncated = true;
      break;
    }
    if (zero_block(h)) break;  // end of archive (Python's tarfile stops at the first one too)
    const std::string where = at(name, pos);
    std::uint64_t size = 0, chksum = 0;
    if (const std::string why = number(h + kChksum, kChksumLen, chksum); !why.empty() || !checksum_ok(h, chksum)) {
      throw Error(where + (pos == 0 ? "not a tar archive (the first header's checksum does not match)"
                                    : "tar header checksum mismatch: the archive is damaged here and nothing after it can be located"),
                  "re-create the shard (convnets pack, webdataset's ShardWriter or tar)");
    }
    if (const std::string why = number(h + kSize, kSizeLen, size); !why.empty())
      throw Error(where + "tar size field " + why, "the shard is damaged; re-create it");
    if (!pending) first_header = pos;
    const char type = static_cast<char>(h[kType]);
    const std::uint64_t data = pos + kBlock;
    const bool extended = type == 'x' || type == 'L' || type == 'g' || type == 'K';
    if (has_pax_size && !extended) size = pax_size;  // PAX's size overrides the next member's field
    const bool fits = size <= file_size - data;

    if (extended) {
      if (size > kMaxExtendedHeaderBytes)
        throw Error(where + std::string(type == 'L' || type == 'K' ? "GNU long-name record" : "PAX extended header") +
                        " of " + std::to_string(size) + " bytes; at most " + std::to_string(kMaxExtendedHeaderBytes) +
                        " are accepted",
                    "the shard is damaged; re-create it");
      if (!fits) {
        out.truncated = true;
        break;
      }
      std::string text(static_cast<std::size_t>(size), '\0');
      if (size && read(data, text.data(), text.size()) != text.size()) {
        out.truncated = true;
        break;
      }
      if (type == 'x') {
        std::string path;
        pax_records(text, where, path, pax_size, has_pax_size);
        if (!path.empty()) long_name = path;
        pending = true;
      } else if (type == 'L') {
        long_name = text.substr(0, strnlen(text.data(), text.size()));
        pending = true;
      }
      // 'g' (global PAX) and 'K' (GNU long link target) change nothing a sample needs.
      pos = data + size + padding(size);
      continue;
    }

    std::string member = long_name;
    if (member.empty()) {
      member = field(h, kName, kNameLen);
      // POSIX ustar ("ustar\0") splits long names into prefix/name; GNU's
      // "ustar  " keeps other fields in those bytes.
      if (std::memcmp(h + kMagic, "ustar\0", 6) == 0) {
        const std::string prefix = field(h, kPrefix, kPrefixLen);
        if (!prefix.empty()) member = prefix + "/" + member;
      }
    }
    long_name.clear();
    pending = has_pax_size = false;
    const bool regular = type == '0' || type == '\0' || type == '7';
    if (!fits) {
      if (regular) out.skipped.push_back(member + ": cut short by the end of the archive (" + std::to_string(size) +
                                         " bytes promised, " + std::to_string(file_size - data) + " left)");
      out.truncated = true;
      break;
    }
    if (regular) {
      if (size > kMaxMemberBytes) {
        out.skipped.push_back(member + ": " + std::to_string(size) + " bytes, above the " +
                              std::to_string(kMaxMemberBytes >> 20) + " MiB a member may have");
      } else {
        out.members.push_back({member, first_header, data, size});
      }
    } else if (type != '5') {
      const char* what = type == '1'   ? "a hard link"
                         : type == '2' ? "a symbolic link"
                         : type == '3' || type == '4' ? "a device"
                         : type == '6' ? "a FIFO"
                                       : "an entry of an unsupported tar type";
      out.skipped.push_back(member + ": " + what + ", not a file");
    }
    // Links, devices and directories carry no data; their size field is
    // still honoured as the stride, as tar(1) does.
    pos = data + size + padding(size);
  }
  return out;
}

void ustar_header(const std::string& name, std::uint64_t size, std::uint8_t out[kBlock]) {
  std::memset(out, 0, kBlock);
  std::string prefix, base = name;
  if (name.size() > kNameLen) {
    // Split at the last '/' that leaves both parts in their fields.
    std::size_t cut = std::string::npos;
    for (std::size_t k = name.find('/'); k != std::string::npos; k = name.find('/', k + 1))
      if (k <= kPrefixLen && name.size() - k - 1 <= kNameLen && k > 0) cut = k;
    if (cut == std::string::npos)
      throw Error("tar member name '" + name + "' does not fit a ustar header (at most 100 bytes, or 155 + 100 split at a '/')");
    prefix = name.substr(0, cut), base = name.substr(cut + 1);
  }
  if (size > kMaxMemberBytes)
    throw Error("tar member '" + name + "' of " + std::to_string(size) + " bytes is above the " +
                std::to_string(kMaxMemberBytes >> 20) + " MiB a member may have");
  std::memcpy(out + kName, base.data(), base.size());
  std::memcpy(out + kPrefix, prefix.data(), prefix.size());
  auto octal = [&](std::size_t off, std::size_t len, std::uint64_t v) {
    // len - 1 digits, zero-filled, then NUL.
    for (std::size_t k = len - 1; k-- > 0; v >>= 3) out[off + k] = static_cast<std::uint8_t>('0' + (v & 7));
    out[off + len - 1] = 0;
  };
  octal(100, 8, 0644);  // mode
  octal(108, 8, 0);     // uid
  octal(116, 8, 0);     // gid
  octal(kSize, kSizeLen, size);
  octal(136, 12, 0);  // mtime
  out[kType] = '0';
  std::memcpy(out + kMagic, "ustar\0" "00", 8);
  octal(329, 8, 0);  // devmajor
  octal(337, 8, 0);  // devminor
  std::memset(out + kChksum, ' ', kChksumLen);
  std::uint64_t sum = 0;
  for (std::size_t k = 0; k < kBlock; ++k) sum += out[k];
  octal(kChksum, 7, sum);  // six digits, NUL, then the space already there
}

}  // namespace convnets::data::tar
