// Reading PyTorch's torch.save files (torchvision, timm, DLE and NGC checkpoints) in C++, with an unpickler that runs no code: only an allow-list of classes is rebuilt.
#pragma once

#include "io/safetensors.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace convnets {

// Whether `head` (a file's first bytes; 23 are enough) begins as torch.save's pre-1.6 format does: a pickle whose
// first object is torch's magic number. read_torch_save refuses such a file by name.
bool is_legacy_torch_save(const void* head, std::size_t n);

// The Error read_torch_save would throw for a file that is not a torch.save zip archive (one that PyTorch's own
// reader opens and that holds data.pkl), else nothing; what data.pkl holds is not looked at.
std::optional<Error> torch_save_archive_problem(const std::string& path);
std::optional<Error> torch_save_archive_problem(const void* data, std::size_t size, const std::string& name);

// The weights in a torch.save file, as a plain weights file: the tensors of
// the state dict, found as the whole object (torchvision's resnet50-*.pth),
// or under "state_dict" (DLE, NGC, timm's training checkpoints), "model" or
// "model_state_dict". The checkpoint's other plain values (epoch, arch, best
// top-1, the argparse arguments) go to `metadata` as JSON text under
// "torch_save".
//
// Unpickling builds only tensors and their storages, dict/OrderedDict, list,
// tuple, numbers, strings, bytes, None and argparse.Namespace (read as a
// dict); any other class is an Error naming it, and nothing of it runs. Every
// malformed input (truncated pickle, a storage out of the archive's bounds, a
// view past its storage, big-endian data, the pre-1.6 format) throws
// convnets::Error naming `path`.
TensorFile load_torch_save(const std::string& path);

// A training checkpoint's parts beyond its weights, as DLE's main.py
// (checkpoint.pth.tar: epoch, best_prec1, state_dict, optimizer,
// state_dict_ema) and timm's CheckpointSaver write them.
struct TorchSaveContents {
  TensorFile weights;  // what load_torch_save returns
  NamedTensors ema;    // "state_dict_ema"; empty when absent
  // torch.optim.Optimizer.state_dict(), when the file holds one under
  // "optimizer": each param group's parameter ids in order, and each id's
  // state tensors by name ("momentum_buffer", "square_avg", ...). Ids are
  // numbered through the groups in order, as torch.optim numbers them.
  bool has_optimizer = false;
  // Why an "optimizer" entry was not read as one (its weights are still
  // usable); empty when it was read or absent.
  std::string optimizer_problem;
  std::vector<std::vector<std::int64_t>> optimizer_groups;
  std::map<std::int64_t, NamedTensors> optimizer_state;
  // "rmsprop" for torch.optim.RMSprop's state_dict (a param group's "alpha", or a "square_avg" buffer), else
  // empty.
  std::string optimizer_kind;
};

TorchSaveContents read_torch_save(const std::string& path);

// The same from bytes in memory (the fuzz target); `name` names them in errors.
TorchSaveContents read_torch_save_bytes(const void* data, std::size_t size, const std::string& name);

}  // namespace convnets
