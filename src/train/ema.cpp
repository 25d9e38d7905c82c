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
  for (size_t i = 0; i < src.size(); ++i) {
    auto& e = dst[i].second;
    if (e.is_floating_point()) {
      e.mul_(decay_).add_(src[i].second, 1.0 - decay_);
    } else {
      e.copy_(src[i].second);
    }
  }
}

}  // namespace convnets::train
