// `convnets classify`: top-k classes of JPEG/PNG files with a checkpoint's own preprocessing and class names.
#include "cli/commands.h"
#include "core/json.h"
#include "codec/image.h"
#include "core/error.h"
#include "data/dataset.h"
#include "data/transforms.h"
#include "models/graph.h"
#include "models/registry.h"
#include "train/checkpoint.h"
#include "train/runtime.h"

#include <CLI/CLI.hpp>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <memory>

namespace convnets::cli {
namespace {

struct ClassifyArgs {
  std::vector<std::string> images;
  std::string checkpoint, device = "auto", precision = "fp32", memory_format = "nhwc";
  std::int64_t batch_size = 64, top_k = 5, max_image_pixels = codec::kDefaultMaxImagePixels;
  bool ema = false, json = false, fold_bn = false;
};

struct Result {
  std::string path;
  std::string error;  // empty: classified
  std::vector<std::pair<std::int64_t, double>> top;  // class index, probability
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

void print_table(const std::vector<Result>& results, const std::vector<std::string>& names) {
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
  const auto ckpt = train::load_checkpoint(a.checkpoint);
  if (!ckpt.is_training_checkpoint()) {
    throw Error("--checkpoint " + a.checkpoint + " is a plain weights file without class names or preprocessing",
                "classify needs a checkpoint written by `convnets train`");
  }
  const auto& arch = architecture_of_checkpoint(ckpt.meta, a.checkpoint);
  const Preprocessing pre = preprocessing_from_json(ckpt.meta.at("preprocessing"));
  const auto num_classes = ckpt.meta.at("num_classes").get<std::int64_t>();
  auto names = ckpt.meta.value("class_names", std::vector<std::string>{});
  if (names.size() != static_cast<std::size_t>(num_classes)) {
    names.clear();
    for (std::int64_t i = 0; i < num_classes; ++i) names.push_back(std::to_string(i));
  }
  const auto paths = expand_inputs(a.images);  // stdin is read before any work
  const auto rt = train::resolve_runtime(a.device, a.precision, a.memory_format);
  ModelOptions mo;
  mo.num_classes = num_classes;
  auto model = build_model(arch, mo);
  train::load_weights(*model, ckpt, a.ema ? "ema." : "model.", arch.import_key);
  train::prepare_model(*model, rt);
  model->eval();
  if (a.fold_bn) fold_batchnorm(*model);
  auto topts = data::TransformOptions::eval(pre.input_size, pre.crop_ratio, data::parse_filter(pre.interpolation, "interpolation"));
  topts.max_pixels = a.max_image_pixels;
  const data::Transform transform(topts);
  const std::int64_t k = std::min<std::int64_t>(a.top_k, num_classes);
  const std::int64_t side = pre.input_size, pixels = side * side * 3;

  std::vector<Result> results(paths.size());
  torch::NoGradGuard no_grad;
  for (std::size_t begin = 0; begin < paths.size(); begin += static_cast<std::size_t>(a.batch_size)) {
    const std::size_t end = std::min(paths.size(), begin + static_cast<std::size_t>(a.batch_size));
    auto batch = torch::empty({static_cast<std::int64_t>(end - begin), side, side, 3}, torch::kByte);
    // Decoding dominates a CPU run; the model's own threads wait for it anyway.
    at::parallel_for(static_cast<std::int64_t>(begin), static_cast<std::int64_t>(end), 1,
                     [&](std::int64_t lo, std::int64_t hi) {
                       data::Workspace ws;
                       data::Rng rng(0);  // eval transforms draw nothing
                       for (std::int64_t i = lo; i < hi; ++i) {
                         auto& r = results[static_cast<std::size_t>(i)];
                         r.path = paths[static_cast<std::size_t>(i)];
                         data::SampleData s;
                         s.name = r.path;
                         try {
                           data::read_image_file(r.path, s.bytes);
                           transform.apply(s, rng, ws, batch.data_ptr<std::uint8_t>() + (i - static_cast<std::int64_t>(begin)) * pixels,
                                           nullptr);
                         } catch (const std::bad_alloc&) {
                           r.error = r.path + ": out of memory while decoding it (std::bad_alloc)";
                         } catch (const std::exception& e) {
                           r.error = e.what();
                         }
                       }
                     });
    std::vector<std::int64_t> ok;
    for (std::size_t i = begin; i < end; ++i) {
      if (results[i].error.empty()) ok.push_back(static_cast<std::int64_t>(i - begin));
    }
    if (ok.empty()) continue;
    const auto good = batch.index_select(0, torch::tensor(ok, torch::kLong));
    const auto logits = model->forward(train::network_input(good, pre, rt)).to(torch::kFloat).cpu();
    const auto [probs, indices] = torch::softmax(logits, 1).topk(k, 1);
    for (std::size_t j = 0; j < ok.size(); ++j) {
      auto& r = results[begin + static_cast<std::size_t>(ok[j])];
      for (std::int64_t c = 0; c < k; ++c) {
        r.top.emplace_back(indices[static_cast<std::int64_t>(j)][c].item<std::int64_t>(),
                           probs[static_cast<std::int64_t>(j)][c].item<double>());
      }
    }
  }

  std::size_t failed = 0;
  for (const auto& r : results) failed += r.error.empty() ? 0 : 1;
  if (a.json) {
    auto list = nlohmann::ordered_json::array();
    for (const auto& r : results) {
      nlohmann::ordered_json j{{"path", r.path}};
      if (!r.error.empty()) {
        j["error"] = r.error;
      } else {
        auto top = nlohmann::ordered_json::array();
        for (const auto& [index, p] : r.top) {
          top.push_back({{"class", names[static_cast<std::size_t>(index)]}, {"index", index}, {"probability", p}});
        }
        j["top"] = std::move(top);
      }
      list.push_back(std::move(j));
    }
    std::cout << dump_json(nlohmann::ordered_json{{"checkpoint", a.checkpoint},
                                                  {"arch", arch.name},
                                                  {"weights", a.ema ? "ema" : "model"},
                                                  {"preprocessing", to_json(pre)},
                                                  {"images", paths.size()},
                                                  {"failed", failed},
                                                  {"results", std::move(list)}},
                           2)
              << '\n';
  } else {
    print_table(results, names);
  }
  if (failed > 0) {
    throw Error(std::to_string(failed) + " of " + std::to_string(paths.size()) +
                " images could not be classified (reported above); the others were");
  }
}

}  // namespace

void add_classify_command(CLI::App& app) {
  auto a = std::make_shared<ClassifyArgs>();
  auto* cmd = app.add_subcommand(
      "classify", "Top-k classes of JPEG/PNG images with a checkpoint's preprocessing and class names");
  cmd->add_option("IMAGE", a->images, "image files; - reads a list of paths from stdin, one per line")->required();
  cmd->add_option("--checkpoint", a->checkpoint, "a checkpoint written by `convnets train`")->required();
  cmd->add_option("--top-k", a->top_k, "classes per image (capped at the class count)");
  cmd->add_option("--batch-size", a->batch_size, "images per forward pass");
  cmd->add_option("--max-image-pixels", a->max_image_pixels, codec::kMaxImagePixelsHelp)->check(CLI::NonNegativeNumber);
  cmd->add_option("--device", a->device, "auto | cpu | cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--precision", a->precision, "fp32 | tf32 | amp | bf16")
      ->check(CLI::IsMember({"fp32", "tf32", "amp", "bf16"}));
  cmd->add_option("--memory-format", a->memory_format, "nhwc | nchw")->check(CLI::IsMember({"nhwc", "nchw"}));
  cmd->add_flag("--ema", a->ema, "use the checkpoint's EMA weights");
  cmd->add_flag("--fold-bn", a->fold_bn, "fold each BatchNorm into the preceding conv (faster; same result to rounding)");
  cmd->add_flag("--json", a->json, "print JSON: per image its top-k (class, index, probability) or its error");
  cmd->callback([a] { run(*a); });
  cmd->footer("An image that cannot be read or decoded is reported in the output and the others are still "
              "classified; the exit status is then 1.");
}

}  // namespace convnets::cli
