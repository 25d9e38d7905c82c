#include "models/block_fusion.h"

#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <torch/torch.h>

#include <iostream>
#include <sstream>

namespace convnets::models {

at::Tensor BlockInput::conv_bn_act(Conv2dImpl& conv, BatchNorm2dImpl& bn, Activation act) const {
  return slot ? bn_act(bn, fold_conv(conv, x, slot), act) : models::conv_bn_act(conv, bn, x, act);
}

at::Tensor BlockInput::identity() const { return slot ? fold_tap(x, slot) : x; }

ResidualFusion::ResidualFusion(torch::nn::Module& block, ResidualParts parts,
                               std::function<at::Tensor(const at::Tensor&)> forward)
    : block_(block), parts_(std::move(parts)), forward_(std::move(forward)) {
  for (const auto& [conv, bn] : parts_.branch) norm_block_.branch.push_back({conv, bn});
  if (parts_.downsample_conv) norm_block_.downsample = {parts_.downsample_conv, parts_.downsample_bn};
}

std::string ResidualFusion::path_refusal(FusionPath path, const FusedBnContext& context) const {
  if (path == FusionPath::Unfused) return "";
  if (path == FusionPath::NormConv) {
    if (auto why = norm_conv::refusal(context, norm_block_); !why.empty()) return why;
    for (const auto& [shape, why] : verdicts_) {
      if (!why.empty()) return why;
    }
    return "";
  }
  // Bn and BnFold: the block's BN+ReLU layers as the fused BN's rule takes them.
  for (const auto& [conv, bn] : parts_.branch) {
    if (bn->fusion() == BnFusion::None) continue;
    if (auto why = fused_bn_refusal(context, bn->fusion(), bn->options.num_features(), bn->synchronized()); !why.empty()) {
      return why;
    }
  }
  return "";
}

void ResidualFusion::set_path(FusionPath path) {
  path_ = path;
  // NormConv keeps the fused BN on for a shape cuDNN has no graph for.
  for (auto& [conv, bn] : parts_.branch) bn->set_fused(path != FusionPath::Unfused);
  if (parts_.downsample_bn) parts_.downsample_bn->set_fused(path != FusionPath::Unfused);
}

std::string ResidualFusion::signature() const {
  std::ostringstream s;
  auto conv_text = [&s](const Conv2dImpl& c) {
    const auto& o = c.options;
    s << o.in_channels() << ">" << o.out_channels() << " " << (*o.kernel_size())[0] << "x" << (*o.kernel_size())[1]
      << "/" << (*o.stride())[0];
    if (o.groups() > 1) s << " g" << o.groups();
  };
  s << (parts_.branch.size() == 3 ? "bottleneck " : "basic ");
  for (std::size_t i = 0; i < parts_.branch.size(); ++i) {
    if (i) s << ", ";
    conv_text(*parts_.branch[i].first);
  }
  s << "; shortcut ";
  if (parts_.downsample_conv) conv_text(*parts_.downsample_conv);
  else s << "identity";
  if (parts_.squeeze_excitation) s << "; SE";
  return s.str();
}

std::optional<at::Tensor> ResidualFusion::whole_block(const at::Tensor& x) {
  if (!block_.is_training()) return std::nullopt;
  last_input_ = x.sizes().vec();
  if (path_ == FusionPath::NormConv && norm_conv::takes(x, norm_block_) && planned(x)) {
    return norm_conv::forward(norm_block_, x, norm_conv::Backend::Cudnn);
  }
  return std::nullopt;
}

BlockInput ResidualFusion::input(const at::Tensor& x) const {
  BlockInput in{x, nullptr};
  if (path_ == FusionPath::BnFold && block_.is_training() && x.requires_grad() && torch::GradMode::is_enabled()) {
    in.slot = make_grad_slot();
  }
  return in;
}

bool ResidualFusion::planned(const at::Tensor& x) {
  std::vector<std::int64_t> key(x.sizes().begin(), x.sizes().end());
  key.push_back(static_cast<std::int64_t>(x.scalar_type()));
  if (auto it = verdicts_.find(key); it != verdicts_.end()) return it->second.empty();
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) return false;
  const auto why = norm_conv::prepare(norm_block_, x);
  if (!why.empty()) std::cerr << "convnets: note: a residual block keeps the fused BN+ReLU path: " << why << "\n";
  return verdicts_.emplace(std::move(key), why).first->second.empty();
}

}  // namespace convnets::models
