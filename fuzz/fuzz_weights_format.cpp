// Fuzz target: telling a weights file's format from its bytes (safetensors' length prefix and JSON header, a zip
// holding data.pkl, the pre-1.6 pickle's magic), then reading it with the reader chosen, as every command's
// load_checkpoint does; the bytes through the in-memory detection as well, which must choose the same.
#include "core/error.h"
#include "fuzz_input.h"
#include "io/safetensors.h"
#include "io/torch_save.h"
#include "io/weights_format.h"

#include <cstdlib>

using namespace convnets;

namespace {
fuzz::MemFile file("weights");

// The format, or -1 where the bytes are refused.
int detected(const std::uint8_t* data, std::size_t size, const std::string& path, bool in_memory) {
  try {
    return static_cast<int>(in_memory ? weights_format(data, size, "fuzz input") : weights_format(path));
  } catch (const Error&) {
    return -1;
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = file.write(data, size);
  const int on_disk = detected(data, size, path, false);
  if (detected(data, size, path, true) != on_disk) std::abort();  // one decision, whatever holds the bytes
  try {
    if (on_disk == static_cast<int>(WeightsFormat::Safetensors)) {
      for (const auto& [name, t] : load_safetensors(path).tensors) (void)t.sum();
    } else if (on_disk == static_cast<int>(WeightsFormat::TorchSave)) {
      for (const auto& [name, t] : read_torch_save(path).weights.tensors) (void)t.sum();
    }
  } catch (const Error&) {
  }
  return 0;
}
