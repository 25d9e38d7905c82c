// Fuzz target: torch.save archives (the zip, data.pkl's pickle through the allow-list unpickler, storages and
// tensor views, a checkpoint's EMA and optimizer state) as `--fine-tune`, `--resume`, `export`, `classify` and
// convnets.load read PyTorch's own files.
#include "core/error.h"
#include "io/torch_save.h"

#include <cstddef>
#include <cstdint>

using namespace convnets;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const TorchSaveContents f = read_torch_save_bytes(data, size, "fuzz input");
    for (const auto& [name, t] : f.weights.tensors) (void)t.sum();  // every element a view claims is readable
    for (const auto& [name, t] : f.ema) (void)t.sum();
    for (const auto& [id, state] : f.optimizer_state)
      for (const auto& [name, t] : state) (void)t.sum();
  } catch (const Error&) {
  }
  return 0;
}
