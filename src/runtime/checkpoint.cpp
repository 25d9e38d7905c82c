#include "runtime/checkpoint.h"

#include "core/error.h"
#include "core/json.h"
#include "core/options.h"
#include "io/state_dict.h"
#include "io/torch_save.h"
#include "io/weights_format.h"
#include "models/registry.h"

#include <unordered_set>

namespace convnets::runtime {

TensorFile Checkpoint::section(const std::string& prefix) const {
  TensorFile out;
  for (const auto& [name, tensor] : file.tensors) {
    if (name.rfind(prefix, 0) == 0) out.tensors.emplace_back(name.substr(prefix.size()), tensor);
  }
  if (!is_training_checkpoint() && prefix == "model.") out.tensors = file.tensors;
  if (!is_training_checkpoint() && prefix == "ema." && torch_save) out.tensors = torch_save->ema;
  return out;
}

bool Checkpoint::has_ema() const {
  if (!is_training_checkpoint() && torch_save) return !torch_save->ema.empty();
  for (const auto& [name, tensor] : file.tensors) {
    if (name.rfind("ema.", 0) == 0) return true;
  }
  return false;
}

Checkpoint load_checkpoint(const std::string& path, const std::string& key_layout) {
  options::check(options::key_layout, key_layout);
  Checkpoint c;
  c.path = path;
  c.key_layout = key_layout;
  // PyTorch's own files (torchvision, timm, DLE, NGC) are plain weights files here.
  if (weights_format(path) == WeightsFormat::TorchSave) {
    auto contents = std::make_shared<TorchSaveContents>(read_torch_save(path));
    c.file = std::move(contents->weights);  // the rest of the file stays in torch_save
    c.torch_save = std::move(contents);
  } else {
    c.file = load_safetensors(path);
  }
  c.meta = nlohmann::json::object();
  auto it = c.file.metadata.find("convnets");
  if (it == c.file.metadata.end()) return c;
  try {
    c.meta = parse_json(it->second, path + ": checkpoint metadata 'convnets'");
  } catch (const Error& e) {
    throw Error(e.what(), "the file is damaged; use another checkpoint (e.g. epoch-N or best)");
  }
  const std::string format = c.meta.is_object() ? c.meta.value("format", "") : "";
  const std::string family = "convnets-checkpoint/";
  if (format.rfind(family, 0) == 0 && format != kCheckpointFormat) {
    throw Error(path + ": checkpoint format " + format + " is not " + kCheckpointFormat +
                    ", the one this convnets reads (written by a newer or older convnets)",
                "use the convnets version that wrote it");
  }
  if (format != kCheckpointFormat) {
    throw Error(path + ": metadata 'convnets' is not a " + std::string(kCheckpointFormat) + " record");
  }
  for (const char* key : {"arch", "num_classes", "epoch", "step", "config", "preprocessing"}) {
    if (!c.meta.contains(key)) throw Error(path + ": checkpoint metadata lacks '" + std::string(key) + "'");
  }
  // The record says what save_checkpoint summed, so that removing every checksum key is caught as removing one is.
  if (c.meta.value("checksums", "") == kCheckpointChecksums &&
      c.file.verified != TensorFile::Verified::BytesAndHeader) {
    throw Error(path + ": its metadata says every tensor's bytes and header entry were summed (" +
                    kCheckpointChecksums + "), but the file holds no " + kChecksumKey + " and " +
                    kHeaderChecksumKey + " to check them against",
                "the file was edited after it was written: use another checkpoint (e.g. epoch-N or best)");
  }
  return c;
}

namespace {

std::vector<std::string> keys_of(const torch::nn::Module& model) {
  std::vector<std::string> keys;
  for (const auto& [name, tensor] : state_dict(model)) keys.push_back(name);
  return keys;
}

std::string listed(const std::vector<std::string>& names) { return join(names, " | "); }

// The classifier's width in `tensors` read under `layout`: its last parameter (every arch registers it last).
std::int64_t classifier_width(const NetworkImpl& probe, const Checkpoint& ckpt, const ArchInfo& arch,
                              const KeyLayout& layout) {
  const auto key = probe.named_parameters().keys().back();
  for (const auto& [name, t] : ckpt.file.tensors) {
    if (imported_name(name, layout.map) == key && t.dim() >= 1) return t.size(0);
  }
  throw Error(ckpt.path + ": no classifier '" + key + "' in it; is it a " + arch.name + "?");
}

}  // namespace

const KeyLayout& key_layout_of(const Checkpoint& ckpt, const ArchInfo& arch, const NamedTensors& tensors,
                               const std::vector<std::string>& model_keys, std::string* tried) {
  if (arch.key_layouts.empty()) throw Error("arch " + arch.name + " declares no key layout");
  if (ckpt.key_layout != "auto") {
    if (const KeyLayout* forced = find_key_layout(arch, ckpt.key_layout)) return *forced;
    std::vector<std::string> names;
    for (const auto& layout : arch.key_layouts) names.insert(names.end(), layout.names.begin(), layout.names.end());
    throw Error(options::setting("key_layout", ckpt.key_layout) + ": " + arch.name + "'s weights files come as " +
                listed(names) + " (or auto)");
  }
  // convnets wrote it: the arch's own names, nothing to detect.
  if (ckpt.is_training_checkpoint() && !ckpt.torch_save) return arch.key_layouts.front();
  const std::unordered_set<std::string> model(model_keys.begin(), model_keys.end());
  const KeyLayout* best = nullptr;
  std::size_t best_hits = 0;
  for (const auto& layout : arch.key_layouts) {
    std::size_t hits = 0;
    for (const auto& [raw, tensor] : tensors) hits += model.count(imported_name(raw, layout.map));
    if (tried) {
      *tried += "  " + listed(layout.names) + ": " + std::to_string(hits) + " of the file's " +
                std::to_string(tensors.size()) + " tensors are the model's\n";
    }
    if (!best || hits > best_hits) {
      best = &layout;
      best_hits = hits;
    }
  }
  return *best;
}

std::int64_t classes_in_weights(const ArchInfo& arch, const Checkpoint& ckpt) {
  ModelOptions mo;
  mo.initialize = false;  // only the names
  auto probe = build_model(arch, mo);
  return classifier_width(*probe, ckpt, arch, key_layout_of(ckpt, arch, ckpt.file.tensors, keys_of(*probe)));
}

Checkpoint import_dle_checkpoint(const Checkpoint& file, const ArchInfo& arch) {
  const std::string& path = file.path;
  const auto plain = file.file.metadata.count("torch_save")
                         ? parse_json(file.file.metadata.at("torch_save"), path + ": checkpoint values")
                         : nlohmann::json::object();
  if (file.torch_save && !file.torch_save->optimizer_problem.empty()) throw Error(file.torch_save->optimizer_problem);
  if (!file.torch_save || !plain.contains("epoch") || !file.torch_save->has_optimizer) {
    throw Error(path + ": not a DLE training checkpoint (main.py's checkpoint.pth.tar holds epoch, state_dict and "
                    "optimizer; this file holds " + (plain.empty() ? std::string("weights only") : plain.dump()) + ")",
                "use --fine-tune to start a new run from its weights");
  }
  if (!plain.at("epoch").is_number_integer() || plain.at("epoch").get<std::int64_t>() < 0)
    throw Error(path + ": its epoch " + plain.at("epoch").dump() + " is not an epoch count");
  if (plain.contains("best_prec1") && !plain.at("best_prec1").is_number())
    throw Error(path + ": its best_prec1 " + plain.at("best_prec1").dump() + " is not a top-1");
  const TorchSaveContents& t = *file.torch_save;
  ModelOptions mo;
  mo.initialize = false;  // only the names: the shapes come from the file
  const auto model = build_model(arch, mo);
  const auto params = model->named_parameters();
  const auto& layout = key_layout_of(file, arch, file.file.tensors, keys_of(*model));
  const std::int64_t num_classes = classifier_width(*model, file, arch, layout);

  // DLE's named_parameters() order is its state_dict's order without the buffers.
  std::vector<std::string> dle_names, names;
  std::vector<at::Tensor> weights;
  for (const auto& [raw, tensor] : file.file.tensors) {
    const std::string name = imported_name(raw, layout.map);
    if (!params.contains(name)) continue;
    dle_names.push_back(raw);
    names.push_back(name);
    weights.push_back(tensor);
  }
  std::vector<std::size_t> order;  // parameter indices in the optimizer's id order
  std::size_t grouped = 0;
  for (const auto& g : t.optimizer_groups) grouped += g.size();
  const auto describe = [&] {
    std::string sizes;
    for (const auto& g : t.optimizer_groups) sizes += (sizes.empty() ? "" : " + ") + std::to_string(g.size());
    return std::to_string(t.optimizer_groups.size()) + " param group(s) of " + (sizes.empty() ? "0" : sizes) +
           " parameters, the model " + std::to_string(params.size());
  };
  if (names.size() != params.size() || grouped != names.size()) {
    throw Error(path + ": its optimizer state does not match " + arch.name + "'s parameters (" + describe() + ", " +
                std::to_string(names.size()) + " of them in its state_dict)",
                "resume with the --arch it was trained as, or use --fine-tune to start a new optimizer");
  }
  if (t.optimizer_groups.size() == 1) {
    for (std::size_t i = 0; i < names.size(); ++i) order.push_back(i);
  } else if (t.optimizer_groups.size() == 2) {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (dle_names[i].find("bn") != std::string::npos) order.push_back(i);
    if (order.size() != t.optimizer_groups[0].size()) {
      throw Error(path + ": its optimizer's param groups are not DLE's (" + describe() + "; DLE's first group holds the " +
                  std::to_string(order.size()) + " parameters named *bn*)");
    }
    for (std::size_t i = 0; i < names.size(); ++i)
      if (dle_names[i].find("bn") == std::string::npos) order.push_back(i);
  } else {
    throw Error(path + ": its optimizer's param groups are not DLE's (" + describe() + ")");
  }

  Checkpoint c;
  c.path = path;
  // In convnets' names, as a convnets checkpoint holds them: read again, they need no layout.
  for (const auto& [raw, tensor] : file.file.tensors)
    c.file.tensors.emplace_back("model." + imported_name(raw, layout.map), tensor);
  for (const auto& [raw, tensor] : t.ema) c.file.tensors.emplace_back("ema." + imported_name(raw, layout.map), tensor);
  // DLE builds torch.optim.SGD (momentum_buffer) or, with --optimizer rmsprop, torch.optim.RMSprop (square_avg, a
  // momentum_buffer with momentum; its step count is a scalar the reader leaves out), which convnets' rmsprop
  // continues.
  const bool rmsprop = t.optimizer_kind == "rmsprop";
  std::size_t at = 0;
  for (const auto& g : t.optimizer_groups) {
    for (const std::int64_t id : g) {
      const std::size_t p = order[at++];
      at::Tensor momentum, square_avg;
      if (const auto it = t.optimizer_state.find(id); it != t.optimizer_state.end()) {
        for (const auto& [key, buffer] : it->second) {
          if (key == "momentum_buffer") momentum = buffer;
          else if (rmsprop && key == "square_avg") square_avg = buffer;
          else throw Error(path + ": its optimizer state holds '" + key + "', not torch.optim.SGD's momentum_buffer "
                           "or a (not centered) torch.optim.RMSprop's square_avg",
                           "convnets resumes DLE's SGD and RMSprop runs; use --fine-tune to start a new optimizer "
                           "from its weights");
        }
      }
      // Either optimizer creates its buffers at a parameter's first step: none yet is zero.
      if (!momentum.defined()) momentum = at::zeros_like(weights[p]);
      if (rmsprop) c.file.tensors.emplace_back("optimizer.square_avg." + names[p],
                                               square_avg.defined() ? square_avg : at::zeros_like(weights[p]));
      c.file.tensors.emplace_back("optimizer.momentum." + names[p], momentum);
    }
  }
  c.meta = {{"format", kCheckpointFormat},
            {"arch", arch.name},
            {"num_classes", num_classes},
            {"epoch", plain.at("epoch")},
            {"step", 0},
            {"step_in_epoch", 0},
            {"best_top1", plain.value("best_prec1", -1.0)},
            {"config", {{"optimizer", rmsprop ? "rmsprop" : "sgd"}}},
            {"preprocessing", to_json(arch.preprocessing)},
            {"imported_from", "DLE main.py checkpoint"}};
  return c;
}

void load_weights(torch::nn::Module& model, const Checkpoint& ckpt, const std::string& prefix, const ArchInfo& arch) {
  const auto section = ckpt.section(prefix);
  if (section.tensors.empty()) throw Error(ckpt.path + ": no '" + prefix + "*' weights in it");
  std::string tried;
  const auto& layout = key_layout_of(ckpt, arch, section.tensors, keys_of(model), &tried);
  try {
    load_state_dict(model, section, ckpt.path, layout.map, /*strict=*/true);
  } catch (const Error& e) {
    if (ckpt.key_layout != "auto" || arch.key_layouts.size() < 2) throw;
    std::string what = e.what();
    if (!what.empty() && what.back() != '\n') what += '\n';
    throw Error(what + "key layouts of " + arch.name + " (" + options::name("key_layout") +
                    " auto took the first best):\n" + tried,
                e.hint());
  }
}

LoadReport load_fitting_weights(torch::nn::Module& model, const Checkpoint& ckpt, const std::string& prefix,
                                const ArchInfo& arch) {
  const auto section = ckpt.section(prefix);
  const auto& layout = key_layout_of(ckpt, arch, section.tensors, keys_of(model));
  return load_state_dict(model, section, ckpt.path, layout.map, /*strict=*/false);
}

void save_checkpoint(const std::string& path, const NamedTensors& tensors, const nlohmann::json& meta) {
  nlohmann::json record = meta;
  record["checksums"] = kCheckpointChecksums;
  save_safetensors(path, tensors, {{"convnets", dump_json(record)}, {"format", "pt"}});
}

}  // namespace convnets::runtime
