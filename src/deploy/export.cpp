#include "deploy/export.h"

#include "core/error.h"
#include "core/options.h"
#include "core/json.h"
#include "data/dataset.h"
#include "deploy/inference.h"
#include "export/onnx_export.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io/state_dict.h"
#include "models/registry.h"
#include "quant/eager.h"
#include "runtime/checkpoint.h"
#include "runtime/evaluate.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cctype>
#include <filesystem>
#include <map>
#include <optional>

namespace convnets::deploy {
namespace {

// The INT8 ranges: a QAT checkpoint's own, or calibrated on --calibration
// images through the checkpoint's eval preprocessing.
quant::Plan int8_plan(const ExportOptions& a, NetworkImpl& model, const runtime::Checkpoint& ckpt, const Preprocessing& pre,
                      const std::function<void(const std::string&)>& say) {
  if (ckpt.meta.contains("quantization")) {
    if (!a.calibration.empty()) {
      throw Error("--calibration: " + a.checkpoint + " was trained with --qat and carries its ranges; "
                  "calibrating again would discard what QAT learned with them",
                  "export it without --calibration");
    }
    auto plan = quant::plan_from_json(ckpt.meta.at("quantization"), a.checkpoint);
    if (a.calibration_method || (a.reduce_range && !plan.reduce_range) ||
        (a.activations && quant::parse_activations(*a.activations, options::name("int8_activations")) !=
                              plan.activations) ||
        (a.silu && quant::parse_silu(*a.silu, options::name("int8_silu")) != plan.silu)) {
      throw Error(options::name("calibration_method") + "/" + options::name("int8_activations") + "/" +
                  options::name("int8_reduce_range") + "/" + options::name("int8_silu") + ": " + a.checkpoint +
                  " was trained with --qat with " + quant::spelling(plan.activations) + " activations" +
                  (plan.reduce_range ? ", 7-bit weights" : "") + ", SiLU " + quant::spelling(plan.silu) +
                  ", calibrated by " + quant::spelling(plan.method),
                  "export it without those flags: its graph is the one it was trained as");
    }
    return plan;
  }
  if (a.calibration.empty()) {
    throw Error("--int8 needs calibration images: add --calibration DATA (a few hundred training images; "
                "a folder, list file or IDX folder as for train)");
  }
  const auto activations = quant::parse_activations(a.activations.value_or("uint8"), options::name("int8_activations"));
  const auto method = quant::parse_method(a.calibration_method.value_or("percentile"), options::name("calibration_method"));
  const auto silu = quant::parse_silu(a.silu.value_or("ops"), options::name("int8_silu"));
  const auto rt = runtime::resolve_runtime(a.device, "fp32", "nchw");
  runtime::prepare_model(model, rt);
  const auto ds = data::spread(data::open_dataset(a.calibration, "train"), static_cast<std::size_t>(a.calibration_images));
  data::PipelineOptions lo;
  lo.batch_size = a.calibration_batch;
  lo.workers = a.workers;
  lo.max_image_pixels = a.max_image_pixels;
  const auto loader = runtime::make_eval_loader(ds, pre, lo);
  if (say) {
    say("export: calibrating on " + ds->description() + " (" + quant::spelling(method) + ", " +
        quant::spelling(activations) + " activations, SiLU " + quant::spelling(silu) + ")");
  }
  auto plan = quant::calibrate(model, *loader, rt, pre, activations, method, a.reduce_range, silu, "calibration");
  model.to(torch::kCPU);
  return plan;
}


// What the file's weights are named after. torchvision and DLE's GPUNet are
// our own names; DLE's ResNets keep the four stages in `layers.{s}`.
std::string export_key(const std::string& key, const std::string& style) {
  if (style != "dle") return key;
  if (key.rfind("layer", 0) == 0 && key.size() > 6 && std::isdigit(static_cast<unsigned char>(key[5])) &&
      key[6] == '.') {
    return "layers." + std::to_string(key[5] - '1') + key.substr(6);
  }
  return key;
}

// Each entry is made in a hidden folder beside it and renamed into place whole: Triton polling the repository
// never sees half an entry, and one that exists is never overwritten.
struct TritonEntry {
  std::string name;
  std::vector<std::pair<std::string, std::string>> files;  // path in the entry, contents
  bool graph = false;                                       // 1/model.onnx, from write_onnx
};

std::size_t write_triton_entries(const std::string& repo, const std::vector<TritonEntry>& entries,
                                 const std::function<std::size_t(const std::string&)>& write_onnx) {
  namespace fs = std::filesystem;
  for (const auto& e : entries) {
    if (fs::exists(fs::path(repo) / e.name)) {
      throw Error("-o " + repo + ": " + (fs::path(repo) / e.name).string() +
                  " already exists; nothing was overwritten (another --model-name, or remove it first)");
    }
  }
  std::error_code ec;
  fs::create_directories(repo, ec);
  if (ec || !fs::is_directory(repo)) throw Error("-o " + repo + ": cannot create the repository folder: " + ec.message());
  std::vector<fs::path> made;
  const auto partial = [&](const TritonEntry& e) { return fs::path(repo) / ("." + e.name + ".partial"); };
  try {
    std::size_t nodes = 0;
    for (const auto& e : entries) {
      fs::remove_all(partial(e), ec);
      fs::create_directories(partial(e) / "1");
      if (e.graph) nodes = write_onnx((partial(e) / "1" / "model.onnx").string());
      for (const auto& [path, text] : e.files) write_file_atomically((partial(e) / path).string(), text);
    }
    for (const auto& e : entries) {
      fs::rename(partial(e), fs::path(repo) / e.name);
      made.push_back(fs::path(repo) / e.name);
    }
    return nodes;
  } catch (...) {
    for (const auto& e : entries) fs::remove_all(partial(e), ec);
    for (const auto& m : made) fs::remove_all(m, ec);
    throw;
  }
}

}  // namespace

std::string export_checkpoint(const ExportOptions& a, const std::function<void(const std::string&)>& say) {
  // The CLI checks these as it parses; a library caller reaches here directly.
  check_choice("--format", a.format, {"onnx", "safetensors", "triton"});
  check_choice("--key-style", a.key_style, {"reference", "dle"});
  check_choice("--dtype", a.dtype, {"fp32", "fp16"});
  if (a.calibration_method) options::check(options::calibration_method, *a.calibration_method);
  if (a.activations) options::check(options::int8_activations, *a.activations);
  if (a.silu) options::check(options::int8_silu, *a.silu);
  if (a.batch_size < 1) throw Error("--batch-size must be at least 1, got " + std::to_string(a.batch_size));
  if (a.image_size < 0) throw Error("--image-size must be 0 (the checkpoint's) or positive, got " + std::to_string(a.image_size));
  if (a.calibration_images < 1) throw Error("--calibration-images must be at least 1, got " + std::to_string(a.calibration_images));
  if (a.calibration_batch < 1) throw Error("--calibration-batch-size must be at least 1, got " + std::to_string(a.calibration_batch));
  if (a.output.empty()) throw Error("-o/--output: no file to write");
  const auto ckpt = runtime::load_checkpoint(a.checkpoint, a.key_layout);
  const bool trained = ckpt.is_training_checkpoint();
  if (!trained && a.arch.empty()) {
    throw Error("--checkpoint " + a.checkpoint + " is a plain weights file; name its --arch");
  }
  const auto& arch = trained ? architecture_of_checkpoint(ckpt.meta, a.checkpoint) : find_architecture(a.arch);
  if (trained && !a.arch.empty() && !same_architecture(find_architecture(a.arch), ckpt.meta)) {
    throw Error("--arch " + a.arch + " disagrees with --checkpoint " + a.checkpoint + ", a " +
                ckpt.meta.at("arch").get<std::string>());
  }
  if (a.ema && !ckpt.has_ema()) {
    throw Error("--ema: " + a.checkpoint + (trained ? " was trained without --ema: it holds no EMA weights"
                                                    : " is a weights file with no EMA (no state_dict_ema)"));
  }
  // Through the model, so that what is written is exactly what loads: every
  // tensor present, shapes checked, the arch's order.
  ModelOptions mo;
  mo.num_classes = trained ? ckpt.meta.at("num_classes").get<std::int64_t>() : runtime::classes_in_weights(arch, ckpt);
  auto model = build_model(arch, mo);
  runtime::load_weights(*model, ckpt, a.ema ? "ema." : "model.", arch);
  const Preprocessing pre = trained ? preprocessing_from_json(ckpt.meta.at("preprocessing")) : arch.preprocessing;
  std::map<std::string, std::string> meta{
      {"arch", arch.name},
      {"num_classes", std::to_string(mo.num_classes)},
      {"weights", a.ema ? "ema" : "model"},
      {"preprocessing", dump_json(to_json(pre))},
  };
  if (trained && ckpt.meta.contains("class_names")) meta["class_names"] = dump_json(ckpt.meta.at("class_names"));
  if (arch.from_file) meta["arch_definition"] = to_json(*arch.gpunet).dump();

  const bool triton = a.format == "triton";
  TritonSettings ts = a.triton;
  if (triton) {
    if (ts.name.empty()) ts.name = arch.name;
    check_triton_settings(ts);
    if (a.batch_size != 1 || a.dynamic_batch) {
      throw Error("--batch-size and --dynamic-batch apply to --format onnx; a Triton entry's batch is symbolic, "
                  "up to --max-batch-size");
    }
  }
  if (a.format == "onnx" || triton) {
    if (a.key_style != "reference") throw Error("--key-style applies to --format safetensors");
    std::optional<quant::Plan> plan;
    if (a.int8) {
      plan = int8_plan(a, *model, ckpt, pre, say);
      meta["quantization"] = dump_json(quant::to_json(*plan));
    } else if (!a.calibration.empty()) {
      throw Error("--calibration applies to --int8");
    }
    OnnxOptions o;
    o.int8 = plan ? &*plan : nullptr;
    o.image_size = a.image_size > 0 ? a.image_size : pre.input_size;
    o.num_classes = mo.num_classes;
    o.batch = a.batch_size;
    o.dynamic_batch = a.dynamic_batch || triton;
    o.fold_bn = a.fold_bn;
    o.fp16 = a.dtype == "fp16";
    o.opset = a.opset;
    o.metadata = meta;
    if (triton) {
      const auto labels = class_names_or_imagenet(
          trained ? ckpt.meta.value("class_names", std::vector<std::string>{}) : std::vector<std::string>{},
          mo.num_classes);
      TritonGraph g{o.fp16, o.image_size, mo.num_classes, !labels.empty(), dump_json(to_json(pre)), arch.name,
                    pre.crop_ratio, pre.mean, pre.std, pre.interpolation};
      std::string label_text;
      for (const auto& l : labels) label_text += l + "\n";
      std::vector<TritonEntry> entries{{ts.name, {{"config.pbtxt", triton_config_text(ts, g)}}, true}};
      if (!labels.empty()) entries[0].files.emplace_back("labels.txt", label_text);
      if (ts.preprocessing == "dali") {
        entries.push_back({triton_preprocessing_name(ts),
                           {{"config.pbtxt", triton_dali_config_text(ts, g)}, {"1/dali.py", triton_dali_pipeline(ts, g)}}});
        entries.push_back({triton_ensemble_name(ts), {{"config.pbtxt", triton_ensemble_config_text(ts, g)}}});
        if (!labels.empty()) entries.back().files.emplace_back("labels.txt", label_text);
      }
      const auto nodes = write_triton_entries(a.output, entries, [&](const std::string& onnx) {
        return export_onnx(*model, o, onnx);
      });
      return "export: " + arch.name + " -> Triton model repository " + a.output + ", model " + ts.name +
             " (config.pbtxt, 1/model.onnx: ONNX opset " + std::to_string(a.opset) + ", " + std::to_string(nodes) +
             " nodes, input batch<=" + std::to_string(ts.batching.max_batch_size) + "x3x" + std::to_string(o.image_size) + "x" +
             std::to_string(o.image_size) + ", " + (plan ? std::string("INT8 QDQ") : a.dtype) +
             (labels.empty() ? "" : ", labels.txt") + ")" +
             (ts.preprocessing == "dali" ? ", " + triton_preprocessing_name(ts) + " (DALI: encoded images to its input) and " +
                                                triton_ensemble_name(ts) + " (encoded images in, logits out)"
                                          : "");
    }
    const auto nodes = export_onnx(*model, o, a.output);
    return "export: " + arch.name + " -> " + a.output + " (ONNX opset " + std::to_string(a.opset) + ", " +
           std::to_string(nodes) + " nodes, input " +
           (a.dynamic_batch ? std::string("batch") : std::to_string(a.batch_size)) + "x3x" +
           std::to_string(o.image_size) + "x" + std::to_string(o.image_size) + ", " +
           (plan ? "INT8 QDQ, " + quant::spelling(plan->activations) + " activations, " +
                       std::to_string(plan->points.size()) + " quantized tensors" +
                       (plan->silu == quant::Silu::Float ? ", SiLU in float" : "") + ", BN folded"
                 : a.dtype + (a.fold_bn ? ", BN folded" : "")) +
           ")";
  }
  if (a.int8) throw Error("--int8 applies to --format onnx");
  if (a.fold_bn || a.dynamic_batch) throw Error("--fold-bn and --dynamic-batch apply to --format onnx");
  if (const KeyLayout* dle = find_key_layout(arch, "dle"); a.key_style == "dle" && !(dle && dle->map)) {
    throw Error("--key-style dle: " + arch.name + " has no DLE naming (DLE's ResNets do; GPUNets already use DLE's names)");
  }
  NamedTensors out;
  for (const auto& [key, t] : state_dict(*model)) {
    auto v = t.contiguous();  // channels-last is a layout; the file holds NCHW
    if (a.dtype == "fp16" && v.is_floating_point()) v = v.to(torch::kHalf);
    out.emplace_back(export_key(key, a.key_style), v);
  }
  meta["format"] = "pt";
  meta["key_style"] = a.key_style == "dle" ? "dle" : arch.key_names;
  save_safetensors(a.output, out, meta);
  return "export: " + arch.name + " (" + (a.ema ? "EMA" : "model") + " weights, " + std::to_string(out.size()) +
         " tensors, " + a.dtype + ", " + meta["key_style"] + " names) -> " + a.output;
}


}  // namespace convnets::deploy
