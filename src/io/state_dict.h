// PyTorch-ordered state dicts of LibTorch modules, and loading weights with a full mismatch report.
#pragma once

#include "io/safetensors.h"

#include <torch/nn/module.h>

#include <functional>
#include <string>
#include <vector>

namespace convnets {

// Parameters and buffers in the order torch.nn.Module.state_dict() yields them:
// per module its own parameters, then its own buffers, then its children in
// registration order.
NamedTensors state_dict(const torch::nn::Module& module);

struct ShapeMismatch {
  std::string name;
  std::vector<int64_t> model_shape, file_shape;
};

struct LoadReport {
  std::vector<std::string> missing;      // in the model, not in the file
  std::vector<std::string> unexpected;   // in the file, not in the model
  std::vector<ShapeMismatch> mismatched; // in model order
  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  // One line per problem, every tensor by name.
  std::string describe() const;
};

// The module's name for a file's tensor `raw`: DataParallel's `module.` prefix
// dropped, then `import_key` (if given) applied.
std::string imported_name(const std::string& raw, const std::function<std::string(const std::string&)>& import_key);

// Whether `file` can fill `target` (the tensor `name`, read from `source`) without changing what its numbers mean:
// throws Error naming `source`, the tensor and both dtypes where one is floating-point and the other an integer or
// bool (a header whose dtype was relabelled reads one as the other), or one bool and the other an integer. Returns
// whether the copy converts between floating-point dtypes (fp16 or bf16 into fp32), which fills.
bool check_dtype_fills(const torch::Tensor& target, const torch::Tensor& file, const std::string& name,
                       const std::string& source);

// Copies `weights` into the module's parameters and buffers (converting between floating-point dtypes, said once
// on stderr; any other dtype change is refused as check_dtype_fills says).
// Keys are normalised first: a DataParallel `module.` prefix is dropped and
// `import_key` (if given) maps foreign names, e.g. DLE's `layers.0.` -> `layer1.`.
// With `strict`, any problem throws convnets::Error naming the first mismatched
// tensor and both shapes (or the first missing/unexpected name), listing the
// rest, and leaving the module untouched. Without it, the tensors that fit are
// copied and the report says what did not.
LoadReport load_state_dict(torch::nn::Module& module, const TensorFile& weights, const std::string& source,
                           const std::function<std::string(const std::string&)>& import_key = {},
                           bool strict = true);

}  // namespace convnets
