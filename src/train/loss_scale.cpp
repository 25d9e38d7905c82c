#include "train/loss_scale.h"

#include "core/error.h"
#include "io/state_dict.h"

#include <torch/torch.h>

namespace convnets::train {

LossScaler::LossScaler(at::Device device, double init_scale, double growth, double backoff, std::int64_t interval)
    : scale_(torch::full({1}, init_scale, torch::dtype(torch::kFloat).device(device))),
      tracker_(torch::zeros({1}, torch::dtype(torch::kInt).device(device))),
      growth_(growth),
      backoff_(backoff),
      interval_(interval) {}

at::Tensor LossScaler::unscale(const std::vector<at::Tensor>& grads) {
  torch::NoGradGuard no_grad;
  auto found = torch::zeros({}, torch::dtype(torch::kBool).device(scale_.device()));
  const auto inv = scale_.reciprocal();
  for (const auto& g : grads) {
    if (!g.defined()) continue;
    g.mul_(inv.to(g.scalar_type()));
    found.logical_or_(torch::isfinite(g).all().logical_not());
  }
  return found;
}

void LossScaler::update(const at::Tensor& found_inf) {
  torch::NoGradGuard no_grad;
  auto next = tracker_ + 1;
  const auto grow = next.ge(interval_);
  scale_.copy_(torch::where(found_inf, scale_ * backoff_, torch::where(grow, scale_ * growth_, scale_)));
  tracker_.copy_(torch::where(found_inf.logical_or(grow), torch::zeros_like(next), next));
}

double LossScaler::value() const { return scale_.item<double>(); }

NamedTensors LossScaler::state() const {
  return {{"loss_scale.scale", scale_}, {"loss_scale.growth_tracker", tracker_}};
}

void LossScaler::load_state(const TensorFile& file, const std::string& source) {
  const auto* s = file.find("loss_scale.scale");
  const auto* t = file.find("loss_scale.growth_tracker");
  if (!s || !t) throw Error(source + ": no loss-scale state (loss_scale.scale, loss_scale.growth_tracker)");
  check_dtype_fills(scale_, *s, "loss_scale.scale", source);
  check_dtype_fills(tracker_, *t, "loss_scale.growth_tracker", source);
  torch::NoGradGuard no_grad;
  scale_.copy_(s->reshape({1}));
  tracker_.copy_(t->reshape({1}));
}

}  // namespace convnets::train
