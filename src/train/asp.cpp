#include "train/asp.h"

#include "core/error.h"

#include <torch/torch.h>

#include <map>

namespace convnets::train {
using runtime::FlatParameters;
namespace {

std::string shape_text(at::IntArrayRef sizes) { return c10::str(sizes); }

// The weight as rows whose consecutive elements are its input channels:
// [K, C, R, S] -> [K, R, S, C]; [out, in] as is.
at::Tensor input_channels_last(const at::Tensor& w) { return w.dim() == 4 ? w.permute({0, 2, 3, 1}) : w; }

bool groupable(const at::Tensor& w) { return (w.dim() == 2 || w.dim() == 4) && w.size(1) % 4 == 0; }

}  // namespace

at::Tensor mask_2_4(const at::Tensor& weight) {
  if (!groupable(weight)) {
    throw Error("2:4 mask of a weight of shape " + shape_text(weight.sizes()) +
                ": needs a 2-D or 4-D weight with a multiple of 4 input channels");
  }
  torch::NoGradGuard no_grad;
  const auto rows = input_channels_last(weight.detach().to(torch::kFloat).abs()).contiguous();
  const auto groups = rows.view({-1, 4});
  // A stable descending sort keeps the lower channel first among equal
  // magnitudes (apex's argmax over its pattern list breaks ties by that list's order).
  const auto order = std::get<1>(groups.sort(/*stable=*/true, /*dim=*/1, /*descending=*/true));
  auto keep = torch::zeros(groups.sizes(), groups.options().dtype(torch::kUInt8)).scatter_(1, order.narrow(1, 0, 2), 1);
  keep = keep.view(rows.sizes());
  return (weight.dim() == 4 ? keep.permute({0, 3, 1, 2}) : keep).contiguous();
}

Sparsity sparsity_of(const at::Tensor& weight) {
  torch::NoGradGuard no_grad;
  Sparsity s;
  const auto nonzero = weight.detach().ne(0);
  s.numel = weight.numel();
  s.zeros = s.numel - nonzero.sum().item<std::int64_t>();
  s.groupable = groupable(weight);
  if (!s.groupable) return s;
  const auto per_group = input_channels_last(nonzero).contiguous().view({-1, 4}).sum(1);
  s.groups = per_group.numel();
  s.dense_groups = per_group.gt(2).sum().item<std::int64_t>();
  return s;
}

std::string AspLayer::describe() const {
  return name + " " + shape_text(shape) + (masked() ? ": 2:4" : ": " + dense_reason);
}

std::vector<AspLayer> plan_2_4(const torch::nn::Module& model, const std::string& classifier) {
  std::vector<AspLayer> out;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    const at::Tensor* weight = nullptr;
    std::int64_t conv_groups = 1;
    if (const auto* conv = dynamic_cast<const torch::nn::Conv2dImpl*>(item.value().get())) {
      weight = &conv->weight;
      conv_groups = conv->options.groups();
    } else if (const auto* linear = dynamic_cast<const torch::nn::LinearImpl*>(item.value().get())) {
      weight = &linear->weight;
    }
    if (!weight || !weight->defined() || !weight->requires_grad()) continue;
    AspLayer layer{item.key() + ".weight", weight->sizes().vec(), ""};
    const std::int64_t k = layer.shape[0], c = layer.shape[1];
    const std::string inputs =
        std::to_string(c) + (c == 1 ? " input channel" : " input channels") + (conv_groups > 1 ? " per group" : "");
    if (layer.name == classifier) {
      layer.dense_reason = "the classifier, left dense as DLE's PaddlePaddle RN50 v1.5 --asp leaves fc";
    } else if (c % 4 != 0) {
      layer.dense_reason = inputs + ", not a multiple of 4";
    } else if (k % 8 != 0 || c % 16 != 0) {
      layer.dense_reason = (k % 8 != 0 ? std::to_string(k) + " output channels, not a multiple of 8"
                                       : inputs + ", not a multiple of 16") +
                           " (apex ASP's sparse tensor-core shape rule)";
    }
    out.push_back(std::move(layer));
  }
  return out;
}

AspOptimizer::AspOptimizer(std::unique_ptr<Optimizer> inner, std::vector<AspLayer> layers)
    : inner_(std::move(inner)), layers_(std::move(layers)) {
  auto& flat = inner_->flat();
  std::map<std::string, const FlatParameters::Entry*> by_name;
  for (const auto& e : flat.entries()) by_name[e.name] = &e;
  for (const auto& l : layers_) {
    if (!l.masked()) continue;
    const auto it = by_name.find(l.name);
    if (it == by_name.end()) throw Error("--asp: " + l.name + " is not among the optimizer's parameters");
    masked_.push_back({l.name, it->second});
  }
  mask_ = torch::ones(flat.values().sizes(), flat.values().options().dtype(torch::kUInt8));
}

void AspOptimizer::step(double lr, const at::Tensor& skip) {
  torch::NoGradGuard no_grad;
  inner_->flat().grads().mul_(mask_);
  inner_->step(lr, skip);
  inner_->flat().values().mul_(mask_);
}

void AspOptimizer::step(const at::Tensor& lr, const at::Tensor& skip) {
  torch::NoGradGuard no_grad;
  inner_->flat().grads().mul_(mask_);
  inner_->step(lr, skip);
  inner_->flat().values().mul_(mask_);
}

NamedTensors AspOptimizer::state() const {
  auto out = inner_->state();
  if (!pruned_) return out;
  for (const auto& m : masked_) out.emplace_back("asp_mask." + m.name, inner_->flat().view(mask_, *m.entry));
  return out;
}

void AspOptimizer::load_state(const TensorFile& file, const std::string& source) {
  inner_->load_state(file, source);
  const std::string prefix = "asp_mask.";
  std::map<std::string, at::Tensor> found;
  for (const auto& [name, t] : file.tensors) {
    if (name.rfind(prefix, 0) == 0) found[name.substr(prefix.size())] = t;
  }
  if (found.empty()) return;
  std::vector<at::Tensor> masks;
  for (const auto& m : masked_) {
    const auto it = found.find(m.name);
    if (it == found.end()) throw Error(source + ": no 2:4 mask 'asp_mask." + m.name + "' for a weight this run prunes");
    const at::Tensor& t = it->second;
    if (t.sizes() != m.entry->value.sizes()) {
      throw Error(source + ": mask 'asp_mask." + m.name + "' has shape " + shape_text(t.sizes()) + ", the weight " +
                  shape_text(m.entry->value.sizes()));
    }
    if (t.scalar_type() != torch::kUInt8 && t.scalar_type() != torch::kBool) {
      throw Error(source + ": mask 'asp_mask." + m.name + "' is " + std::string(c10::toString(t.scalar_type())) +
                  ", not uint8");
    }
    const auto values = t.to(torch::kLong);
    const auto kept = input_channels_last(values).contiguous().view({-1, 4}).sum(1);
    if (values.gt(1).any().item<bool>() || kept.ne(2).any().item<bool>()) {
      throw Error(source + ": mask 'asp_mask." + m.name + "' does not keep exactly 2 of every 4 input channels",
                  "the checkpoint is damaged; resume from another one");
    }
    masks.push_back(t);
    found.erase(it);
  }
  if (!found.empty()) {
    throw Error(source + ": mask 'asp_mask." + found.begin()->first + "' is for a weight this run leaves dense");
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < masked_.size(); ++i) inner_->flat().view(mask_, *masked_[i].entry).copy_(masks[i]);
  pruned_ = true;
  reapply();
}

void AspOptimizer::prune() {
  torch::NoGradGuard no_grad;
  for (const auto& m : masked_) inner_->flat().view(mask_, *m.entry).copy_(mask_2_4(m.entry->value));
  pruned_ = true;
  reapply();
}

void AspOptimizer::reapply() {
  torch::NoGradGuard no_grad;
  inner_->flat().values().mul_(mask_);
}

void AspOptimizer::apply_to(torch::nn::Module& copy) const {
  torch::NoGradGuard no_grad;
  auto params = copy.named_parameters();
  for (const auto& m : masked_) {
    auto* p = params.find(m.name);
    if (!p) throw Error("--asp: the model copy has no parameter " + m.name);
    p->mul_(inner_->flat().view(mask_, *m.entry));
  }
}

std::int64_t AspOptimizer::masked_numel() const {
  std::int64_t n = 0;
  for (const auto& m : masked_) n += m.entry->numel;
  return n;
}

}  // namespace convnets::train
