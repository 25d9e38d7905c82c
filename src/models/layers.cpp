#include "models/layers.h"

#include "core/compat.h"
#include "models/network.h"

#include <torch/torch.h>

namespace convnets {
namespace {

struct MacTrace {
  int64_t macs = 0;
};
thread_local MacTrace* active_trace = nullptr;

int64_t conv_out_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  return (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
}

}  // namespace

namespace layers {

torch::Tensor Conv2dImpl::forward(const torch::Tensor& input) {
  if (!active_trace) return torch::nn::Conv2dImpl::forward(input);

  const auto& o = options;
  const auto& k = *o.kernel_size();
  const auto& s = *o.stride();
  const auto& d = *o.dilation();
  std::array<int64_t, 2> pad{0, 0};
  std::array<int64_t, 2> out{};
  if (const auto* p = compat::variant_get_if<torch::ExpandingArray<2>>(o.padding())) {
    pad = **p;
  }
  const bool same = compat::variant_get_if<torch::enumtype::kSame>(o.padding()) != nullptr;
  for (int i = 0; i < 2; ++i) {
    const int64_t in = input.size(2 + i);
    out[i] = same ? in : conv_out_size(in, k[i], s[i], pad[i], d[i]);
  }
  const int64_t n = input.size(0);
  active_trace->macs += n * o.out_channels() * out[0] * out[1] * (o.in_channels() / o.groups()) * k[0] * k[1];
  return torch::zeros({n, o.out_channels(), out[0], out[1]}, input.options());
}

torch::Tensor LinearImpl::forward(const torch::Tensor& input) {
  auto y = torch::nn::LinearImpl::forward(input);
  if (active_trace) active_trace->macs += y.numel() * options.in_features();
  return y;
}

}  // namespace layers

int64_t count_macs(NetworkImpl& net, int input_size, int in_channels) {
  // Restores the module's mode and ends the trace even if forward throws.
  struct TraceScope {
    NetworkImpl& net;
    bool was_training;
    MacTrace trace;
    explicit TraceScope(NetworkImpl& n) : net(n), was_training(n.is_training()) {
      net.eval();
      active_trace = &trace;
    }
    ~TraceScope() {
      active_trace = nullptr;
      net.train(was_training);
    }
  } scope(net);
  torch::NoGradGuard no_grad;
  net.forward(torch::zeros({1, in_channels, input_size, input_size}));
  return scope.trace.macs;
}

int64_t count_parameters(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

}  // namespace convnets
