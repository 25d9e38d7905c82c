#include "io/safetensors.h"

#include "core/error.h"
#include "core/json.h"
#include "io/atomic_file.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
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
  for (const auto& [name, info] : j.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) throw Error(where + ": __metadata__ must be an object of strings");
      for (const auto& [k, v] : info.items()) {
        if (!v.is_string()) throw Error(where + ": __metadata__ value '" + k + "' is not a string");
        result.metadata[k] = v.get<std::string>();
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

  const auto data_start = static_cast<std::streamoff>(8 + header_len);
  for (auto& e : entries) {
    auto tensor = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
    in.seekg(data_start + static_cast<std::streamoff>(e.begin));
    in.read(static_cast<char*>(tensor.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
    if (!in) throw SystemError("read failed in", path);
    result.tensors.emplace_back(std::move(e.name), std::move(tensor));
  }
  return result;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
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
  std::string h = dump_json(header);
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  h.append((8 - h.size() % 8) % 8, ' ');
  const uint64_t header_len = h.size();

  AtomicFile out(path, 8 + header_len + offset);
  out.write(&header_len, 8);
  out.write(h.data(), h.size());
  for (const auto& t : payload) out.write(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  out.commit();
}

}  // namespace convnets
