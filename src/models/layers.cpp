#include "models/layers.h"

#include "models/mac_count.h"

#include <torch/torch.h>

#include <algorithm>

namespace convnets {
namespace {

thread_local bool shapes_only = false;

// LibTorch's constructors draw their random initialisation unconditionally. Under ShapesOnly a layer is built
// with the fewest channels its groups allow, then given its real options and zero-filled parameters of the real
// shapes: set_data keeps the registered parameters, so names and state_dict layout are those of a normal build.
torch::nn::Conv2dOptions smallest(torch::nn::Conv2dOptions o) {
  return o.in_channels(o.groups()).out_channels(o.groups());
}

void take_shapes(torch::nn::Conv2dImpl& conv, const torch::nn::Conv2dOptions& real) {
  torch::NoGradGuard no_grad;
  conv.options.in_channels(real.in_channels()).out_channels(real.out_channels());  // all else is the same already
  const auto& k = *real.kernel_size();
  conv.weight.set_data(torch::zeros({real.out_channels(), real.in_channels() / real.groups(), k[0], k[1]}));
  if (conv.bias.defined()) conv.bias.set_data(torch::zeros({real.out_channels()}));
}

int64_t conv_out_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  return (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
}

}  // namespace

namespace models {

ShapesOnly::ShapesOnly() : previous_(shapes_only) { shapes_only = true; }
ShapesOnly::~ShapesOnly() { shapes_only = previous_; }

Conv2dImpl::Conv2dImpl(torch::nn::Conv2dOptions options)
    : torch::nn::Conv2dImpl(shapes_only ? smallest(options) : options) {
  if (shapes_only) take_shapes(*this, options);
}

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features)
    : LinearImpl(torch::nn::LinearOptions(in_features, out_features)) {}

LinearImpl::LinearImpl(torch::nn::LinearOptions options)
    : torch::nn::LinearImpl(shapes_only ? torch::nn::LinearOptions(1, 1).bias(options.bias()) : options) {
  if (!shapes_only) return;
  torch::NoGradGuard no_grad;
  this->options = options;
  weight.set_data(torch::zeros({options.out_features(), options.in_features()}));
  if (bias.defined()) bias.set_data(torch::zeros({options.out_features()}));
}

torch::Tensor Conv2dImpl::forward(const torch::Tensor& input) {
  if (!counting_macs()) return torch::nn::Conv2dImpl::forward(input);

  const auto& o = options;
  const auto& k = *o.kernel_size();
  const auto& s = *o.stride();
  const auto& d = *o.dilation();
  std::array<int64_t, 2> pad{0, 0};
  std::array<int64_t, 2> out{};
  if (const auto* p = std::get_if<torch::ExpandingArray<2>>(&o.padding())) {
    pad = **p;
  }
  const bool same = std::get_if<torch::enumtype::kSame>(&o.padding()) != nullptr;
  for (int i = 0; i < 2; ++i) {
    const int64_t in = input.size(2 + i);
    out[i] = same ? in : conv_out_size(in, k[i], s[i], pad[i], d[i]);
  }
  const int64_t n = input.size(0);
  add_macs(n * o.out_channels() * out[0] * out[1] * (o.in_channels() / o.groups()) * k[0] * k[1]);
  return torch::zeros({n, o.out_channels(), out[0], out[1]}, input.options());
}

std::int64_t same_padding(std::int64_t size, std::int64_t kernel, std::int64_t stride, std::int64_t dilation) {
  const std::int64_t out = (size + stride - 1) / stride;  // ceil(size / stride)
  return std::max<std::int64_t>((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0);
}

namespace {

// timm's is_static_pad: SAME is a fixed symmetric padding at stride 1 with an
// even dilated kernel extent, d (k - 1) / 2 on each side (get_padding).
bool static_same(const torch::nn::Conv2dOptions& o) {
  for (int i = 0; i < 2; ++i) {
    if ((*o.stride())[i] != 1 || ((*o.dilation())[i] * ((*o.kernel_size())[i] - 1)) % 2 != 0) return false;
  }
  return true;
}

torch::nn::Conv2dOptions with_same_padding(torch::nn::Conv2dOptions o) {
  if (!static_same(o)) return o.padding(0);
  const auto& k = *o.kernel_size();
  const auto& d = *o.dilation();
  return o.padding(torch::ExpandingArray<2>({d[0] * (k[0] - 1) / 2, d[1] * (k[1] - 1) / 2}));
}

}  // namespace

Conv2dSameImpl::Conv2dSameImpl(torch::nn::Conv2dOptions options)
    : Conv2dImpl(with_same_padding(options)), dynamic_(!static_same(options)) {}

torch::Tensor Conv2dSameImpl::forward(const torch::Tensor& input) {
  if (!dynamic_) return Conv2dImpl::forward(input);
  const auto& k = *options.kernel_size();
  const auto& s = *options.stride();
  const auto& d = *options.dilation();
  const std::int64_t ph = same_padding(input.size(2), k[0], s[0], d[0]);
  const std::int64_t pw = same_padding(input.size(3), k[1], s[1], d[1]);
  if (ph == 0 && pw == 0) return Conv2dImpl::forward(input);
  // F.pad's order: last dimension first, (begin, end) each.
  return Conv2dImpl::forward(torch::constant_pad_nd(input, {pw / 2, pw - pw / 2, ph / 2, ph - ph / 2}, 0));
}

void Conv2dImpl::set_bias(const torch::Tensor& b) {
  bias = b;
  parameters_["bias"] = b;
}

torch::Tensor LinearImpl::forward(const torch::Tensor& input) {
  auto y = torch::nn::LinearImpl::forward(input);
  add_macs(y.numel() * options.in_features());
  return y;
}

BatchNorm2dImpl::BatchNorm2dImpl(const torch::nn::BatchNormOptions& options_) : options(options_) { reset(); }

void BatchNorm2dImpl::reset() {
  TORCH_CHECK(options.affine() && options.track_running_stats(),
              "models::BatchNorm2d: only affine BatchNorm with running statistics is used here");
  weight = register_parameter("weight", torch::ones({options.num_features()}));
  bias = register_parameter("bias", torch::zeros({options.num_features()}));
  running_mean = register_buffer("running_mean", torch::zeros({options.num_features()}));
  running_var = register_buffer("running_var", torch::ones({options.num_features()}));
  num_batches_tracked = register_buffer("num_batches_tracked", torch::tensor(0, torch::dtype(torch::kLong)));
}


bool is_half_dtype(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return "fp16";
    case at::kBFloat16: return "bfloat16";
    case at::kFloat: return "fp32";
    case at::kDouble: return "fp64";
    default: return "this dtype";
  }
}

torch::Tensor activate(const torch::Tensor& x, Activation act) {
  if (act == Activation::ReLU) return torch::relu(x);
  if (act == Activation::SiLU) return torch::silu(x);
  return x;
}

torch::Tensor BatchNorm2dImpl::forward(const torch::Tensor& input) {
  TORCH_CHECK(input.dim() == 4, "BatchNorm2d: expected a 4-D input, got ", input.dim(), "-D");
  if (folded_) {
    TORCH_CHECK(!is_training(), "BatchNorm2d: folded into its conv for inference; it cannot train");
    return input;
  }
  // nn.BatchNorm's momentum=None (a cumulative average) is not used by any model here.
  const double momentum = options.momentum().value_or(0.1);
  if (is_training()) {
    torch::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
  }
  if (!sync_ || !is_training()) {
    return torch::batch_norm(input, weight, bias, running_mean, running_var, is_training(), momentum, options.eps(),
                             at::globalContext().userEnabledCuDNN());
  }
  return sync_batch_norm(input, weight, bias, running_mean, running_var, momentum, options.eps(), sync_.get());
}

void BatchNorm2dImpl::pretty_print(std::ostream& stream) const {
  stream << "convnets::models::BatchNorm2d(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=" << options.momentum().value_or(0.1) << (sync_ ? ", synchronized" : "") << ")";
}

}  // namespace models
}  // namespace convnets
