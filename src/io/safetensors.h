// Reading and writing safetensors files: the weight format shared with PyTorch users.
#pragma once

#include "core/error.h"

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace convnets {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

struct TensorFile {
  NamedTensors tensors;  // in file (data offset) order
  std::map<std::string, std::string> metadata;
  // What load_safetensors checked against the file's checksums: nothing (files from other writers), every tensor's
  // bytes (convnets before header checksums), or every tensor's bytes and header entry.
  enum class Verified { Nothing, Bytes, BytesAndHeader };
  Verified verified = Verified::Nothing;

  // nullptr when absent.
  const torch::Tensor* find(const std::string& name) const;
};

// Format: https://github.com/huggingface/safetensors — u64 little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {..}},
// then the tensor bytes. Dtypes F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
//
// Every malformed case (short file, header out of bounds, bad JSON, unknown
// dtype, offsets that disagree with shapes, overlaps or holes) throws
// convnets::Error naming the file and the tensor.
TensorFile load_safetensors(const std::string& path);

// The format's name of `dtype` ("F32", "BF16", "BOOL", ...), nullptr for one it cannot hold; and back.
const char* safetensors_dtype_name(torch::Dtype dtype);
std::optional<torch::Dtype> safetensors_dtype(const std::string& name);

// Reads `n` bytes at file offset `at` into `to` (throwing where it cannot).
using ReadAt = std::function<void(char* to, std::uint64_t n, std::uint64_t at)>;

// Whether a file of `file_size` bytes, read through `read`, has the structure of a safetensors file: an 8-byte
// little-endian header length within the file (and the reference library's 100 MB), then a JSON object of that
// length. The Error load_safetensors would throw for it when it has not (naming `name`), else nothing. What the
// header's entries say is load_safetensors' to check, naming each tensor.
std::optional<Error> safetensors_structure_problem(std::uint64_t file_size, const ReadAt& read,
                                                   const std::string& name);

// The __metadata__ keys under which save_safetensors records each tensor's CRC-32C (core/crc32c.h) as a JSON object
// {name: "8 hex digits"}: kChecksumKey of its bytes, kHeaderChecksumKey of its header entry (name, dtype, shape and
// data_offsets), so that a relabelled dtype or a changed shape is caught as a changed byte is. Other readers ignore
// them. load_safetensors checks every tensor against both and throws Error naming the file and the first tensor
// that differs, or that has no entry where the file holds the key (a file written with checksums has one for every
// tensor); kHeaderChecksumKey without kChecksumKey is refused. Files without either (torchvision's, timm's, the
// reference library's) load unchecked, files with kChecksumKey alone (convnets before header checksums) with their
// bytes checked. The keys are not returned in TensorFile::metadata.
inline constexpr const char* kChecksumKey = "convnets.crc32c";
inline constexpr const char* kHeaderChecksumKey = "convnets.crc32c.header";

// Writes tensors in the given order with their checksums, atomically: a
// temporary file beside `path` is written, fsynced and renamed, so an
// existing file is either replaced whole or left untouched.
// FileChecksums::None writes none: `bench checkpoint` measures what they cost with it.
enum class FileChecksums { Crc32c, None };
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      FileChecksums checksums = FileChecksums::Crc32c);

}  // namespace convnets
