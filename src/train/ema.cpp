#include "train/ema.h"

#include "io/state_dict.h"

#include <torch/torch.h>

#include <algorithm>

namespace convnets::train {

Ema::Ema(Network shadow, const torch::nn::Module& model, double decay, bool warmup)
    : shadow_(std::move(shadow)), decay_(decay), warmup_(warmup) {
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
  if (warmup_ && !src.empty()) {
    step_decay_ = torch::full({}, decay_at(0), torch::dtype(torch::kFloat).device(src[0].second.device()));
  }
}

double Ema::decay_at(std::int64_t step) const {
  if (!warmup_) return decay_;
  const double t = static_cast<double>(step);
  return std::min(decay_, (1.0 + t) / (10.0 + t));
}

void Ema::set_step(std::int64_t step) {
  if (step_decay_.defined()) step_decay_.fill_(decay_at(step));
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
  if (step_decay_.defined()) {
    at::_foreach_mul_(ema, step_decay_);
    at::_foreach_add_(ema, at::_foreach_mul(model_values, 1.0 - step_decay_));
    return;
  }
  at::_foreach_mul_(ema, decay_);
  at::_foreach_add_(ema, model_values, 1.0 - decay_);
}

}  // namespace convnets::train
