#include "io/safetensors.h"

#include "core/error.h"
#include "core/json.h"
#include "io/atomic_file.h"
#include "core/crc32c.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <tuple>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace convnets {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors stores little-endian data");

// The reference implementation refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeader = 100'000'000;

struct DtypeName {
  const char* name;
  torch::Dtype dtype;
};
constexpr DtypeName kDtypes[] = {
    {"F64", torch::kFloat64}, {"F32", torch::kFloat32}, {"F16", torch::kFloat16}, {"BF16", torch::kBFloat16},
    {"I64", torch::kInt64},   {"I32", torch::kInt32},   {"I16", torch::kInt16},   {"I8", torch::kInt8},
    {"U8", torch::kUInt8},    {"BOOL", torch::kBool},
};

std::string dtype_to_name(torch::Dtype dtype, const std::string& tensor) {
  if (const char* name = safetensors_dtype_name(dtype)) return name;
  throw Error("cannot store tensor '" + tensor + "' of dtype " + std::string(c10::toString(dtype)) +
              " in safetensors");
}

std::string hex32(std::uint32_t v) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", v);
  return text;
}

std::size_t bytes_of(const torch::Tensor& t) { return static_cast<std::size_t>(t.numel()) * t.element_size(); }

// Tensor bytes move between the file and memory through page-aligned buffers of kChunk bytes (L2-sized), a chunk
// at a time, each chunk ending at a multiple of kChunk in the file and lying at its file offset modulo kChunk in
// its buffer:
// - The kernel's copy between the page cache and memory then meets its source and destination at one alignment.
//   Straight into the tensors, its speed depended on where each allocation fell against the tensor's file offset
//   modulo 4096: 23 to 55 ms for the same 307 MB (docs/history/checkpoints.md).
// - The copy between a buffer and a tensor is crc32c_copy where the file carries checksums: the checksum then
//   reads no byte from memory a second time. A separate pass, on this thread or another, cost a save 3-9 % and a
//   load from the page cache 15-45 %.
constexpr std::size_t kChunk = std::size_t{1} << 20;

// `count` page-aligned buffers of kChunk bytes.
class Chunks {
 public:
  explicit Chunks(std::size_t count)
      : data_(static_cast<char*>(std::aligned_alloc(4096, count * kChunk)), &std::free), count_(count) {
    if (data_ == nullptr) throw std::bad_alloc();
  }
  // Where the byte at `file_offset` lies in the buffer that the `index`-th chunk uses.
  char* at(std::size_t index, std::uint64_t file_offset) {
    return data_.get() + index % count_ * kChunk + file_offset % kChunk;
  }
  // The file offset at which the chunk holding `file_offset` ends.
  static std::uint64_t end_of(std::uint64_t file_offset) { return (file_offset / kChunk + 1) * kChunk; }

 private:
  std::unique_ptr<char, void (*)(void*)> data_;
  std::size_t count_;
};

// `n` bytes from `from` to `to`, continuing *crc over them when there is one.
void copy(char* to, const char* from, std::size_t n, std::uint32_t* crc) {
  if (crc != nullptr) *crc = crc32c_copy(to, from, n, *crc);
  else std::memcpy(to, from, n);
}

// A file read through one descriptor (its header and its data from the same file, whatever is renamed over the
// path meanwhile), and its bytes from `begin` to `end` handed out in order by stream() and take(). A thread of its
// own reads the chunks up to kAhead ahead while the caller copies them out: a ResNet-50 checkpoint from the page
// cache then loads in 21-28 ms instead of 34-36 on one thread, the kernel's copy into the buffers and the copy out
// of them overlapping.
class ChunkReader {
 public:
  static constexpr std::size_t kAhead = 4;

  explicit ChunkReader(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw SystemError("cannot open weights file", path);
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      ::close(fd_);
      throw SystemError("cannot stat weights file", path, err);
    }
    size_ = static_cast<std::uint64_t>(st.st_size);
  }
  ~ChunkReader() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    if (ahead_.joinable()) ahead_.join();
    ::close(fd_);
  }
  ChunkReader(const ChunkReader&) = delete;
  ChunkReader& operator=(const ChunkReader&) = delete;

  std::uint64_t size() const { return size_; }

  // `n` bytes from file offset `at`.
  void read_exactly(char* to, std::uint64_t n, std::uint64_t at) {
    for (const std::uint64_t end = at + n; at < end;) {
      const ssize_t r = ::pread(fd_, to, end - at, static_cast<off_t>(at));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw SystemError("read failed in", path_);
      if (r == 0) {
        throw Error("safetensors file '" + path_ + "' ended at byte " + std::to_string(at) + " while it was read",
                    "another process truncated it");
      }
      at += static_cast<std::uint64_t>(r), to += r;
    }
  }

  // take() hands out the bytes from `begin` to `end` from here on. Once only.
  void stream(std::uint64_t begin, std::uint64_t end) {
    begin_ = begin, end_ = end;
    count_ = end > begin ? (end - 1) / kChunk - begin / kChunk + 1 : 0;
    chunks_ = std::make_unique<Chunks>(count_ > kAhead ? kAhead : 1);
    if (count_ > kAhead) ahead_ = std::thread([this] { read_ahead(); });  // smaller files: a thread costs more
  }

  // The next `n` bytes, into `to`.
  void take(char* to, std::size_t n, std::uint32_t* crc) {
    while (n > 0) {
      if (left_ == 0) next();
      const std::size_t k = std::min<std::uint64_t>(n, left_);
      copy(to, chunks_->at(current_, pos_), k, crc);
      to += k, n -= k, pos_ += k, left_ -= k;
    }
  }

 private:
  std::uint64_t first(std::size_t index) const { return std::max(begin_, (begin_ / kChunk + index) * kChunk); }
  std::uint64_t last(std::size_t index) const { return std::min(end_, (begin_ / kChunk + index + 1) * kChunk); }
  void read(std::size_t index) {
    read_exactly(chunks_->at(index, first(index)), last(index) - first(index), first(index));
  }

  void read_ahead() {
    for (std::size_t index = 0; index < count_; ++index) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || index < used_ + kAhead; });  // its buffer's last chunk used
        if (stop_) return;
      }
      std::exception_ptr failed;
      try {
        read(index);
      } catch (...) {
        failed = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (failed) error_ = failed;
        else ++read_;
      }
      changed_.notify_all();
      if (failed) return;
    }
  }

  // The current chunk is used up: on to the next.
  void next() {
    if (started_) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++used_;
      }
      changed_.notify_all();
      ++current_;
    }
    started_ = true;
    if (!ahead_.joinable()) {
      read(current_);
    } else {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return read_ > current_ || error_; });
      if (read_ <= current_) std::rethrow_exception(error_);
    }
    pos_ = first(current_);
    left_ = last(current_) - pos_;
  }

  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0, begin_ = 0, end_ = 0;
  std::size_t count_ = 0;
  std::unique_ptr<Chunks> chunks_;
  std::size_t current_ = 0;
  bool started_ = false;
  std::uint64_t pos_ = 0, left_ = 0;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::size_t read_ = 0, used_ = 0;  // chunks read ahead and used up, under mutex_
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread ahead_;
};

// Bytes written to an AtomicFile from file offset `begin` on, a chunk at a time through one buffer: a thread that
// wrote while the next chunk was copied would overlap what a load's does, but a save waits on the disk.
class ChunkWriter {
 public:
  ChunkWriter(AtomicFile& out, std::uint64_t begin) : out_(out), chunk_(1), start_(begin), pos_(begin) {}

  void put(const char* from, std::size_t n, std::uint32_t* crc) {
    while (n > 0) {
      const std::size_t k = std::min<std::uint64_t>(n, Chunks::end_of(start_) - pos_);
      copy(chunk_.at(0, pos_), from, k, crc);
      from += k, n -= k, pos_ += k;
      if (pos_ == Chunks::end_of(start_)) flush();
    }
  }
  void flush() {
    out_.write(chunk_.at(0, start_), pos_ - start_);
    start_ = pos_;
  }

 private:
  AtomicFile& out_;
  Chunks chunk_;
  std::uint64_t start_, pos_;
};

// A __metadata__ checksum map (kChecksumKey, kHeaderChecksumKey): {tensor name: CRC-32C as 8 hex digits}.
std::map<std::string, std::uint32_t> read_checksums(const std::string& text, const std::string& where,
                                                    const std::string& which) {
  const std::string key = where + ": __metadata__ " + which;
  const nlohmann::json j = parse_json(text, key);
  if (!j.is_object()) throw Error(key + " must be a JSON object of tensor names and 8-hex-digit CRC-32C values");
  std::map<std::string, std::uint32_t> sums;
  for (const auto& [name, v] : j.items()) {
    const std::string s = v.is_string() ? v.get<std::string>() : "";
    if (s.size() != 8 || s.find_first_not_of("0123456789abcdef") != std::string::npos) {
      throw Error(key + ": tensor '" + name + "' has " + v.dump() + ", expected 8 lower-case hex digits");
    }
    sums[name] = static_cast<std::uint32_t>(std::stoul(s, nullptr, 16));
  }
  return sums;
}

// What kHeaderChecksumKey sums for a tensor: its header entry, every field, in one canonical spelling (the JSON's
// own spelling can change with spaces and key order without changing what it says).
std::string entry_text(const std::string& name, const std::string& dtype, const std::vector<std::int64_t>& shape,
                       std::uint64_t begin, std::uint64_t end) {
  std::string text = name;
  text += '\0';
  text += dtype;
  text += '\0';
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) text += ',';
    text += std::to_string(shape[i]);
  }
  text += '\0';
  return text + std::to_string(begin) + "," + std::to_string(end);
}

std::uint32_t entry_checksum(const std::string& text) { return crc32c(text.data(), text.size()); }

std::vector<std::string> dtype_names() {
  std::vector<std::string> names;
  for (const auto& d : kDtypes) names.emplace_back(d.name);
  return names;
}

}  // namespace

const char* safetensors_dtype_name(torch::Dtype dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  return nullptr;
}

std::optional<torch::Dtype> safetensors_dtype(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.dtype;
  }
  return std::nullopt;
}

const torch::Tensor* TensorFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

namespace {

// The length prefix and the JSON object after it, or the Error naming `where` and what is wrong.
nlohmann::json parse_header(std::uint64_t file_size, const ReadAt& read, const std::string& where,
                            std::uint64_t* header_len) {
  if (file_size < 8) {
    throw Error(where + " is " + std::to_string(file_size) + " bytes: too short for the 8-byte header length");
  }
  std::uint64_t len = 0;
  read(reinterpret_cast<char*>(&len), 8, 0);
  if (len > kMaxHeader || len > file_size - 8) {
    throw Error(where + ": header length " + std::to_string(len) + " exceeds the file (" +
                    std::to_string(file_size) + " bytes)",
                "the file is truncated or not a safetensors file");
  }
  std::string header(len, '\0');
  read(header.data(), len, 8);
  nlohmann::json j = parse_json(header, where + ": header");
  if (!j.is_object()) throw Error(where + ": header must be a JSON object");
  *header_len = len;
  return j;
}

}  // namespace

std::optional<Error> safetensors_structure_problem(std::uint64_t file_size, const ReadAt& read,
                                                   const std::string& name) {
  std::uint64_t header_len = 0;
  try {
    parse_header(file_size, read, "safetensors file '" + name + "'", &header_len);
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

TensorFile load_safetensors(const std::string& path) {
  ChunkReader in(path);
  const uint64_t file_size = in.size();
  const std::string where = "safetensors file '" + path + "'";
  uint64_t header_len = 0;
  const nlohmann::json j = parse_header(
      file_size, [&](char* to, std::uint64_t n, std::uint64_t at) { in.read_exactly(to, n, at); }, where,
      &header_len);

  const uint64_t data_size = file_size - 8 - header_len;
  struct Entry {
    std::string name;
    torch::Dtype dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  TensorFile result;
  std::map<std::string, std::uint32_t> checksums, header_checksums;
  bool has_checksums = false, has_header_checksums = false;
  if (const auto meta = j.find("__metadata__"); meta != j.end()) {
    if (!meta->is_object()) throw Error(where + ": __metadata__ must be an object of strings");
    for (const auto& [k, v] : meta->items()) {
      if (!v.is_string()) throw Error(where + ": __metadata__ value '" + k + "' is not a string");
      // Consumed here: a caller that saves what it loaded gets checksums of what it saves, never stale ones.
      if (k == kChecksumKey) {
        checksums = read_checksums(v.get<std::string>(), where, k);
        has_checksums = true;
      } else if (k == kHeaderChecksumKey) {
        header_checksums = read_checksums(v.get<std::string>(), where, k);
        has_header_checksums = true;
      } else {
        result.metadata[k] = v.get<std::string>();
      }
    }
  }
  if (has_header_checksums && !has_checksums) {
    throw Error(where + ": __metadata__ holds " + kHeaderChecksumKey + " but not " + kChecksumKey +
                    ": the checksums of its tensors' bytes were removed",
                "the file was edited after it was written: use another copy of it");
  }
  for (const auto* map : {&checksums, &header_checksums}) {
    for (const auto& [name, sum] : *map) {
      if (!j.contains(name) || name == "__metadata__") {
        throw Error(where + ": __metadata__ " + (map == &checksums ? kChecksumKey : kHeaderChecksumKey) +
                    " names tensor '" + name + "', which the file does not hold");
      }
    }
  }
  for (const auto& [name, info] : j.items()) {
    if (name == "__metadata__") continue;
    const std::string t = where + ", tensor '" + name + "'";
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets")) {
      throw Error(t + ": expected an object with dtype, shape and data_offsets");
    }
    Entry e{name, torch::kFloat32, {}, 0, 0};
    const auto& dt = info["dtype"];
    const auto* match = dt.is_string() ? std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                                      [&](const DtypeName& d) { return dt == d.name; })
                                       : std::end(kDtypes);
    if (match == std::end(kDtypes)) {
      throw Error(t + ": unknown dtype " + dt.dump(), "supported dtypes: " + join(dtype_names()));
    }
    e.dtype = match->dtype;
    const auto& shape = info["shape"];
    if (!shape.is_array()) throw Error(t + ": shape must be an array");
    uint64_t numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned()) throw Error(t + ": shape " + shape.dump() + " must hold non-negative integers");
      const auto v = d.get<uint64_t>();
      if (v != 0 && numel > std::numeric_limits<uint64_t>::max() / v) throw Error(t + ": shape overflows");
      numel *= v;
      e.shape.push_back(static_cast<int64_t>(v));
    }
    const auto& off = info["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      throw Error(t + ": data_offsets must be [begin, end]");
    }
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    const uint64_t bytes = numel * c10::elementSize(e.dtype);
    if (e.begin > e.end || e.end > data_size) {
      throw Error(t + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                      "] lie outside the " + std::to_string(data_size) + "-byte data section",
                  "the file is truncated or its header is wrong");
    }
    if (e.end - e.begin != bytes) {
      throw Error(t + ": shape " + shape.dump() + " of " + match->name + " needs " + std::to_string(bytes) +
                  " bytes but data_offsets span " + std::to_string(e.end - e.begin));
    }
    // A file written with checksums has them for every tensor: one without is one whose entry was removed.
    for (const auto& [map, has, key] : {std::tuple{&checksums, has_checksums, kChecksumKey},
                                        std::tuple{&header_checksums, has_header_checksums, kHeaderChecksumKey}}) {
      if (has && !map->count(name)) {
        throw Error(t + ": no checksum in __metadata__ " + key + ", which holds one for every tensor of a file "
                        "written with checksums",
                    "the file was edited after it was written: use another copy of it");
      }
    }
    if (has_header_checksums) {
      const std::uint32_t written = header_checksums.at(name);
      const std::uint32_t now = entry_checksum(entry_text(name, match->name, e.shape, e.begin, e.end));
      if (now != written) {
        throw Error(t + ": its header entry (dtype " + match->name + ", shape " + shape.dump() + ", data_offsets [" +
                        std::to_string(e.begin) + ", " + std::to_string(e.end) +
                        "]) does not match the CRC-32C written with it (" + hex32(written) + ", now " + hex32(now) +
                        "): its dtype, shape or offsets changed after it was written",
                    "the file was edited after it was written: use another copy of it");
      }
    }
    entries.push_back(std::move(e));
  }
  result.verified = has_header_checksums ? TensorFile::Verified::BytesAndHeader
                    : has_checksums      ? TensorFile::Verified::Bytes
                                         : TensorFile::Verified::Nothing;

  // The data section must be tiled exactly: no overlap (two tensors aliasing
  // bytes) and no hole (bytes nobody owns), as the reference reader demands.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  for (const auto& e : entries) {
    if (e.begin != expected) {
      throw Error(where + ", tensor '" + e.name + "': data starts at byte " + std::to_string(e.begin) +
                  " but the previous tensor ends at " + std::to_string(expected) + " (overlap or hole)");
    }
    expected = e.end;
  }
  if (expected != data_size) {
    throw Error(where + ": tensors cover " + std::to_string(expected) + " of " + std::to_string(data_size) +
                " data bytes");
  }

  // The entries tile the data section in order, so the reads run straight through it.
  in.stream(8 + header_len, file_size);
  for (auto& e : entries) {
    auto tensor = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
    const auto sum = checksums.find(e.name);
    std::uint32_t read = 0;
    in.take(static_cast<char*>(tensor.data_ptr()), e.end - e.begin, sum == checksums.end() ? nullptr : &read);
    if (sum != checksums.end() && read != sum->second) {
      throw Error(where + ", tensor '" + e.name + "': its bytes do not match the CRC-32C written with them (" +
                      hex32(sum->second) + ", read " + hex32(read) + ")",
                  "the file changed after it was written (a failing disk, an edit, a copy cut short): use another "
                  "copy of it");
    }
    result.tensors.emplace_back(e.name, std::move(tensor));
  }
  return result;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata, FileChecksums checksums) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = nullptr;  // first, as the reference writer puts it; filled once the checksums are known
  std::vector<torch::Tensor> payload;
  std::vector<std::uint32_t> entry_sums;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__" || header.contains(name)) {
      throw Error("cannot save '" + path + "': duplicate or reserved tensor name '" + name + "'");
    }
    auto c = t.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(c.numel()) * c.element_size();
    const std::string dtype = dtype_to_name(c.scalar_type(), name);
    header[name] = {{"dtype", dtype}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    entry_sums.push_back(entry_checksum(entry_text(name, dtype, c.sizes().vec(), offset, offset + bytes)));
    offset += bytes;
    payload.push_back(std::move(c));
  }
  // The checksums are computed as the data is written, and the header, whose 8-hex-digit fields have the same
  // length whatever their values, is written first with zeros and again once they are known.
  const bool summed = checksums == FileChecksums::Crc32c;
  std::vector<std::uint32_t> sums(payload.size());
  auto header_with = [&](const std::vector<std::uint32_t>& values) {
    auto meta = metadata;
    meta.erase(kChecksumKey);
    meta.erase(kHeaderChecksumKey);
    if (summed) {
      nlohmann::ordered_json sums = nlohmann::ordered_json::object(), entries = nlohmann::ordered_json::object();
      for (std::size_t i = 0; i < payload.size(); ++i) {
        sums[tensors[i].first] = hex32(values[i]);
        entries[tensors[i].first] = hex32(entry_sums[i]);
      }
      meta[kChecksumKey] = dump_json(sums);
      meta[kHeaderChecksumKey] = dump_json(entries);
    }
    header["__metadata__"] = meta;
    std::string h = dump_json(header);
    // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
    h.append((8 - h.size() % 8) % 8, ' ');
    return h;
  };
  const std::string blank = header_with(std::vector<std::uint32_t>(payload.size(), 0));
  const uint64_t header_len = blank.size();

  AtomicFile out(path, 8 + header_len + offset);
  out.write(&header_len, 8);
  out.write(blank.data(), blank.size());
  ChunkWriter writer(out, 8 + header_len);
  for (std::size_t i = 0; i < payload.size(); ++i) {
    writer.put(static_cast<const char*>(payload[i].data_ptr()), bytes_of(payload[i]), summed ? &sums[i] : nullptr);
  }
  writer.flush();
  if (summed) {
    const std::string h = header_with(sums);
    if (h.size() != blank.size()) throw Error("cannot save '" + path + "': its header changed length with its checksums");
    out.rewrite(8, h.data(), h.size());
  }
  out.commit();
}

}  // namespace convnets
