#include "io/state_dict.h"

#include "core/error.h"

#include <torch/torch.h>

#include <iostream>
#include <map>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

namespace convnets {
namespace {

void collect(const torch::nn::Module& m, const std::string& prefix, NamedTensors& out) {
  for (const auto& p : m.named_parameters(/*recurse=*/false)) out.emplace_back(prefix + p.key(), p.value());
  for (const auto& b : m.named_buffers(/*recurse=*/false)) out.emplace_back(prefix + b.key(), b.value());
  for (const auto& c : m.named_children()) collect(*c.value(), prefix + c.key() + ".", out);
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

enum class DtypeClass { Floating, Integer, Bool };

DtypeClass class_of(const torch::Tensor& t) {
  if (t.scalar_type() == torch::kBool) return DtypeClass::Bool;
  return t.is_floating_point() ? DtypeClass::Floating : DtypeClass::Integer;
}

}  // namespace

bool check_dtype_fills(const torch::Tensor& target, const torch::Tensor& file, const std::string& name,
                       const std::string& source) {
  if (class_of(target) != class_of(file)) {
    throw Error("weights file '" + source + "': tensor '" + name + "' is " + c10::toString(file.scalar_type()) +
                    " in the file but " + c10::toString(target.scalar_type()) +
                    " in the model; convnets converts between floating-point dtypes only",
                "the file's header may have been edited (its dtype relabelled): use another copy of it");
  }
  return class_of(target) == DtypeClass::Floating && target.scalar_type() != file.scalar_type();
}

NamedTensors state_dict(const torch::nn::Module& module) {
  NamedTensors out;
  collect(module, "", out);
  return out;
}

std::string LoadReport::describe() const {
  std::ostringstream os;
  for (const auto& m : mismatched) {
    os << "  shape mismatch: " << m.name << ": model " << shape_str(m.model_shape) << ", file "
       << shape_str(m.file_shape) << '\n';
  }
  for (const auto& n : missing) os << "  missing from file: " << n << '\n';
  for (const auto& n : unexpected) os << "  unexpected in file: " << n << '\n';
  return os.str();
}

std::string imported_name(const std::string& raw, const std::function<std::string(const std::string&)>& import_key) {
  static const std::string kDataParallel = "module.";
  std::string key = raw.rfind(kDataParallel, 0) == 0 ? raw.substr(kDataParallel.size()) : raw;
  return import_key ? import_key(key) : key;
}

LoadReport load_state_dict(torch::nn::Module& module, const TensorFile& weights, const std::string& source,
                           const std::function<std::string(const std::string&)>& import_key, bool strict) {
  std::unordered_map<std::string, const torch::Tensor*> file;
  std::vector<std::string> file_order;
  for (const auto& [raw, tensor] : weights.tensors) {
    const std::string key = imported_name(raw, import_key);
    if (!file.emplace(key, &tensor).second) {
      throw Error("weights file '" + source + "' holds tensor '" + key + "' twice (as '" + raw + "' after renaming)");
    }
    file_order.push_back(key);
  }

  LoadReport report;
  auto own = state_dict(module);
  std::vector<std::tuple<std::string, torch::Tensor, const torch::Tensor*>> copies;
  std::unordered_set<std::string> seen;
  for (auto& [name, target] : own) {
    seen.insert(name);
    auto it = file.find(name);
    if (it == file.end()) {
      report.missing.push_back(name);
    } else if (it->second->sizes() != target.sizes()) {
      report.mismatched.push_back({name, target.sizes().vec(), it->second->sizes().vec()});
    } else {
      copies.emplace_back(name, target, it->second);
    }
  }
  for (const auto& key : file_order) {
    if (!seen.count(key)) report.unexpected.push_back(key);
  }

  if (strict && !report.ok()) {
    std::string first;
    if (!report.mismatched.empty()) {
      const auto& m = report.mismatched.front();
      first = "tensor '" + m.name + "' has shape " + shape_str(m.model_shape) + " in the model but " +
              shape_str(m.file_shape) + " in the file";
    } else if (!report.missing.empty()) {
      first = "tensor '" + report.missing.front() + "' is missing from the file";
    } else {
      first = "the file has tensor '" + report.unexpected.front() + "' that the model lacks";
    }
    throw Error("weights file '" + source + "' does not fit the model: " + first + "\n" + report.describe(),
                "check --arch and --num-classes match the model the weights were saved from");
  }
  std::map<std::string, std::size_t> converted;  // "float16 -> float32": how many
  for (const auto& [name, target, src] : copies) {
    if (check_dtype_fills(target, *src, name, source)) {
      ++converted[std::string(c10::toString(src->scalar_type())) + " into " + c10::toString(target.scalar_type())];
    }
  }
  if (!converted.empty()) {
    std::string what;
    for (const auto& [kind, n] : converted) what += (what.empty() ? "" : ", ") + std::to_string(n) + " " + kind;
    std::cerr << "convnets: note: weights file '" << source << "': tensors converted to the model's dtype (" << what
              << ")\n";
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, target, src] : copies) target.copy_(*src);
  return report;
}

}  // namespace convnets
