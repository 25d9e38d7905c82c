#include "runtime/checkpoint.h"

#include "core/error.h"
#include "core/json.h"
#include "io/state_dict.h"
#include "io/torch_save.h"
#include "models/registry.h"

namespace convnets::runtime {

TensorFile Checkpoint::section(const std::string& prefix) const {
  TensorFile out;
  for (const auto& [name, tensor] : file.tensors) {
    if (name.rfind(prefix, 0) == 0) out.tensors.emplace_back(name.substr(prefix.size()), tensor);
  }
  if (!is_training_checkpoint() && prefix == "model.") out.tensors = file.tensors;
  return out;
}

Checkpoint load_checkpoint(const std::string& path) {
  Checkpoint c;
  c.path = path;
  // PyTorch's own files (torchvision, timm, DLE, NGC) are plain weights files here.
  c.file = looks_like_torch_save(path) ? load_torch_save(path) : load_safetensors(path);
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
  return c;
}

std::int64_t classes_in_weights(const ArchInfo& arch, const Checkpoint& ckpt) {
  auto probe = build_model(arch, {});
  const auto key = probe->named_parameters().keys().back();
  for (const auto& [name, t] : ckpt.file.tensors) {
    if (imported_name(name, arch.import_key) == key && t.dim() >= 1) return t.size(0);
  }
  throw Error(ckpt.path + ": no classifier '" + key + "' in it; is it a " + arch.name + "?");
}

void load_weights(torch::nn::Module& model, const Checkpoint& ckpt, const std::string& prefix,
                  const std::function<std::string(const std::string&)>& import_key) {
  const auto section = ckpt.section(prefix);
  if (section.tensors.empty()) throw Error(ckpt.path + ": no '" + prefix + "*' weights in it");
  load_state_dict(model, section, ckpt.path, import_key, /*strict=*/true);
}

void save_checkpoint(const std::string& path, const NamedTensors& tensors, const nlohmann::json& meta) {
  save_safetensors(path, tensors, {{"convnets", dump_json(meta)}, {"format", "pt"}});
}

}  // namespace convnets::runtime
