// Which format a weights file is in (safetensors or torch.save's zip archive), told by validating its structure.
#pragma once

#include <cstddef>
#include <string>

namespace convnets {

enum class WeightsFormat { Safetensors, TorchSave };

// A file is safetensors when its 8-byte length prefix and JSON header parse as the format says, and a torch.save
// archive when PyTorch's own reader opens it as a zip holding data.pkl. Never by the first bytes alone: a
// safetensors file begins with its header's length, which can be any bytes (a header of 640 bytes begins 0x80
// 0x02, as a pickle does). torch.save's pre-1.6 pickle, whose first object is torch's magic number, is refused by
// name. Anything else throws Error naming `path`: the reason of the format its first bytes resemble (a zip's
// signature, else safetensors), and what else it is not.
WeightsFormat weights_format(const std::string& path);
// The same for bytes in memory, named `name` in errors.
WeightsFormat weights_format(const void* data, std::size_t size, const std::string& name);

}  // namespace convnets
