// Flags several commands take with the same spelling and check: --precision and --key-layout.
#include "cli/commands.h"
#include "core/options.h"

#include <CLI/CLI.hpp>

#include <cctype>
#include <string>

namespace convnets::cli {

CLI::Option* add_precision_option(CLI::App* cmd, std::string& target) {
  return cmd->add_option("--precision", target, options::precision.listed() + " (any case: DLE's AMP, FP32)")
      ->transform([](std::string value) {
        for (auto& c : value) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (value == "fp16") {
          throw CLI::ValidationError("FP16 (pure fp16 weights) is not offered; --precision amp runs fp16 "
                                     "compute with fp32 weights, DLE's AMP");
        }
        if (!options::precision.allows(value)) {
          throw CLI::ValidationError(value + ": expected " + options::precision.listed());
        }
        return value;
      });
}

CLI::Option* add_key_layout_option(CLI::App* cmd, std::string& target) {
  return cmd
      ->add_option("--key-layout", target,
                   "how a plain weights file names its tensors: " + options::key_layout.listed() +
                       " (auto: the arch's layout most of them fit; torchvision = timm's ResNets; dle: DLE's "
                       "ResNets, layers.N; gpunet: DLE's GPUNets)")
      ->check(CLI::IsMember(options::key_layout.values));
}

}  // namespace convnets::cli
