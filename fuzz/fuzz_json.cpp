// Fuzz target: every JSON document convnets reads from a user: the depth-limited
// parser, GPUNet definitions (validated, written back, read again to the same
// definition) and training recipes (applied to a config and validated).
#include "core/json.h"
#include "models/gpunet_def.h"
#include "train/config.h"

#include <cstdlib>

using namespace convnets;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  nlohmann::json j;
  try {
    j = parse_json(text, "fuzz.json");
  } catch (const Error&) {
    return 0;
  }
  (void)dump_json(j, 2);
  try {
    const GpunetDefinition d = parse_gpunet(j, "fuzz.json");
    // What convnets writes it must read back as the same network.
    if (!(parse_gpunet(nlohmann::json::parse(dump_json(to_json(d))), "round trip") == d)) std::abort();
  } catch (const Error&) {
  }
  try {
    train::TrainConfig c;
    train::apply_json(c, j, "fuzz recipe");
    train::validate(c);
    (void)dump_json(train::to_json(c));
  } catch (const Error&) {
  }
  return 0;
}
