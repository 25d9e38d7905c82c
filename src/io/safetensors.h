// Reading and writing safetensors files: the weight format shared with PyTorch users.
#pragma once

#include <torch/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace convnets {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

struct TensorFile {
  NamedTensors tensors;  // in file (data offset) order
  std::map<std::string, std::string> metadata;

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

// The __metadata__ key under which save_safetensors records each tensor's
// CRC-32C (io/crc32c.h), as a JSON object {name: "8 hex digits"}: other
// readers ignore it; load_safetensors checks every tensor it names and throws
// Error naming the file and the first tensor whose bytes changed. Files
// without it (torchvision's, timm's, older convnets checkpoints) load as
// before. The key is not returned in TensorFile::metadata.
inline constexpr const char* kChecksumKey = "convnets.crc32c";

// Writes tensors in the given order with their checksums, atomically: a
// temporary file beside `path` is written, fsynced and renamed, so an
// existing file is either replaced whole or left untouched.
// FileChecksums::None writes none: `bench checkpoint` measures what they cost with it.
enum class FileChecksums { Crc32c, None };
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      FileChecksums checksums = FileChecksums::Crc32c);

}  // namespace convnets
