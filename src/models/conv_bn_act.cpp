// A convolution and its BatchNorm and activation as one: cuDNN's fused inference convolution where its rules allow
// (conv_shape_refusal, fused_conv_shape_refusal), the fused training BN+ReLU (forward_fused), else the ops in turn;
// the backends the CUDA build installs, and the account of what ran fused.
#include "models/layers.h"

#include "core/error.h"
#include "models/mac_count.h"

#include <torch/torch.h>

#include <atomic>
#include <iostream>
#include <map>
#include <sstream>

namespace convnets::models {
namespace {

// Installed by the CUDA build's models/fused_bn.cpp (through runtime::set_fused_batchnorm); none in a build of the
// models alone (the fuzz targets), where forward_fused is always the three ops.
std::atomic<const FusedBnBackend*> fused_backend{nullptr};

}  // namespace

void install_fused_bn_backend(const FusedBnBackend* backend) { fused_backend = backend; }

namespace {

std::atomic<const FusedConvBackend*> conv_backend{nullptr};

}  // namespace

void install_fused_conv_backend(const FusedConvBackend* backend) { conv_backend = backend; }

std::string conv_shape_refusal(const Conv2dImpl& conv) {
  const auto& o = conv.options;
  const auto& k = *o.kernel_size();
  const auto& s = *o.stride();
  const auto& d = *o.dilation();
  if (o.groups() != 1) return "a grouped convolution (" + std::to_string(o.groups()) + " groups)";
  if (d[0] != 1 || d[1] != 1) return "a dilated convolution";
  if (k[0] != k[1] || s[0] != s[1]) return "a kernel or stride that is not square";
  const auto* same = dynamic_cast<const Conv2dSameImpl*>(&conv);
  if (same && same->dynamic()) return "TF \"SAME\" padding that depends on the input's size";
  const auto* p = std::get_if<torch::ExpandingArray<2>>(&o.padding());
  if (!p || (**p)[0] != (**p)[1]) return "padding that is not one symmetric size";
  if (!std::holds_alternative<torch::enumtype::kZeros>(o.padding_mode())) return "padding that is not zeros";
  return "";
}

std::string fused_conv_shape_refusal(const Conv2dImpl& conv, at::IntArrayRef sizes, at::ScalarType dtype,
                                     Activation act, bool residual, norm_conv::ConvAct& out) {
  const auto& o = conv.options;
  if (dtype != at::kHalf && dtype != at::kBFloat16) {
    return std::string(dtype_name(dtype)) + " activations (the fused convolution takes fp16 or bfloat16)";
  }
  if (sizes.size() != 4) return "a " + std::to_string(sizes.size()) + "-D input";
  if (sizes[1] != o.in_channels()) {
    return std::to_string(sizes[1]) + " input channels for a conv of " + std::to_string(o.in_channels());
  }
  if (auto why = conv_shape_refusal(conv); !why.empty()) return why;
  out.g = norm_conv::ConvGeometry::of(sizes, conv.weight.sizes(), (*o.stride())[0],
                                      std::get<torch::ExpandingArray<2>>(o.padding())->at(0), dtype);
  out.act = act;
  out.residual = residual;
  return "";
}

torch::Tensor conv_bn_act(Conv2dImpl& conv, BatchNorm2dImpl& bn, const torch::Tensor& x, Activation act,
                          const torch::Tensor& residual) {
  const FusedConvBackend* backend = conv_backend;
  // Not while the MAC tracer counts: it counts in Conv2dImpl::forward.
  if (backend && conv.fused_inference() && bn.folded() && !conv.is_training() && conv.fused_failure.empty() &&
      !counting_macs()) {
    auto why = backend->refusal(conv, x, act, residual);
    if (why.empty()) {
      conv.fused_ran = true;
      return backend->forward(conv, x, act, residual);
    }
    conv.fused_failure = std::move(why);
  }
  return bn_act(bn, conv.forward(x), act, residual);
}

torch::Tensor bn_act(BatchNorm2dImpl& bn, const torch::Tensor& y, Activation act, const torch::Tensor& residual) {
  if (act == Activation::ReLU && bn.fusion() == (residual.defined() ? BnFusion::AddRelu : BnFusion::Relu)) {
    return bn.forward_fused(y, residual);
  }
  auto z = bn.forward(y);
  if (residual.defined()) z = z + residual;
  return activate(z, act);
}

int set_fused_inference(torch::nn::Module& module, bool on) {
  int count = 0;
  for (auto& m : module.modules(/*include_self=*/true)) {
    if (auto* conv = dynamic_cast<Conv2dImpl*>(m.get())) {
      conv->set_fused_inference(on);
      conv->fused_failure.clear();
      conv->fused_ran = false;
      ++count;
    }
  }
  return count;
}

std::string describe_fused_convs(torch::nn::Module& module) {
  int fused = 0, asked = 0;
  std::map<std::string, std::vector<std::string>> refused;  // why -> the convs' names
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    const auto* conv = dynamic_cast<const Conv2dImpl*>(item.value().get());
    if (!conv || (!conv->fused_ran && conv->fused_failure.empty())) continue;
    ++asked;
    if (conv->fused_failure.empty()) {
      ++fused;
    } else {
      refused[conv->fused_failure].push_back(item.key());
    }
  }
  if (asked == 0) return "";
  std::ostringstream s;
  s << "cuDNN conv+bias+act: " << fused << " of " << asked << " convs";
  for (const auto& [why, names] : refused) {
    s << "; unfused: " << names.front();
    if (names.size() > 1) s << " and " << names.size() - 1 << " more";
    s << " (" << why << ")";
  }
  return s.str();
}

torch::Tensor BatchNorm2dImpl::forward_fused(const torch::Tensor& input, const torch::Tensor& residual) {
  TORCH_CHECK(residual.defined() == (fusion_ == BnFusion::AddRelu),
              "BatchNorm2d::forward_fused: a residual goes with BnFusion::AddRelu, and only with it");
  const FusedBnBackend* backend = fused_backend;
  if (backend && fused_ && fused_failure_.empty() && is_training() && !sync_ && !folded_ &&
      backend->takes(input, residual, weight)) {
    try {
      auto y = backend->forward(input, residual, weight, bias, running_mean, running_var,
                                options.momentum().value_or(0.1), options.eps());
      torch::NoGradGuard no_grad;
      num_batches_tracked.add_(1);
      return y;
    } catch (const Error& e) {
      // cuDNN refused this layer's shape (it checks before it computes anything): outside a capture the layer
      // keeps the three ops from here on, said once; inside one, the capture is already lost.
      if (backend->capturing()) throw;
      fused_failure_ = e.what();
      std::cerr << "convnets: note: a BatchNorm layer (" << options.num_features()
                << " channels) keeps separate BN, add and ReLU: " << fused_failure_ << "\n";
    }
  }
  auto y = forward(input);
  if (residual.defined()) y = y + residual;
  return torch::relu(y);
}

}  // namespace convnets::models
