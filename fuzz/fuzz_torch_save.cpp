// Fuzz target: torch.save archives (the zip, data.pkl's pickle through the allow-list unpickler, storages and
// tensor views) as `--fine-tune`, `export`, `classify` and convnets.load read PyTorch's own files.
#include "core/error.h"
#include "io/torch_save.h"

#include <cstddef>
#include <cstdint>

using namespace convnets;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const TensorFile f = load_torch_save_bytes(data, size, "fuzz input");
    for (const auto& [name, t] : f.tensors) (void)t.sum();  // every element a view claims is readable
  } catch (const Error&) {
  }
  return 0;
}
