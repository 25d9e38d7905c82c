#include "models/mobile_blocks.h"

#include <torch/torch.h>

namespace convnets::models {

namespace nn = torch::nn;

Value emit_activation(GraphEmitter& g, const Value& x, Act act) {
  if (act == Act::None) return x;
  return act == Act::SiLU ? g.silu(x) : g.relu(x);
}

torch::Tensor drop_path(const torch::Tensor& branch, double p, bool training) {
  if (!training || p <= 0) return branch;
  const double keep = 1.0 - p;
  auto mask = torch::empty({branch.size(0), 1, 1, 1}, branch.options()).bernoulli_(keep).div_(keep);
  return branch * mask;
}

models::BatchNorm2d batch_norm(std::int64_t channels, double eps) {
  return models::BatchNorm2d(nn::BatchNormOptions(channels).eps(eps));
}

SqueezeExciteImpl::SqueezeExciteImpl(std::int64_t channels, std::int64_t reduced, Act act) : act_(act) {
  conv_reduce_ = register_module("conv_reduce", models::Conv2d(nn::Conv2dOptions(channels, reduced, 1).bias(true)));
  conv_expand_ = register_module("conv_expand", models::Conv2d(nn::Conv2dOptions(reduced, channels, 1).bias(true)));
}

torch::Tensor SqueezeExciteImpl::forward(const torch::Tensor& x) {
  auto s = x.mean({2, 3}, /*keepdim=*/true);
  s = conv_expand_(activate(conv_reduce_(s), act_));
  return x * torch::sigmoid(s);
}

Value SqueezeExciteImpl::emit(GraphEmitter& g, const Value& x, const std::string& name) {
  auto s = g.conv(g.global_avg_pool(x), *conv_reduce_, name + ".conv_reduce");
  s = g.conv(emit_activation(g, s, act_), *conv_expand_, name + ".conv_expand");
  return g.mul(x, g.sigmoid(s));
}

}  // namespace convnets::models
