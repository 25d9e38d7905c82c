#include "io/safetensors.h"

#include "core/error.h"
#include "core/json.h"
#include "io/atomic_file.h"
#include "io/crc32c.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

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
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  throw Error("cannot store tensor '" + tensor + "' of dtype " + std::string(c10::toString(dtype)) +
              " in safetensors");
}

std::string hex32(std::uint32_t v) {
  char text[9];
  std::snprintf(text, sizeof text, "%08x", v);
  return text;
}

std::size_t bytes_of(const torch::Tensor& t) { return static_cast<std::size_t>(t.numel()) * t.element_size(); }

// CRC-32C of tensors on a thread of its own while the caller reads or writes the next ones: a checkpoint's
// checksums (about 25 GB/s a core with carry-less folding) then cost a second core's time instead of the save's
// or the load's; passes on the same thread, or chunks handed over as they are read, measured slower
// (docs/history/checkpoints.md). Below kThreadedBytes they are computed inline, where a thread costs more than it
// saves.
class Checksums {
 public:
  static constexpr std::size_t kThreadedBytes = std::size_t{8} << 20;

  explicit Checksums(std::size_t count, std::size_t total_bytes) : sums_(count) {
    if (total_bytes >= kThreadedBytes) worker_ = std::thread([this] { work(); });
  }
  ~Checksums() { finish(); }
  Checksums(const Checksums&) = delete;
  Checksums& operator=(const Checksums&) = delete;

  // Tensor `index`'s bytes, which must stay as they are until finish().
  void add(std::size_t index, const torch::Tensor& t) {
    if (!worker_.joinable()) {
      sums_[index] = crc32c(t.data_ptr(), bytes_of(t));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back({index, t.data_ptr(), bytes_of(t)});
    }
    ready_.notify_one();
  }

  // Every sum added, by index.
  const std::vector<std::uint32_t>& finish() {
    if (worker_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        done_ = true;
      }
      ready_.notify_one();
      worker_.join();
    }
    return sums_;
  }

 private:
  struct Job {
    std::size_t index;
    const void* data;
    std::size_t size;
  };

  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ready_.wait(lock, [this] { return !queue_.empty() || done_; });
      if (queue_.empty()) return;
      const Job job = queue_.front();
      queue_.pop_front();
      lock.unlock();
      sums_[job.index] = crc32c(job.data, job.size);  // each slot written once, read after join
      lock.lock();
    }
  }

  std::vector<std::uint32_t> sums_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Job> queue_;
  bool done_ = false;
  std::thread worker_;
};

// __metadata__'s kChecksumKey: {tensor name: its bytes' CRC-32C as 8 hex digits}. Every name must be the file's.
std::map<std::string, std::uint32_t> read_checksums(const std::string& text, const std::string& where) {
  const std::string key = where + ": __metadata__ " + kChecksumKey;
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

std::vector<std::string> dtype_names() {
  std::vector<std::string> names;
  for (const auto& d : kDtypes) names.emplace_back(d.name);
  return names;
}

}  // namespace

const torch::Tensor* TensorFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

TensorFile load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw SystemError("cannot open weights file", path);
  const auto file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  const std::string where = "safetensors file '" + path + "'";
  if (file_size < 8) {
    throw Error(where + " is " + std::to_string(file_size) + " bytes: too short for the 8-byte header length");
  }
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  if (header_len > kMaxHeader || header_len > file_size - 8) {
    throw Error(where + ": header length " + std::to_string(header_len) + " exceeds the file (" +
                    std::to_string(file_size) + " bytes)",
                "the file is truncated or not a safetensors file");
  }
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));

  const nlohmann::json j = parse_json(header, where + ": header");
  if (!j.is_object()) throw Error(where + ": header must be a JSON object");

  const uint64_t data_size = file_size - 8 - header_len;
  struct Entry {
    std::string name;
    torch::Dtype dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  TensorFile result;
  std::map<std::string, std::uint32_t> checksums;
  for (const auto& [name, info] : j.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) throw Error(where + ": __metadata__ must be an object of strings");
      for (const auto& [k, v] : info.items()) {
        if (!v.is_string()) throw Error(where + ": __metadata__ value '" + k + "' is not a string");
        // Consumed here: a caller that saves what it loaded gets checksums of what it saves, never stale ones.
        if (k == kChecksumKey) checksums = read_checksums(v.get<std::string>(), where);
        else result.metadata[k] = v.get<std::string>();
      }
      continue;
    }
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
    entries.push_back(std::move(e));
  }

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

  for (const auto& [name, sum] : checksums) {
    if (!j.contains(name) || name == "__metadata__") {
      throw Error(where + ": __metadata__ " + kChecksumKey + " names tensor '" + name + "', which the file does not hold");
    }
  }
  const auto data_start = static_cast<std::streamoff>(8 + header_len);
  Checksums read_sums(entries.size(), checksums.empty() ? 0 : data_size);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    auto& e = entries[i];
    auto tensor = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
    in.seekg(data_start + static_cast<std::streamoff>(e.begin));
    in.read(static_cast<char*>(tensor.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
    if (!in) throw SystemError("read failed in", path);
    if (checksums.count(e.name)) read_sums.add(i, tensor);
    result.tensors.emplace_back(e.name, std::move(tensor));
  }
  const auto& read = read_sums.finish();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto sum = checksums.find(entries[i].name);
    if (sum != checksums.end() && read[i] != sum->second) {
      throw Error(where + ", tensor '" + entries[i].name + "': its bytes do not match the CRC-32C written with them (" +
                      hex32(sum->second) + ", read " + hex32(read[i]) + ")",
                  "the file changed after it was written (a failing disk, an edit, a copy cut short): use another "
                  "copy of it");
    }
  }
  return result;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata, FileChecksums checksums) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = nullptr;  // first, as the reference writer puts it; filled once the checksums are known
  std::vector<torch::Tensor> payload;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__" || header.contains(name)) {
      throw Error("cannot save '" + path + "': duplicate or reserved tensor name '" + name + "'");
    }
    auto c = t.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(c.numel()) * c.element_size();
    header[name] = {{"dtype", dtype_to_name(c.scalar_type(), name)},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    payload.push_back(std::move(c));
  }
  // The checksums are computed while the data is written, and the header, whose 8-hex-digit fields have the same
  // length whatever their values, is written first with zeros and again once they are known.
  const bool summed = checksums == FileChecksums::Crc32c;
  Checksums written(payload.size(), summed ? offset : 0);  // no thread for a file without checksums
  if (summed) {
    for (std::size_t i = 0; i < payload.size(); ++i) written.add(i, payload[i]);
  }
  auto header_with = [&](const std::vector<std::uint32_t>& values) {
    auto meta = metadata;
    meta.erase(kChecksumKey);
    if (summed) {
      nlohmann::ordered_json sums = nlohmann::ordered_json::object();
      for (std::size_t i = 0; i < payload.size(); ++i) sums[tensors[i].first] = hex32(values[i]);
      meta[kChecksumKey] = dump_json(sums);
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
  for (const auto& t : payload) out.write(t.data_ptr(), bytes_of(t));
  if (summed) {
    const std::string h = header_with(written.finish());
    if (h.size() != blank.size()) throw Error("cannot save '" + path + "': its header changed length with its checksums");
    out.rewrite(8, h.data(), h.size());
  }
  out.commit();
}

}  // namespace convnets
