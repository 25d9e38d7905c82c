// `convnets models`: list the registered archs, or inspect, load, save and run one of them.
#include "cli/commands.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "io/state_dict.h"
#include "models/layers.h"
#include "models/registry.h"
#include "runtime/checkpoint.h"
#include "train/asp.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>

namespace convnets::cli {
namespace {

struct ModelsArgs {
  std::string arch;
  std::optional<int64_t> num_classes;  // unset: a training checkpoint's count, else 1000
  std::string init = "fan_in";
  bool zero_init_residual = false;
  std::string weights, save, key_layout = "auto";
  bool forward = false;
  int64_t batch_size = 1;
  int input_size = 0;
  bool json = false;
  bool definition = false;
  bool sparsity = false;
  std::string forward_save;
  std::int64_t seed = 0;
};

std::string with_commas(int64_t n) {
  // Built front to back: GCC 12 at -O3 warns falsely (-Wstringop-overflow) about string::insert here.
  const std::string digits = std::to_string(n);
  std::string s;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0 && digits[i - 1] != '-') s += ',';
    s += digits[i];
  }
  return s;
}

void print_table(const std::vector<nlohmann::ordered_json>& rows) {
  std::printf("%-22s %12s %8s %6s  %s\n", "arch", "params", "GMACs", "input", "description");
  for (const auto& r : rows) {
    std::printf("%-22s %12s %8.2f %6d  %s\n", r["name"].get<std::string>().c_str(),
                with_commas(r["params"].get<int64_t>()).c_str(), r["gmacs"].get<double>(), r["input_size"].get<int>(),
                r["description"].get<std::string>().c_str());
  }
}

std::string percent(std::int64_t part, std::int64_t whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0);
  return buf;
}

// --sparsity: every conv/linear weight (a 4-D or 2-D "*weight") of a weights
// file or of a training checkpoint's model (and EMA), with its zeros and
// whether it is 2:4 along its input channels, as sparse tensor cores need.
void report_sparsity(const ModelsArgs& a) {
  if (a.weights.empty()) throw Error("--sparsity reports on the weights of --weights FILE");
  const auto ckpt = runtime::load_checkpoint(a.weights);
  nlohmann::ordered_json out{{"weights", a.weights}};
  auto section = [&](const std::string& prefix) {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    std::int64_t layers = 0, sparse_layers = 0, values = 0, sparse_values = 0, zeros = 0, all = 0, all_zeros = 0;
    for (const auto& [name, t] : ckpt.section(prefix).tensors) {
      if (!t.is_floating_point()) continue;
      const auto s = train::sparsity_of(t);
      all += s.numel, all_zeros += s.zeros;
      const bool weight = (t.dim() == 2 || t.dim() == 4) && name.size() >= 6 && name.substr(name.size() - 6) == "weight";
      if (!weight) continue;
      ++layers, values += s.numel, zeros += s.zeros;
      if (s.is_2_4()) ++sparse_layers, sparse_values += s.numel;
      const std::string pattern = s.is_2_4()     ? "2:4"
                                  : s.groupable ? "dense (" + std::to_string(s.dense_groups) + " of " +
                                                      std::to_string(s.groups) + " groups of 4 hold more than 2)"
                                                : "dense (" + std::to_string(t.size(1)) + " input channels)";
      rows.push_back({{"name", name},
                      {"shape", t.sizes().vec()},
                      {"zeros", s.zeros},
                      {"numel", s.numel},
                      {"pattern", pattern},
                      {"masked", ckpt.file.find("asp_mask." + name) != nullptr}});
    }
    return nlohmann::ordered_json{{"layers", rows},
                                  {"conv_linear_weights", layers},
                                  {"2_4_weights", sparse_layers},
                                  {"2_4_values", sparse_values},
                                  {"weight_values", values},
                                  {"weight_zeros", zeros},
                                  {"parameters", all},
                                  {"parameter_zeros", all_zeros}};
  };
  out["model"] = section("model.");
  const bool ema = ckpt.has_ema();
  if (ema) out["ema"] = section("ema.");
  if (a.json) {
    std::cout << out.dump(2) << '\n';
    return;
  }
  auto summary = [](const nlohmann::ordered_json& s) {
    const auto n = [&](const char* k) { return s[k].get<std::int64_t>(); };
    return std::to_string(n("2_4_weights")) + " of " + std::to_string(n("conv_linear_weights")) +
           " conv/linear weights are 2:4 (" + with_commas(n("2_4_values")) + " of " + with_commas(n("weight_values")) +
           " values); zeros: " + percent(n("weight_zeros"), n("weight_values")) + " of conv/linear weights, " +
           percent(n("parameter_zeros"), n("parameters")) + " of all " + with_commas(n("parameters")) + " values";
  };
  std::printf("%-36s %-18s %8s  %s\n", "weight", "shape", "zeros", "pattern (groups of 4 input channels)");
  for (const auto& r : out["model"]["layers"]) {
    std::printf("%-36s %-18s %8s  %s%s\n", r["name"].get<std::string>().c_str(), r["shape"].dump().c_str(),
                percent(r["zeros"].get<std::int64_t>(), r["numel"].get<std::int64_t>()).c_str(),
                r["pattern"].get<std::string>().c_str(), r["masked"].get<bool>() ? ", masked (asp_mask)" : "");
  }
  std::printf("\n%s: %s\n", ckpt.is_training_checkpoint() ? "model" : "weights", summary(out["model"]).c_str());
  if (ema) std::printf("ema: %s\n", summary(out["ema"]).c_str());
}

void run(const ModelsArgs& a) {
  if (a.sparsity) return report_sparsity(a);
  int64_t num_classes = a.num_classes.value_or(1000);  // build_model refuses a given count below 1
  // --weights takes a training checkpoint too: its "model." weights, with the
  // class count it was trained for.
  std::optional<runtime::Checkpoint> ckpt;
  if (!a.weights.empty() && !a.arch.empty()) {
    ckpt = runtime::load_checkpoint(a.weights, a.key_layout);
    if (ckpt->is_training_checkpoint()) {
      if (!same_architecture(find_architecture(a.arch), ckpt->meta)) {
        throw Error("--arch " + a.arch + " disagrees with --weights " + a.weights + ", a " +
                    ckpt->meta.at("arch").get<std::string>() + " training checkpoint");
      }
      const auto trained = ckpt->meta.at("num_classes").get<int64_t>();
      if (a.num_classes && *a.num_classes != trained) {
        throw Error("--num-classes " + std::to_string(num_classes) + " disagrees with --weights " + a.weights +
                    ", trained for " + std::to_string(trained) + " classes");
      }
      num_classes = trained;
    }
  }
  ModelOptions options;
  options.num_classes = num_classes;
  options.conv_init = a.init == "fan_out" ? ConvInit::FanOut : ConvInit::FanIn;
  options.zero_init_residual = a.zero_init_residual;

  if (a.arch.empty()) {
    if (!a.weights.empty() || !a.save.empty() || a.forward || a.definition) {
      throw Error("--weights, --save, --forward and --definition act on one model and need --arch",
                  "e.g. convnets models --arch resnet50 --forward");
    }
    const auto rows = describe_architectures(options);
    if (a.json) {
      std::cout << nlohmann::ordered_json(rows).dump(2) << '\n';
    } else {
      print_table(rows);
    }
    return;
  }

  const auto& arch = find_architecture(a.arch);
  if (a.definition) {
    if (!arch.gpunet) throw Error("--definition: " + arch.name + " is not built from a layer list (GPUNets are)");
    std::cout << to_json(*arch.gpunet).dump(2) << '\n';
    return;
  }
  if (!a.forward_save.empty() && !a.forward) throw Error("--forward-save needs --forward");
  torch::manual_seed(static_cast<std::uint64_t>(a.seed));
  auto net = build_model(arch, options);
  auto info = describe_architecture(arch, *net, num_classes);
  if (!a.weights.empty()) {
    runtime::load_weights(*net, *ckpt, "model.", arch);
    info["weights"] = a.weights;
  }
  if (a.forward) {
    const int size = a.input_size > 0 ? a.input_size : arch.preprocessing.input_size;
    if (a.batch_size < 1) throw Error("--batch-size must be at least 1, got " + std::to_string(a.batch_size));
    net->eval();
    torch::NoGradGuard no_grad;
    auto x = torch::randn({a.batch_size, 3, size, size}, torch::TensorOptions().dtype(torch::kFloat32));
    const auto start = std::chrono::steady_clock::now();
    auto logits = net->forward(x);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!torch::isfinite(logits).all().item<bool>()) throw Error(a.arch + ": forward pass produced non-finite logits");
    if (!a.forward_save.empty()) {
      save_safetensors(a.forward_save, {{"input", x}, {"logits", logits}}, {{"arch", arch.name}});
    }
    info["forward"] = {{"input_shape", x.sizes().vec()},
                       {"output_shape", logits.sizes().vec()},
                       {"milliseconds", ms},
                       {"threads", at::get_num_threads()}};
  }
  if (!a.save.empty()) {
    save_safetensors(a.save, state_dict(*net),
                     {{"format", "pt"}, {"arch", arch.name}, {"num_classes", std::to_string(num_classes)}});
    info["saved"] = a.save;
  }

  if (a.json) {
    std::cout << info.dump(2) << '\n';
    return;
  }
  print_table({info});
  std::printf("\npreprocessing: input %d, eval resize %d + centre crop (ratio %.3f), %s, mean [%.3f, %.3f, %.3f], "
              "std [%.3f, %.3f, %.3f]\n",
              arch.preprocessing.input_size,
              // floor, as the eval transform (and timm) sizes it: 528 / 0.942 = 560.5 -> 560
              static_cast<int>(std::floor(arch.preprocessing.input_size / arch.preprocessing.crop_ratio + 1e-9)),
              arch.preprocessing.crop_ratio, arch.preprocessing.interpolation.c_str(), arch.preprocessing.mean[0],
              arch.preprocessing.mean[1], arch.preprocessing.mean[2], arch.preprocessing.std[0],
              arch.preprocessing.std[1], arch.preprocessing.std[2]);
  if (!arch.reference.empty()) std::printf("state_dict keys follow: %s\n", arch.reference.c_str());
  if (info.contains("weights")) std::printf("loaded weights: %s (all tensors matched)\n", a.weights.c_str());
  if (info.contains("forward")) {
    const auto& f = info["forward"];
    std::printf("forward: input %s -> logits %s in %.1f ms on %d CPU threads\n", f["input_shape"].dump().c_str(),
                f["output_shape"].dump().c_str(), f["milliseconds"].get<double>(), f["threads"].get<int>());
  }
  if (info.contains("saved")) std::printf("saved weights: %s\n", a.save.c_str());
}

}  // namespace

void add_models_command(CLI::App& app) {
  auto args = std::make_shared<ModelsArgs>();
  auto* cmd = app.add_subcommand("models", "List the model archs (params, GMACs, input size), or inspect one");
  cmd->add_option("--arch", args->arch, "Show one arch; needed by --weights, --save and --forward");
  cmd->add_option("--num-classes", args->num_classes, "Classifier outputs (default: a training checkpoint's given by --weights, else 1000)");
  cmd->add_option("--init", args->init, "Conv weight init: kaiming fan_in (DLE) or fan_out (torchvision)")
      ->check(CLI::IsMember({"fan_in", "fan_out"}));
  cmd->add_flag("--zero-init-residual", args->zero_init_residual, "Zero the last BN gamma of every residual branch");
  cmd->add_option("--weights", args->weights,
                  "Load weights (safetensors or torch.save; torchvision, timm or DLE key names) and check they fit")
      ->check(CLI::ExistingFile);
  add_key_layout_option(cmd, args->key_layout);
  cmd->add_option("--save", args->save, "Write the model's weights (torchvision key names) to a safetensors file");
  cmd->add_flag("--forward", args->forward, "Run one forward pass on a random batch");
  cmd->add_option("--batch-size", args->batch_size, "Batch size for --forward (default 1)");
  cmd->add_option("--input-size", args->input_size, "Image side for --forward (default: the arch's input size)")
      ->check(CLI::Range(1, 65536));
  cmd->add_flag("--json", args->json, "Print JSON instead of a table");
  cmd->add_flag("--definition", args->definition,
                "Print a GPUNet's layer list in DLE's JSON format (edit it and pass the file to --arch)");
  cmd->add_option("--forward-save", args->forward_save,
                  "With --forward: write the input and the logits to a safetensors file, to compare with another "
                  "implementation");
  cmd->add_flag("--sparsity", args->sparsity,
                "With --weights (a weights file or a training checkpoint; --arch not needed): each conv/linear "
                "weight's zeros and whether it is 2:4 along its input channels (--asp)");
  cmd->add_option("--seed", args->seed, "Seed of the initial weights and the --forward input (default 0)");
  cmd->callback([args] { run(*args); });
}

}  // namespace convnets::cli
