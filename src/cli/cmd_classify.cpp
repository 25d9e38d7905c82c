// `convnets classify`: top-k classes of JPEG/PNG files with a checkpoint's own preprocessing and class names.
#include "cli/commands.h"
#include "core/options.h"
#include "codec/image.h"
#include "core/error.h"
#include "core/json.h"
#include "deploy/inference.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>

namespace convnets::cli {
namespace {

struct ClassifyArgs {
  std::vector<std::string> images;
  std::string checkpoint;
  std::vector<std::string> image_options;  // DLE classify.py's --image PATH
  std::int64_t batch_size = 64, top_k = 5, max_image_pixels = codec::kDefaultMaxImagePixels;
  bool json = false;
  deploy::InferenceOptions io;
};

// The image arguments, with "-" replaced by the paths read from stdin (one per line).
std::vector<std::string> expand_inputs(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const auto& a : args) {
    if (a != "-") {
      out.push_back(a);
      continue;
    }
    std::string line;
    while (std::getline(std::cin, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) out.push_back(line);
    }
  }
  if (out.empty()) throw Error("classify: no images given", "pass image paths, or - to read a list from stdin");
  return out;
}

void print_table(const std::vector<deploy::Prediction>& results, const std::vector<std::string>& names) {
  for (const auto& r : results) {
    std::printf("%s\n", r.path.c_str());
    if (!r.error.empty()) {
      std::printf("  error: %s\n", r.error.c_str());
      continue;
    }
    for (const auto& [index, p] : r.top) {
      std::printf("  %7.3f%%  %s (%lld)\n", 100.0 * p, names[static_cast<std::size_t>(index)].c_str(),
                  static_cast<long long>(index));
    }
  }
}

void run(const ClassifyArgs& a) {
  if (a.batch_size < 1) throw Error("--batch-size must be at least 1, got " + std::to_string(a.batch_size));
  if (a.top_k < 1) throw Error("--top-k must be at least 1, got " + std::to_string(a.top_k));
  auto inputs = a.images;
  inputs.insert(inputs.end(), a.image_options.begin(), a.image_options.end());
  const auto paths = expand_inputs(inputs);  // stdin is read, and no images refused, before the model loads
  const deploy::InferenceModel model(a.checkpoint, a.io);
  const auto results = model.classify(paths, a.top_k, a.batch_size, a.max_image_pixels);
  std::size_t failed = 0;
  for (const auto& r : results) failed += r.error.empty() ? 0 : 1;
  if (a.json) {
    std::cout << dump_json(model.to_json(results), 2) << '\n';
  } else {
    print_table(results, model.class_names());
  }
  if (failed > 0) {
    const std::size_t done = paths.size() - failed;
    throw Error(std::to_string(failed) + " of " + std::to_string(paths.size()) +
                " images could not be classified (reported above)" +
                (done > 0 ? "; the other " + std::to_string(done) + " were" : std::string()));
  }
}

}  // namespace

void add_classify_command(CLI::App& app) {
  auto a = std::make_shared<ClassifyArgs>();
  auto* cmd = app.add_subcommand(
      "classify", "Top-k classes of JPEG/PNG images with a checkpoint's preprocessing and class names");
  cmd->add_option("IMAGE", a->images, "image files; - reads a list of paths from stdin, one per line");
  cmd->add_option("--image", a->image_options, "DLE classify.py: an image file (as IMAGE; repeatable)");
  cmd->add_option("--checkpoint,--weights,--pretrained-from-file", a->checkpoint,
                  "a checkpoint written by `convnets train`, an exported ONNX file, or plain weights (safetensors, or "
                  "PyTorch's torch.save files: torchvision, timm, DLE) with --arch")
      ->required();
  auto& io = a->io;
  cmd->add_option("-a,--arch", io.arch, "the architecture of plain weights (checked against a checkpoint's)");
  cmd->add_option("--image-size", io.image_size, "crop size (default: the checkpoint's or the arch's)")
      ->check(CLI::NonNegativeNumber);
  // DLE's -c picks the convolutions' initialisation, which trained weights replace: checked, then nothing to do.
  cmd->add_option_function<std::string>(
         "-c,--model-config", [](const std::string&) {},
         "DLE: classic | fanin | grp-fanin | grp-fanout; an initialisation, so the weights decide (accepted for DLE's "
         "command lines)")
      ->check(CLI::IsMember({"classic", "fanin", "grp-fanin", "grp-fanout"}));
  cmd->add_flag_callback("--cpu", [a] { a->io.device = "cpu"; }, "DLE classify.py: --device cpu");
  add_dle_model_refusals(cmd);
  cmd->add_option("--num-classes,--num_classes", io.num_classes, "plain weights: the class count (default: the classifier's width)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--top-k", a->top_k, "classes per image (capped at the class count)");
  cmd->add_option("--batch-size", a->batch_size, "images per forward pass");
  cmd->add_option("--max-image-pixels", a->max_image_pixels, codec::kMaxImagePixelsHelp)->check(CLI::NonNegativeNumber);
  add_inference_options(cmd, io);
  cmd->add_flag("--json", a->json, "print JSON: per image its top-k (class, index, probability) or its error");
  cmd->callback([a] { run(*a); });
  cmd->footer("An image that cannot be read or decoded is reported in the output and the others are still "
              "classified; the exit status is then 1.");
}

}  // namespace convnets::cli
