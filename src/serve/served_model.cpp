#include "serve/served_model.h"

#include "core/error.h"
#include "core/json.h"
#include "data/rng.h"
#include "data/transforms.h"
#include "deploy/graph_engine.h"
#include "deploy/triton_config.h"
#include "deploy/triton_repo.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <system_error>

namespace convnets::serve {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

// The three inputs a served model takes; a request carries exactly one of them.
constexpr const char* kImages = "INPUT";   // encoded JPEG/PNG bytes, the exported ensemble's input name
constexpr const char* kTensor = "input";   // normalised float [B, 3, S, S], the exported ONNX graph's
constexpr const char* kPixels = "PIXELS";  // uint8 [B, S, S, 3], decoded, resized and cropped, not normalised
constexpr const char* kLogits = "logits";  // the exported ONNX graph's output name
constexpr const char* kLogitsAlias = "LOGITS";  // the exported ensemble's: the same tensor under its name

// The server's inference options for a model: on CUDA graphs without --graph-batch-sizes, the sizes of
// serving_graph_sizes(--max-batch-size) (the CPU's engines ignore them).
deploy::InferenceOptions with_graph_sizes(deploy::InferenceOptions io, const BatchingOptions& batching) {
  if (io.graph_batch_sizes.empty()) io.graph_batch_sizes = serving_graph_sizes(batching.max_batch_size);
  return io;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// `want`: -1 for the batch dimension.
void expect(const Tensor& t, DataType type, const std::vector<std::int64_t>& want) {
  if (t.datatype != type) {
    throw ProtocolError(400, "input '" + t.name + "': expected datatype " + datatype_name(type) + ", got " +
                                 datatype_name(t.datatype));
  }
  bool ok = t.shape.size() == want.size();
  for (std::size_t i = 0; ok && i < want.size(); ++i) ok = want[i] < 0 ? t.shape[i] >= 1 : t.shape[i] == want[i];
  if (!ok) {
    auto shown = want;
    shown[0] = -1;
    throw ProtocolError(400, "input '" + t.name + "': expected shape " + shape_text(shown) + " (-1: the batch), got " +
                                 shape_text(t.shape));
  }
}

Tensor logits_tensor(const std::string& name, const at::Tensor& logits) {
  Tensor t;
  t.name = name;
  t.datatype = DataType::Fp32;
  t.shape = {logits.size(0), logits.size(1)};
  t.data.assign(static_cast<const char*>(logits.data_ptr()), static_cast<std::size_t>(logits.numel()) * sizeof(float));
  return t;
}

}  // namespace

ServedModel::ServedModel(std::string name, std::string path, const deploy::InferenceOptions& inference,
                         const BatchingOptions& asked, std::int64_t max_image_pixels)
    : name_(std::move(name)), path_(std::move(path)), model_(path_, with_graph_sizes(inference, asked)) {
  const auto& pre = model_.preprocessing();
  auto topts = data::TransformOptions::eval(pre.input_size, pre.crop_ratio,
                                            data::parse_filter(pre.interpolation, "interpolation"));
  if (max_image_pixels > 0) topts.max_pixels = max_image_pixels;
  transform_ = std::make_unique<data::Transform>(topts);
  // On CUDA graphs, a graph per size the batches will take, each captured now rather than during a request, and
  // the batcher fills them (Triton's preferred sizes).
  const bool graphed = !deploy::describe_graphs(model_.engine()).empty();
  auto batching = graphed ? batching_for_graphs(asked, model_.options().graph_batch_sizes) : asked;
  std::vector<std::int64_t> warm{1};
  if (graphed) {
    for (const auto rows : model_.options().graph_batch_sizes) {
      if (rows > 1 && rows <= batching.max_batch_size) warm.push_back(rows);
    }
  }
  for (const auto rows : warm) model_.logits(at::zeros({rows, side(), side(), 3}, at::kByte));
  batcher_ = std::make_unique<Batcher>(batching, [this](const at::Tensor& rows) {
    return model_.logits(rows).to(at::kFloat).cpu().contiguous();
  });
}

ServedModel::~ServedModel() = default;

at::Tensor ServedModel::rows_of(const InferRequest& r) const {
  if (r.inputs.size() != 1) {
    throw ProtocolError(400, "model '" + name_ + "' takes one input per request: " + std::string(kImages) +
                                 " (BYTES, encoded JPEG/PNG images), " + kTensor + " (FP32 [B, 3, " +
                                 std::to_string(side()) + ", " + std::to_string(side()) + "], normalised) or " +
                                 kPixels + " (UINT8 [B, " + std::to_string(side()) + ", " + std::to_string(side()) +
                                 ", 3]); the request has " + std::to_string(r.inputs.size()));
  }
  for (const auto& out : r.outputs) {
    if (out.name != kLogits && out.name != kLogitsAlias) {
      throw ProtocolError(400, "unknown output '" + utf8_escaped(out.name) + "' for model '" + name_ +
                                   "': it has one, " + kLogits + " (or " + kLogitsAlias + ")");
    }
  }
  const Tensor& t = r.inputs[0];
  const std::int64_t s = side();
  if (t.name == kImages) return decode_images(t);
  if (t.name == kTensor) {
    expect(t, DataType::Fp32, {-1, 3, s, s});
    auto rows = at::empty({t.shape[0], 3, s, s}, at::kFloat);
    std::memcpy(rows.data_ptr(), t.data.data(), t.data.size());
    return rows;
  }
  if (t.name == kPixels) {
    expect(t, DataType::UInt8, {-1, s, s, 3});
    auto rows = at::empty({t.shape[0], s, s, 3}, at::kByte);
    std::memcpy(rows.data_ptr(), t.data.data(), t.data.size());
    return rows;
  }
  throw ProtocolError(400, "unknown input '" + utf8_escaped(t.name) + "' for model '" + name_ + "': expected " +
                               kImages + ", " + kTensor + " or " + kPixels);
}

InferResponse ServedModel::respond(const InferRequest& r, const at::Tensor& logits) const {
  InferResponse resp;
  resp.model_name = name_;
  resp.model_version = "1";
  resp.id = r.id;
  std::vector<RequestedOutput> outs = r.outputs;
  if (outs.empty()) outs.push_back({kLogits, r.binary_data_output, 0});
  for (const auto& want : outs) {
    resp.outputs.push_back(want.classification > 0 ? classification(want.name, logits, want.classification)
                                                   : logits_tensor(want.name, logits));
    resp.binary.push_back(want.binary || r.binary_data_output);
  }
  return resp;
}

std::string ServedModel::metadata() const {
  const std::int64_t s = side();
  return dump_json(Json{{"name", name_},
                        {"versions", {"1"}},
                        {"platform", "convnets_" + model_.engine_name()},
                        {"inputs",
                         {{{"name", kImages}, {"datatype", "BYTES"}, {"shape", {-1, 1}}},
                          {{"name", kTensor}, {"datatype", "FP32"}, {"shape", {-1, 3, s, s}}},
                          {{"name", kPixels}, {"datatype", "UINT8"}, {"shape", {-1, s, s, 3}}}}},
                        {"outputs", {{{"name", kLogits}, {"datatype", "FP32"}, {"shape", {-1, model_.num_classes()}}}}}});
}

std::string ServedModel::config() const {
  const auto& b = batcher_->options();
  const std::int64_t s = side();
  deploy::ModelConfig c;
  c.name = name_;
  c.platform = "convnets_" + model_.engine_name();
  c.max_batch_size = b.max_batch_size;
  c.inputs = {{kImages, "TYPE_STRING", {1}, "", ""},
              {kTensor, "TYPE_FP32", {3, s, s}, "", ""},
              {kPixels, "TYPE_UINT8", {s, s, 3}, "", ""}};
  c.outputs = {{kLogits, "TYPE_FP32", {model_.num_classes()}, "", model_.has_class_names() ? "labels.txt" : ""}};
  c.dynamic_batching = b;
  c.instance_group = {b.instances, model_.runtime().device.is_cuda() ? "KIND_GPU" : "KIND_CPU"};
  c.parameters = {{"arch", model_.arch().name},
                  {"engine", model_.describe_engine()},
                  {"preprocessing", dump_json(convnets::to_json(model_.preprocessing()))}};
  return deploy::config_json(c);
}

std::string ServedModel::describe(const BatchingOptions& asked) const {
  const auto& own = batcher_->options().preferred_batch_sizes;
  std::string batching;
  if (own != asked.preferred_batch_sizes) {
    for (auto s : own) batching += (batching.empty() ? "; preferred batch sizes " : ",") + std::to_string(s);
    batching += " (its largest CUDA graph)";
  }
  return model_.arch().name + ", " + std::to_string(model_.num_classes()) + " classes, " + std::to_string(side()) +
         "x" + std::to_string(side()) + " input; " + model_.describe_engine() + batching;
}

at::Tensor ServedModel::decode_images(const Tensor& t) const {
  std::vector<std::string_view> images;
  if (t.datatype == DataType::Bytes) {
    const bool ok = (t.shape.size() == 1 || (t.shape.size() == 2 && t.shape[1] == 1)) && !t.elements.empty();
    if (!ok) {
      throw ProtocolError(400, "input '" + t.name + "': expected BYTES of shape [-1, 1] or [-1] (one encoded image "
                                   "per element), got " + shape_text(t.shape));
    }
    for (const auto& e : t.elements) images.emplace_back(e);
  } else if (t.datatype == DataType::UInt8) {
    // The exported ensemble's form: one image's bytes as a UINT8 vector.
    if (!(t.shape.size() == 1 || (t.shape.size() == 2 && t.shape[0] == 1)) || t.data.empty()) {
      throw ProtocolError(400, "input '" + t.name + "': UINT8 carries one encoded image, shape [1, -1] or [-1]; got " +
                                   shape_text(t.shape));
    }
    images.emplace_back(t.data);
  } else {
    throw ProtocolError(400, "input '" + t.name + "': expected datatype BYTES (encoded images), got " +
                                 datatype_name(t.datatype));
  }
  const auto n = static_cast<std::int64_t>(images.size());
  if (n > batcher_->options().max_batch_size) {
    throw ProtocolError(400, "input '" + t.name + "': a batch of " + std::to_string(n) + " images exceeds the "
                                 "model's max_batch_size of " + std::to_string(batcher_->options().max_batch_size));
  }
  const std::int64_t s = side(), pixels = s * s * 3;
  auto rows = at::empty({n, s, s, 3}, at::kByte);
  thread_local data::Workspace ws;
  data::Rng rng(0);  // eval transforms draw nothing
  for (std::int64_t i = 0; i < n; ++i) {
    data::SampleData sample;
    sample.name = t.name + "[" + std::to_string(i) + "]";
    const auto& img = images[static_cast<std::size_t>(i)];
    sample.bytes.assign(img.begin(), img.end());
    try {
      transform_->apply(sample, rng, ws, rows.data_ptr<std::uint8_t>() + i * pixels, nullptr);
    } catch (const std::bad_alloc&) {
      throw ProtocolError(413, sample.name + ": out of memory while decoding it");
    } catch (const std::exception& e) {
      throw ProtocolError(400, e.what());
    }
  }
  return rows;
}

// Triton's classification extension: per row the top k as "value:index[:label]", the value the output's own
// (here a logit), best first.
Tensor ServedModel::classification(const std::string& name, const at::Tensor& logits, std::int64_t k) const {
  k = std::min(k, logits.size(1));
  const auto [values, indices] = at::topk(logits, k, 1);
  Tensor t;
  t.name = name;
  t.datatype = DataType::Bytes;
  t.shape = {logits.size(0), k};
  const auto v = values.accessor<float, 2>();
  const auto idx = indices.accessor<std::int64_t, 2>();
  for (std::int64_t i = 0; i < logits.size(0); ++i) {
    for (std::int64_t j = 0; j < k; ++j) {
      std::string s = std::to_string(v[i][j]) + ":" + std::to_string(idx[i][j]);
      if (model_.has_class_names()) s += ":" + model_.class_names()[static_cast<std::size_t>(idx[i][j])];
      t.elements.push_back(std::move(s));
    }
  }
  return t;
}

std::vector<std::pair<std::string, std::string>> served_model_paths(const std::vector<std::string>& specs) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& spec : specs) {
    std::string name, path = spec;
    const auto eq = spec.find('=');
    if (eq != std::string::npos && !fs::exists(spec)) {
      name = spec.substr(0, eq);
      path = spec.substr(eq + 1);
    }
    std::error_code ec;
    if (!fs::exists(path, ec)) throw Error(path + ": no such file or folder (serve MODEL)", {}, ErrorKind::NotFound);
    if (fs::is_directory(path, ec)) {
      if (!name.empty()) throw Error(spec + ": a Triton model repository folder names its own models; give its path alone");
      std::size_t found = 0;
      std::vector<fs::path> entries;
      for (const auto& e : fs::directory_iterator(path)) entries.push_back(e.path());
      std::sort(entries.begin(), entries.end());
      for (const auto& dir : entries) {
        if (!fs::is_directory(dir)) continue;
        // The highest numeric version folder holding model.onnx, as Triton's default version policy serves.
        long best = -1;
        for (const auto& v : fs::directory_iterator(dir)) {
          const auto vn = v.path().filename().string();
          if (vn.empty() || !std::all_of(vn.begin(), vn.end(), ::isdigit) || vn.size() > 9) continue;
          if (fs::exists(v.path() / "model.onnx")) best = std::max(best, std::stol(vn));
        }
        if (best < 0) continue;  // the DALI step and the ensemble: convnets' own pipeline does their work
        out.emplace_back(dir.filename().string(), (dir / std::to_string(best) / "model.onnx").string());
        ++found;
      }
      if (found == 0) {
        throw Error(path + ": a folder with no NAME/VERSION/model.onnx in it; serve takes checkpoints, weights and "
                           "ONNX files, or a Triton model repository that `convnets export --format triton` wrote");
      }
      continue;
    }
    if (name.empty()) name = fs::path(path).stem().string();
    out.emplace_back(name, path);
  }
  std::map<std::string, int> seen;
  for (const auto& [name, path] : out) {
    if (!deploy::valid_triton_model_name(name)) {
      throw Error("serve: model name '" + utf8_escaped(name) + "' (for " + path + ") must be letters, digits, '_', '-' "
                  "or '.', not starting with '.'", "name it with NAME=PATH");
    }
    if (seen[name]++) throw Error("serve: two models are named '" + name + "'", "name them apart with NAME=PATH");
  }
  return out;
}

}  // namespace convnets::serve
