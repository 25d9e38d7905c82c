// Fuzz target: safetensors files (header length, JSON header, dtypes, shapes,
// offsets) as `--resume`, `--fine-tune` and `export` read them.
#include "core/error.h"
#include "fuzz_input.h"
#include "io/safetensors.h"

using namespace convnets;

namespace {
fuzz::MemFile file("safetensors");
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const TensorFile f = load_safetensors(file.write(data, size));
    for (const auto& [name, t] : f.tensors) (void)t.sum();  // every byte the header claims is readable
  } catch (const Error&) {
  }
  return 0;
}
