#include "deploy/inference.h"

#include "deploy/graph_engine.h"
#include "core/error.h"
#include "core/json.h"
#include "core/options.h"
#include "data/dataset.h"
#include "data/transforms.h"
#include "export/onnx_export.h"
#include "models/graph.h"
#include "models/imagenet_classes.h"
#include "quant/eager.h"

#include <torch/version.h>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>

namespace convnets::deploy {

namespace {

bool is_onnx_path(const std::string& p) { return p.size() > 5 && p.compare(p.size() - 5, 5, ".onnx") == 0; }

}  // namespace

InferenceModel::InferenceModel(const std::string& checkpoint, const InferenceOptions& o) : path_(checkpoint), options_(o) {
  if (o.image_size < 0) throw Error("--image-size must be 0 (the checkpoint's) or positive, got " + std::to_string(o.image_size));
  if (is_onnx_path(checkpoint)) {
    open_onnx();
    return;
  }
  const auto ckpt = runtime::load_checkpoint(checkpoint, o.key_layout);
  trained_ = ckpt.is_training_checkpoint();
  if (trained_) {
    // A GPUNet trained from a user's JSON file rebuilds from the layer list the checkpoint carries.
    arch_ = &architecture_of_checkpoint(ckpt.meta, checkpoint);
    if (!o.arch.empty() && !same_architecture(find_architecture(o.arch), ckpt.meta)) {
      throw Error("--arch " + o.arch + " disagrees with --checkpoint " + checkpoint + ", a " +
                  ckpt.meta.at("arch").get<std::string>());
    }
    num_classes_ = ckpt.meta.at("num_classes").get<std::int64_t>();
    pre_ = preprocessing_from_json(ckpt.meta.at("preprocessing"));
    names_ = ckpt.meta.value("class_names", std::vector<std::string>{});
  } else {
    if (o.arch.empty()) {
      throw Error(options::name("checkpoint") + " " + checkpoint + " is a plain weights file; name its " +
                      options::name("arch"),
                  "e.g. " + options::setting("arch", "resnet50") + " for torchvision's resnet50-*.pth");
    }
    if (o.ema && !ckpt.has_ema())
      throw Error(options::name("ema") + ": " + checkpoint + " is a weights file with no EMA (no state_dict_ema)");
    arch_ = &find_architecture(o.arch);
    num_classes_ = o.num_classes ? *o.num_classes : runtime::classes_in_weights(*arch_, ckpt);
    pre_ = arch_->preprocessing;
  }
  name_classes();
  if (o.image_size > 0) pre_.input_size = o.image_size;
  rt_ = runtime::resolve_runtime(o.device, o.precision, o.memory_format);
  engine_name_ = resolve_engine(o.engine, rt_);
  check_graph_policy({o.graph_batch_sizes, o.graph_memory_mb});
  ModelOptions mo;
  mo.num_classes = num_classes_;
  model_ = build_model(*arch_, mo);
  runtime::load_weights(*model_, ckpt, o.ema ? "ema." : "model.", *arch_);
  runtime::prepare_model(*model_, rt_);
  quantized_ = ckpt.meta.contains("quantization") && !o.as_float;
  if (quantized_) {
    if (o.fold_bn) {
      throw Error("--fold-bn: " + checkpoint + " is quantization-aware; its quantized network folds its BatchNorms "
                  "already", "drop --fold-bn, or add --float to use the float weights folded");
    }
    plan_ = std::make_shared<quant::Plan>(quant::plan_from_json(ckpt.meta.at("quantization"), checkpoint));
    model_ = std::make_shared<quant::FakeQuantNetworkImpl>(model_, plan_);
  }
  model_->eval();
  if (o.fold_bn) fold_batchnorm(*model_);
  EngineSpec spec;
  spec.arch = arch_->name;
  spec.model = model_;
  spec.int8 = plan_.get();
  spec.pre = pre_;
  spec.num_classes = num_classes_;
  spec.rt = rt_;
  // A QAT network's fake quantization rounds on the host's schedule of observers: it stays eager.
  if (engine_name_ == "torch" && rt_.device.is_cuda() && o.cuda_graph && !quantized_) {
    engine_ = make_graphed_engine(std::move(spec), GraphPolicy{o.graph_batch_sizes, o.graph_memory_mb, o.fused_conv});
  } else {
    engine_ = make_engine(engine_name_, std::move(spec));
  }
}

void InferenceModel::open_onnx() {
  const auto& o = options_;
  const std::string& path = path_;
  auto bytes = read_file(path, "the ONNX file");
  const auto info = read_onnx_info(bytes, path);
  const auto& meta = info.metadata;
  for (const char* key : {"arch", "num_classes", "preprocessing"}) {
    if (!meta.count(key)) {
      throw Error(path + ": an ONNX file without convnets' metadata ('" + key + "' is missing)",
                  "classify and eval run ONNX files written by `convnets export`; for others use their runtime");
    }
  }
  if (o.ema) throw Error("--ema: " + path + " is an ONNX graph of one set of weights, chosen when it was exported");
  if (!o.arch.empty() && o.arch != meta.at("arch")) {
    throw Error("--arch " + o.arch + " disagrees with " + path + ", a " + meta.at("arch"));
  }
  quantized_ = meta.count("quantization") > 0;
  if (quantized_ && o.as_float) {
    throw Error("--float: " + path + " is an INT8 graph; its float weights are not in it",
                "evaluate the checkpoint it was exported from with --float");
  }
  trained_ = true;
  try {
    arch_ = &find_architecture(meta.at("arch"));
  } catch (const Error&) {
    throw Error(path + ": exported from arch '" + meta.at("arch") + "', which this convnets does not know");
  }
  num_classes_ = std::stoll(meta.at("num_classes"));
  pre_ = preprocessing_from_json(parse_json(meta.at("preprocessing"), path + " (metadata 'preprocessing')"));
  if (info.input_size > 0) pre_.input_size = static_cast<int>(info.input_size);  // an export's --image-size
  if (o.image_size > 0 && o.image_size != pre_.input_size) {
    throw Error("--image-size " + std::to_string(o.image_size) + ": " + path + " was exported for " +
                std::to_string(pre_.input_size) + "x" + std::to_string(pre_.input_size) + " input");
  }
  if (meta.count("class_names")) {
    names_ = parse_json(meta.at("class_names"), path + " (metadata 'class_names')").get<std::vector<std::string>>();
  }
  name_classes();
  // An ONNX graph runs where OpenVINO runs: on the CPU.
  rt_ = runtime::resolve_runtime(o.device == "auto" ? "cpu" : o.device, o.precision, o.memory_format);
  if (o.engine == "torch") {
    throw Error("--engine torch: " + path + " is an ONNX graph, and LibTorch runs convnets checkpoints",
                "use --engine openvino (or auto) for ONNX files, or give the checkpoint it was exported from");
  }
  engine_name_ = resolve_engine(o.engine == "auto" ? "openvino" : o.engine, rt_);
  EngineSpec spec;
  spec.arch = arch_->name;
  spec.onnx = std::move(bytes);
  spec.pre = pre_;
  spec.num_classes = num_classes_;
  spec.rt = rt_;
  engine_ = make_engine(engine_name_, std::move(spec));
}

std::vector<std::string> class_names_or_imagenet(std::vector<std::string> own, std::int64_t num_classes) {
  // 1000 classes and no names of its own: ImageNet-1k's, in the order every published ImageNet model uses.
  if (own.empty() && num_classes == 1000) own = imagenet1k_class_names();
  if (own.size() != static_cast<std::size_t>(num_classes)) own.clear();
  return own;
}

void InferenceModel::name_classes() {
  names_ = class_names_or_imagenet(std::move(names_), num_classes_);
  named_ = !names_.empty();
  if (named_) return;
  names_.clear();
  for (std::int64_t i = 0; i < num_classes_; ++i) names_.push_back(std::to_string(i));
}

NetworkImpl& InferenceModel::network() const {
  if (!model_) throw Error(path_ + " is an ONNX graph: it has no LibTorch network");
  return *model_;
}

at::Tensor InferenceModel::logits(const at::Tensor& batch) const {
  if (batch.scalar_type() == at::kByte) return engine_->logits(batch);  // checks the [B, H, W, 1|3] shape
  if (batch.dim() != 4 || batch.size(1) != 3 || !batch.is_floating_point()) {
    throw Error("expected a batch of uint8 [B, H, W, 3] pixels or normalised float [B, 3, H, W] images, got " +
                std::string(c10::toString(batch.scalar_type())) + " of shape " + c10::str(batch.sizes()));
  }
  return engine_->logits_of_input(batch);
}

std::string InferenceModel::describe_engine() const {
  std::string s = engine_name_ == "openvino" ? "openvino " + openvino_version() : "torch (LibTorch " TORCH_VERSION ")";
  s += std::string(options_.engine == "auto" ? " (auto)" : "") + ", " + rt_.precision + " on " + rt_.device.str();
  if (!rt_.device.is_cuda()) s += " (" + std::to_string(at::get_num_threads()) + " threads)";
  if (quantized_) {
    s += engine_name_ == "openvino" ? ", INT8 kernels" : ", INT8 fake-quantized";
    s += model_ ? " (the QAT run's ranges)" : " (the graph's calibrated ranges)";
  }
  if (const auto graphs = describe_graphs(*engine_); !graphs.empty()) s += ", " + graphs;
  return s;
}

std::vector<Prediction> InferenceModel::classify(const std::vector<std::string>& paths, std::int64_t top_k,
                                                 std::int64_t batch_size, std::int64_t max_image_pixels) const {
  if (batch_size < 1) throw Error("--batch-size must be at least 1, got " + std::to_string(batch_size));
  if (top_k < 1) throw Error("--top-k must be at least 1, got " + std::to_string(top_k));
  auto topts = data::TransformOptions::eval(pre_.input_size, pre_.crop_ratio,
                                            data::parse_filter(pre_.interpolation, "interpolation"));
  topts.max_pixels = max_image_pixels;
  const data::Transform transform(topts);
  const std::int64_t k = std::min<std::int64_t>(top_k, num_classes_);
  const std::int64_t side = pre_.input_size, pixels = side * side * 3;

  std::vector<Prediction> results(paths.size());
  for (std::size_t begin = 0; begin < paths.size(); begin += static_cast<std::size_t>(batch_size)) {
    const std::size_t end = std::min(paths.size(), begin + static_cast<std::size_t>(batch_size));
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
                           // The loader's reader: a FIFO or a folder is named, not waited on.
                           data::read_image_file(r.path, s.bytes);
                           transform.apply(s, rng, ws,
                                           batch.data_ptr<std::uint8_t>() + (i - static_cast<std::int64_t>(begin)) * pixels,
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
    const auto out = logits(good).cpu();
    const auto [probs, indices] = torch::softmax(out, 1).topk(k, 1);
    for (std::size_t j = 0; j < ok.size(); ++j) {
      auto& r = results[begin + static_cast<std::size_t>(ok[j])];
      for (std::int64_t c = 0; c < k; ++c) {
        r.top.emplace_back(indices[static_cast<std::int64_t>(j)][c].item<std::int64_t>(),
                           probs[static_cast<std::int64_t>(j)][c].item<double>());
      }
    }
  }
  return results;
}

nlohmann::ordered_json InferenceModel::to_json(const std::vector<Prediction>& predictions) const {
  auto list = nlohmann::ordered_json::array();
  std::size_t failed = 0;
  for (const auto& r : predictions) {
    nlohmann::ordered_json j{{"path", r.path}};
    if (!r.error.empty()) {
      j["error"] = r.error;
      ++failed;
    } else {
      auto top = nlohmann::ordered_json::array();
      for (const auto& [index, p] : r.top) {
        top.push_back({{"class", names_[static_cast<std::size_t>(index)]}, {"index", index}, {"probability", p}});
      }
      j["top"] = std::move(top);
    }
    list.push_back(std::move(j));
  }
  return {{"checkpoint", path_},
          {"arch", arch_->name},
          {"weights", options_.ema ? "ema" : "model"},
          {"quantized", quantized_},
          {"engine", engine_name_},
          {"precision", rt_.precision},
          {"preprocessing", convnets::to_json(pre_)},
          {"images", predictions.size()},
          {"failed", failed},
          {"results", std::move(list)}};
}

}  // namespace convnets::deploy
