#include "train/sgd.h"

#include "core/error.h"

#include <torch/torch.h>

namespace convnets::train {

Sgd::Sgd(torch::nn::Module& model, SgdOptions options) : options_(options) {
  torch::NoGradGuard no_grad;
  for (const auto& p : model.named_parameters()) {
    if (!p.value().requires_grad()) continue;
    const bool decay = options_.decay_all || p.value().dim() > 1;
    params_.push_back({p.key(), p.value(), torch::zeros_like(p.value()), decay ? options_.weight_decay : 0.0});
  }
}

void Sgd::zero_grad() {
  for (auto& p : params_) {
    auto& g = p.value.mutable_grad();
    if (g.defined()) g.zero_();
  }
}

void Sgd::step(double lr, const at::Tensor& skip) {
  torch::NoGradGuard no_grad;
  for (auto& p : params_) {
    const auto& grad = p.value.grad();
    if (!grad.defined()) continue;
    // torch/optim/sgd.py _single_tensor_sgd, dampening 0.
    auto d_p = p.weight_decay != 0 ? grad.add(p.value, p.weight_decay) : grad;
    if (options_.momentum != 0) {
      if (skip.defined()) {
        auto buf = p.momentum.mul(options_.momentum).add_(d_p);
        d_p = options_.nesterov ? d_p.add(buf, options_.momentum) : buf;
        p.momentum.copy_(torch::where(skip, p.momentum, buf));
      } else {
        p.momentum.mul_(options_.momentum).add_(d_p);
        d_p = options_.nesterov ? d_p.add(p.momentum, options_.momentum) : p.momentum;
      }
    }
    if (skip.defined()) {
      p.value.copy_(torch::where(skip, p.value, p.value.add(d_p, -lr)));
    } else {
      p.value.add_(d_p, -lr);
    }
  }
}

NamedTensors Sgd::state() const {
  NamedTensors out;
  for (const auto& p : params_) out.emplace_back("optimizer.momentum." + p.name, p.momentum);
  return out;
}

void Sgd::load_state(const TensorFile& file, const std::string& source) {
  std::vector<at::Tensor> loaded;
  for (const auto& p : params_) {
    const auto* t = file.find("optimizer.momentum." + p.name);
    if (!t) throw Error(source + ": no momentum buffer for parameter '" + p.name + "'");
    if (t->sizes() != p.momentum.sizes()) {
      throw Error(source + ": momentum buffer '" + p.name + "' has shape " + c10::str(t->sizes()) +
                  ", the model's parameter " + c10::str(p.momentum.sizes()));
    }
    loaded.push_back(*t);
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].momentum.copy_(loaded[i]);
}

}  // namespace convnets::train
