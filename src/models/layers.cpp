#include "models/layers.h"

#include "core/error.h"
#include "models/network.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

namespace convnets {
namespace {

struct MacTrace {
  int64_t macs = 0;
};
thread_local MacTrace* active_trace = nullptr;
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

namespace layers {

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
  if (!active_trace) return torch::nn::Conv2dImpl::forward(input);

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
  active_trace->macs += n * o.out_channels() * out[0] * out[1] * (o.in_channels() / o.groups()) * k[0] * k[1];
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

namespace convnets::layers {
namespace {

// fp16/bf16 activations are normalised in fp32 (as cuDNN does); fp64 stays fp64.
at::ScalarType compute_type(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Shapes a per-channel [C] tensor for broadcasting against NCHW.
at::Tensor per_channel(const at::Tensor& t) { return t.view({1, -1, 1, 1}); }

struct SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
  // `sync` travels as an integer because saved_data holds IValues only; the
  // layer that owns it outlives every graph built through it.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& weight, const torch::Tensor& bias, torch::Tensor running_mean,
                               torch::Tensor running_var, double momentum, double eps, BatchNormSync* sync) {
    const auto x = input.to(compute_type(input));
    const int64_t channels = x.size(1);
    const double local_n = static_cast<double>(x.numel() / channels);
    // Per rank: count, mean and M2 = n * biased variance, gathered in fp64 and
    // combined exactly (Chan, Golub & LeVeque 1979), so a rank whose batch
    // mean sits far from the others' loses nothing to cancellation.
    const auto mean_l = x.mean({0, 2, 3});
    const auto m2_l = x.var({0, 2, 3}, /*unbiased=*/false) * local_n;
    auto packed = torch::cat({torch::full({1}, local_n, x.options()), mean_l, m2_l}).to(torch::kDouble);
    const auto all = sync->all_gather(packed);  // [W, 1 + 2C]
    const auto counts = all.select(1, 0).unsqueeze(1);
    const auto means = all.narrow(1, 1, channels);
    const auto m2s = all.narrow(1, 1 + channels, channels);
    const auto n = counts.sum();
    const auto mean = (counts * means).sum(0) / n;
    const auto m2 = (m2s + counts * (means - mean).square()).sum(0);
    const auto var = m2 / n;
    const auto invstd = (var + eps).rsqrt();
    const double total = n.item<double>();
    {
      torch::NoGradGuard no_grad;
      // nn.BatchNorm: the running variance is the unbiased estimate over the (global) batch.
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      running_var.mul_(1 - momentum).add_((var * (total / std::max(total - 1, 1.0))).to(running_var.scalar_type()),
                                          momentum);
    }
    const auto meanf = mean.to(x.scalar_type()), invstdf = invstd.to(x.scalar_type());
    const auto xhat = (x - per_channel(meanf)) * per_channel(invstdf);
    auto y = xhat * per_channel(weight.to(x.scalar_type())) + per_channel(bias.to(x.scalar_type()));
    ctx->save_for_backward({input, weight, meanf, invstdf});
    ctx->saved_data["n"] = total;
    ctx->saved_data["sync"] = reinterpret_cast<int64_t>(sync);
    return y.to(input.scalar_type()).contiguous(input.suggest_memory_format());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& input = saved[0];
    const auto& weight = saved[1];
    const auto& mean = saved[2];
    const auto& invstd = saved[3];
    const double n = ctx->saved_data["n"].toDouble();
    auto* sync = reinterpret_cast<BatchNormSync*>(ctx->saved_data["sync"].toInt());
    const auto dy = grads[0].to(mean.scalar_type());
    const auto xhat = (input.to(mean.scalar_type()) - per_channel(mean)) * per_channel(invstd);
    const auto sum_dy = dy.sum({0, 2, 3});
    const auto sum_dy_xhat = (dy * xhat).sum({0, 2, 3});
    // The parameters' gradients stay local: the gradient all-reduce averages them.
    auto global = torch::cat({sum_dy, sum_dy_xhat});
    sync->all_reduce_sum(global);
    const int64_t c = mean.size(0);
    const auto g_dy = global.narrow(0, 0, c) / n, g_dy_xhat = global.narrow(0, c, c) / n;
    auto dx = (dy - per_channel(g_dy) - xhat * per_channel(g_dy_xhat)) *
              per_channel(invstd * weight.to(mean.scalar_type()));
    dx = dx.to(input.scalar_type()).contiguous(input.suggest_memory_format());
    return {dx, sum_dy_xhat.to(weight.scalar_type()), sum_dy.to(weight.scalar_type()), {}, {}, {}, {}, {}};
  }
};

}  // namespace

BatchNorm2dImpl::BatchNorm2dImpl(const torch::nn::BatchNormOptions& options_) : options(options_) { reset(); }

void BatchNorm2dImpl::reset() {
  TORCH_CHECK(options.affine() && options.track_running_stats(),
              "layers::BatchNorm2d: only affine BatchNorm with running statistics is used here");
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

namespace {

// Installed by the CUDA build's models/fused_bn.cpp (through runtime::set_fused_batchnorm); none in a build of the
// models alone (the fuzz targets), where forward_fused is always the three ops.
std::atomic<const FusedBnBackend*> fused_backend{nullptr};

}  // namespace

void install_fused_bn_backend(const FusedBnBackend* backend) { fused_backend = backend; }

namespace {

std::atomic<const FusedConvBackend*> conv_backend{nullptr};

}  // namespace

torch::Tensor activate(const torch::Tensor& x, Activation act) {
  if (act == Activation::ReLU) return torch::relu(x);
  if (act == Activation::SiLU) return torch::silu(x);
  return x;
}

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
      !active_trace) {
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
  return SyncBatchNormFunction::apply(input, weight, bias, running_mean, running_var, momentum, options.eps(),
                                      sync_.get());
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

void BatchNorm2dImpl::pretty_print(std::ostream& stream) const {
  stream << "convnets::layers::BatchNorm2d(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=" << options.momentum().value_or(0.1) << (sync_ ? ", synchronized" : "") << ")";
}

int enable_sync_batchnorm(torch::nn::Module& module, const std::shared_ptr<BatchNormSync>& sync) {
  int count = 0;
  for (auto& m : module.modules(/*include_self=*/true)) {
    if (auto* bn = dynamic_cast<BatchNorm2dImpl*>(m.get())) {
      bn->set_sync(sync);
      ++count;
    }
  }
  return count;
}

}  // namespace convnets::layers
