// Fuzz target: GPUNet definitions all the way to a network: validated, built
// and run forward (train and eval mode), sizes capped (32 channels, 32 px, 10
// layers) so each run takes milliseconds; whatever the validator accepts must
// build and run.
#include "core/error.h"
#include "core/json.h"
#include "fuzz_input.h"
#include "models/gpunet.h"

#include <torch/torch.h>

#include <cstdlib>
#include <string>

using namespace convnets;

namespace {

// Byte-level mutation of JSON text almost never yields a valid network (that
// is fuzz_json's job), so this target reads the bytes as a layer list: every
// input is well-formed JSON, most pass the validator, and the builder and the
// forward pass run on them. A few choices break the chain on purpose.
nlohmann::json definition_from(fuzz::Params& p) {
  const bool distill = p.byte() & 1;
  auto j = nlohmann::json::array();
  j.push_back({{"layer_type", "data"}, {"img_resolution", 8 + p.byte() % 25}, {"distill", distill}});
  const char* plain[] = {"head", "conv", "irb", "fused_irb", "tail"};
  const char* dist[] = {"head", "head_large", "irb", "fused_irb", "tail"};
  std::int64_t channels = 3;
  const int layers = 1 + p.byte() % 10;
  for (int i = 0; i < layers && p.size() > 0; ++i) {
    const std::uint8_t b = p.byte();
    const bool last = i == layers - 1;
    const std::string type = last ? "tail" : (distill ? dist : plain)[b % 4];
    nlohmann::json l{{"layer_type", type}};
    l["num_in_channels"] = (b & 0x80) && (b & 0x40) ? 1 + p.byte() % 32 : channels;  // mostly chained
    const std::int64_t out = 1 + p.byte() % 32;
    l["num_out_channels"] = out;
    l["kernel_size"] = 1 + 2 * (p.byte() % 4);
    l["stride"] = 1 + p.byte() % 3;
    const std::uint8_t e = p.byte();
    l["expansion"] = e & 1 ? double(1 + e % 6) : 1 + (e % 40) / 8.0;
    l["act"] = e & 2 ? "swish" : "relu";
    l["use_se"] = bool(e & 4);
    l["groups"] = 1 + p.byte() % 4;
    l["stage"] = i;
    if (type == "tail") l["num_classes"] = 1 + p.byte() % 100;
    channels = out;
    j.push_back(std::move(l));
  }
  return j;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool once = [] {
    torch::set_num_threads(1);
    return true;
  }();
  (void)once;
  fuzz::Params p(data, size);
  GpunetDefinition d;
  try {
    d = parse_gpunet(definition_from(p), "fuzz");
  } catch (const Error&) {
    return 0;
  }
  ModelOptions o;
  o.num_classes = 1 + size % 10;
  const Network net = make_gpunet(d, o);
  const int side = d.img_resolution;
  const auto x = torch::randn({2, 3, side, side});
  net->train();
  const auto y = net->forward(x);
  net->eval();
  const auto z = net->forward(x);
  if (y.sizes() != z.sizes() || y.size(0) != 2 || y.size(1) != o.num_classes) std::abort();
  // What the validator accepted, written and read back, is the same network.
  if (!(parse_gpunet(nlohmann::json::parse(dump_json(to_json(d))), "round trip") == d)) std::abort();
  return 0;
}
