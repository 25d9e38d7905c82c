#include "train/ema.h"

#include "io/state_dict.h"

#include <torch/torch.h>

namespace convnets::train {

Ema::Ema(Network shadow, const torch::nn::Module& model, double decay) : shadow_(std::move(shadow)), decay_(decay) {
  torch::NoGradGuard no_grad;
  const auto src = state_dict(model);
  auto dst = state_dict(*shadow_);
  TORCH_CHECK(src.size() == dst.size(), "EMA model differs from the trained model");
  for (size_t i = 0; i < src.size(); ++i) {
    // Same device, dtype and memory format as the model, so updates are one op each.
    dst[i].second.set_data(src[i].second.detach().clone());
  }
  for (auto& p : shadow_->parameters()) p.set_requires_grad(false);
  shadow_->eval();
}

void Ema::update(const torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  const auto src = state_dict(model);
  const auto dst = state_dict(*shadow_);
  // Multi-tensor kernels on CUDA (a few launches instead of two per tensor);
  // on the CPU the same per-tensor arithmetic.
  std::vector<at::Tensor> ema, model_values;
  for (size_t i = 0; i < src.size(); ++i) {
    auto& e = dst[i].second;
    if (e.is_floating_point()) {
      ema.push_back(e);
      model_values.push_back(src[i].second);
    } else {
      e.copy_(src[i].second);
    }
  }
  at::_foreach_mul_(ema, decay_);
  at::_foreach_add_(ema, model_values, 1.0 - decay_);
}

}  // namespace convnets::train
