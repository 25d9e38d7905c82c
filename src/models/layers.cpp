#include "models/layers.h"

#include "core/error.h"
#include "models/network.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <cudnn.h>
#include <torch/torch.h>

#include <algorithm>
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

namespace {

// ---- BN + (add +) ReLU as one cuDNN call ----------------------------------------------------------------------
// The legacy cudnnBatchNormalization*Ex API is marked deprecated in cuDNN 9 (the graph API is its successor) but is
// what ATen's own cudnn_batch_norm calls for channels-last training, with CUDNN_BATCHNORM_OPS_BN: the same
// semi-persistent NHWC kernels, here with the add and the activation switched on. Its conditions (cuDNN's developer
// guide, "cudnnBatchNormalizationForwardTrainingEx"): NHWC fully packed, fp16 (bfloat16 in recent 9.x), mode
// SPATIAL_PERSISTENT, fp32 scale/bias/statistics, a workspace and a reserve space (the ReLU's bit mask) that stays
// untouched from forward to backward, C a multiple of 4 for the add.

void cudnn_check(cudnnStatus_t status, const char* call) {
  if (status != CUDNN_STATUS_SUCCESS) {
    throw Error(std::string(call) + " failed: " + cudnnGetErrorString(status),
                "train with --no-fused-bn to use cuDNN's plain batch norm and separate add and ReLU");
  }
}

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc() { cudnn_check(cudnnCreateTensorDescriptor(&d), "cudnnCreateTensorDescriptor"); }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

struct ReluDesc {
  cudnnActivationDescriptor_t d = nullptr;
  ReluDesc() {
    cudnn_check(cudnnCreateActivationDescriptor(&d), "cudnnCreateActivationDescriptor");
    cudnn_check(cudnnSetActivationDescriptor(d, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0),
                "cudnnSetActivationDescriptor");
  }
  ~ReluDesc() { cudnnDestroyActivationDescriptor(d); }
  ReluDesc(const ReluDesc&) = delete;
  ReluDesc& operator=(const ReluDesc&) = delete;
};

// The descriptors one fused call needs: the activations' (x, y, z and their gradients share one shape), the
// per-channel parameters' (derived by cuDNN: fp32 for fp16/bf16 data) and the ReLU's.
struct FusedBnDescs {
  TensorDesc data, params;
  ReluDesc relu;
  explicit FusedBnDescs(const at::Tensor& x) {
    const auto type = x.scalar_type() == at::kBFloat16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    cudnn_check(cudnnSetTensor4dDescriptor(data.d, CUDNN_TENSOR_NHWC, type, static_cast<int>(x.size(0)),
                                           static_cast<int>(x.size(1)), static_cast<int>(x.size(2)),
                                           static_cast<int>(x.size(3))),
                "cudnnSetTensor4dDescriptor");
    cudnn_check(cudnnDeriveBNTensorDescriptor(params.d, data.d, CUDNN_BATCHNORM_SPATIAL_PERSISTENT),
                "cudnnDeriveBNTensorDescriptor");
  }
};

at::Tensor bytes(std::size_t n, const at::Tensor& like) {
  // Never a null pointer: cuDNN takes a null workspace for "run the unfused kernel".
  return at::empty({static_cast<std::int64_t>(std::max<std::size_t>(n, 16))}, like.options().dtype(at::kByte));
}

struct FusedForward {
  at::Tensor y, save_mean, save_invstd, reserve;
};

// y = relu(bn(x) [+ z]) with batch statistics; running_mean/var updated in place by `momentum`.
FusedForward fused_bn_forward(const at::Tensor& x, const at::Tensor& z, const at::Tensor& weight,
                              const at::Tensor& bias, const at::Tensor& running_mean, const at::Tensor& running_var,
                              double momentum, double eps) {
  const c10::cuda::CUDAGuard guard(x.device());
  const auto ops = z.defined() ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
  const auto mode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
  FusedBnDescs desc(x);
  auto handle = at::native::getCudnnHandle();  // on the current stream
  std::size_t workspace_size = 0, reserve_size = 0;
  cudnn_check(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(handle, mode, ops, desc.data.d,
                                                                       z.defined() ? desc.data.d : nullptr,
                                                                       desc.data.d, desc.params.d, desc.relu.d,
                                                                       &workspace_size),
              "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize");
  cudnn_check(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, mode, ops, desc.relu.d, desc.data.d,
                                                                   &reserve_size),
              "cudnnGetBatchNormalizationTrainingExReserveSpaceSize");
  FusedForward out;
  out.y = at::empty_like(x, at::MemoryFormat::ChannelsLast);
  out.save_mean = at::empty({x.size(1)}, weight.options());
  out.save_invstd = at::empty({x.size(1)}, weight.options());
  out.reserve = bytes(reserve_size, x);
  auto workspace = bytes(workspace_size, x);
  const float one = 1, zero = 0;
  cudnn_check(cudnnBatchNormalizationForwardTrainingEx(
                  handle, mode, ops, &one, &zero, desc.data.d, x.data_ptr(), z.defined() ? desc.data.d : nullptr,
                  z.defined() ? z.data_ptr() : nullptr, desc.data.d, out.y.data_ptr(), desc.params.d,
                  weight.data_ptr(), bias.data_ptr(), momentum, running_mean.data_ptr(), running_var.data_ptr(), eps,
                  out.save_mean.data_ptr(), out.save_invstd.data_ptr(), desc.relu.d, workspace.data_ptr(),
                  workspace_size, out.reserve.data_ptr(), reserve_size),
              "cudnnBatchNormalizationForwardTrainingEx");
  return out;
}

struct FusedBackward {
  at::Tensor dx, dz, dweight, dbias;
};

FusedBackward fused_bn_backward(const at::Tensor& x, const at::Tensor& y, const at::Tensor& dy, bool with_z,
                                const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& save_mean,
                                const at::Tensor& save_invstd, const at::Tensor& reserve, double eps) {
  const c10::cuda::CUDAGuard guard(x.device());
  const auto ops = with_z ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
  const auto mode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
  FusedBnDescs desc(x);
  auto handle = at::native::getCudnnHandle();
  std::size_t workspace_size = 0;
  cudnn_check(cudnnGetBatchNormalizationBackwardExWorkspaceSize(handle, mode, ops, desc.data.d, desc.data.d,
                                                                desc.data.d, with_z ? desc.data.d : nullptr,
                                                                desc.data.d, desc.params.d, desc.relu.d,
                                                                &workspace_size),
              "cudnnGetBatchNormalizationBackwardExWorkspaceSize");
  FusedBackward out;
  out.dx = at::empty_like(x, at::MemoryFormat::ChannelsLast);
  if (with_z) out.dz = at::empty_like(x, at::MemoryFormat::ChannelsLast);
  out.dweight = at::empty_like(weight);
  out.dbias = at::empty_like(bias);
  auto workspace = bytes(workspace_size, x);
  const float one = 1, zero = 0;
  cudnn_check(cudnnBatchNormalizationBackwardEx(
                  handle, mode, ops, &one, &zero, &one, &zero, desc.data.d, x.data_ptr(), desc.data.d, y.data_ptr(),
                  desc.data.d, dy.data_ptr(), with_z ? desc.data.d : nullptr, with_z ? out.dz.data_ptr() : nullptr,
                  desc.data.d, out.dx.data_ptr(), desc.params.d, weight.data_ptr(), bias.data_ptr(),
                  out.dweight.data_ptr(), out.dbias.data_ptr(), eps, save_mean.data_ptr(), save_invstd.data_ptr(),
                  desc.relu.d, workspace.data_ptr(), workspace_size, reserve.data_ptr(), reserve.numel()),
              "cudnnBatchNormalizationBackwardEx");
  return out;
}

struct FusedBnReluFunction : public torch::autograd::Function<FusedBnReluFunction> {
  // No residual: BN+ReLU; one: BN+add+ReLU. An optional, not an undefined tensor: Function::apply records every
  // tensor argument's device, and an undefined one has none.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const std::optional<torch::Tensor>& residual, const torch::Tensor& weight,
                               const torch::Tensor& bias, torch::Tensor running_mean, torch::Tensor running_var,
                               double momentum, double eps) {
    const at::Tensor z = residual.value_or(at::Tensor());
    auto f = fused_bn_forward(input, z, weight, bias, running_mean, running_var, momentum, eps);
    ctx->save_for_backward({input, f.y, weight, bias, f.save_mean, f.save_invstd, f.reserve});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["with_residual"] = z.defined();
    return f.y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const bool with_residual = ctx->saved_data["with_residual"].toBool();
    // cuDNN reads dy in the activations' layout and dtype.
    const auto dy = grads[0].to(s[0].scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
    auto g = fused_bn_backward(s[0], s[1], dy, with_residual, s[2], s[3], s[4], s[5], s[6],
                               ctx->saved_data["eps"].toDouble());
    return {g.dx, g.dz, g.dweight, g.dbias, {}, {}, {}, {}};
  }
};

bool is_fused_dtype(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

std::mutex probe_mutex;
std::map<at::ScalarType, std::string> probe_verdicts;  // dtype -> cudnn_fused_bn_refusal's answer

std::optional<std::string> cached_probe(at::ScalarType dtype) {
  std::lock_guard<std::mutex> lock(probe_mutex);
  const auto it = probe_verdicts.find(dtype);
  if (it == probe_verdicts.end()) return std::nullopt;
  return it->second;
}

// The tensors forward_fused is given meet what FusedBnContext promised (a residual of another layout, fp32
// parameters turned half by hand, a batch of one pixel: the three-op path takes them).
bool fused_bn_takes(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight) {
  if (!x.is_cuda() || x.dim() != 4 || !is_fused_dtype(x.scalar_type()) ||
      !x.is_contiguous(at::MemoryFormat::ChannelsLast) || x.size(1) % 4 != 0 ||
      x.size(0) * x.size(2) * x.size(3) < 2 || weight.scalar_type() != at::kFloat || x.numel() >= INT32_MAX) {
    return false;
  }
  if (residual.defined() && (residual.sizes() != x.sizes() || residual.scalar_type() != x.scalar_type() ||
                             !residual.is_contiguous(at::MemoryFormat::ChannelsLast))) {
    return false;
  }
  // The probe's verdict, asked before any capture (the trainer asks at its start, GraphedStep's warm-up steps run
  // eagerly); a capture never starts a probe: it would record the probe's kernels into the graph.
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) {
    const auto verdict = cached_probe(x.scalar_type());
    return verdict && verdict->empty();
  }
  return cudnn_fused_bn_refusal(x.scalar_type()).empty();
}

const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return "fp16";
    case at::kBFloat16: return "bfloat16";
    case at::kFloat: return "fp32";
    case at::kDouble: return "fp64";
    default: return "this dtype";
  }
}

}  // namespace

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
  if (fused_ && fused_failure_.empty() && is_training() && !sync_ && !folded_ && fused_bn_takes(input, residual, weight)) {
    const bool capturing = c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
    try {
      auto y = FusedBnReluFunction::apply(input, residual.defined() ? std::optional<at::Tensor>(residual) : std::nullopt,
                                          weight, bias, running_mean, running_var, options.momentum().value_or(0.1),
                                          options.eps());
      torch::NoGradGuard no_grad;
      num_batches_tracked.add_(1);
      return y;
    } catch (const Error& e) {
      // cuDNN refused this layer's shape (it checks before it computes anything): outside a capture the layer
      // keeps the three ops from here on, said once; inside one, the capture is already lost.
      if (capturing) throw;
      fused_failure_ = e.what();
      std::cerr << "convnets: note: a BatchNorm layer (" << options.num_features()
                << " channels) keeps separate BN, add and ReLU: " << fused_failure_ << "\n";
    }
  }
  auto y = forward(input);
  if (residual.defined()) y = y + residual;
  return torch::relu(y);
}

std::string fused_bn_refusal(const FusedBnContext& c, BnFusion fusion, std::int64_t channels, bool synchronized) {
  if (fusion == BnFusion::None) return "no ReLU after it";
  if (!c.enabled) return "--no-fused-bn";
  if (!c.training) return "inference (BN is folded or runs as cuDNN's inference BN)";
  if (!c.cuda) return "not on CUDA";
  if (synchronized) return "synchronized BN (--sync-bn) keeps its own path";
  if (!is_fused_dtype(c.dtype)) {
    return std::string(dtype_name(c.dtype)) + " activations (the fused kernels take fp16 or bfloat16: --precision amp or bf16)";
  }
  if (!c.channels_last) return "NCHW activations (the fused kernels take NHWC: --memory-format nhwc)";
  if (channels % 4 != 0) return std::to_string(channels) + " channels (cuDNN's fused kernels need a multiple of 4)";
  if (!c.cudnn_refusal.empty()) return c.cudnn_refusal;
  return "";
}

std::string cudnn_fused_bn_refusal(at::ScalarType dtype) {
  if (auto verdict = cached_probe(dtype)) return *verdict;
  TORCH_CHECK(!at::cuda::is_available() ||
                  c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None,
              "cudnn_fused_bn_refusal: a first probe inside a CUDA graph capture would be recorded into the graph");
  std::string why;
  if (!is_fused_dtype(dtype)) {
    why = std::string("cuDNN's fused BN kernels take fp16 or bfloat16, not ") + dtype_name(dtype);
  } else {
    try {
      // A small case of each, of a ResNet's smallest width: 2 x 64 x 4 x 4, BN+add+ReLU and BN+ReLU, forward and
      // backward.
      torch::NoGradGuard no_grad;
      const auto o = at::TensorOptions().device(at::kCUDA).dtype(dtype);
      const auto f32 = o.dtype(at::kFloat);
      // Fixed values, not random ones: a probe must not move the CUDA generator a seeded run draws from.
      const auto ramp = (at::arange(2 * 64 * 16, f32) / 1024.0 - 1.0).view({2, 64, 4, 4});
      const auto x = ramp.to(dtype).contiguous(at::MemoryFormat::ChannelsLast);
      const auto z = (ramp * 0.5).to(dtype).contiguous(at::MemoryFormat::ChannelsLast);
      const auto w = at::ones({64}, f32), b = at::zeros({64}, f32);
      auto mean = at::zeros({64}, f32), var = at::ones({64}, f32);
      for (const bool add : {true, false}) {
        auto f = fused_bn_forward(x, add ? z : at::Tensor(), w, b, mean, var, 0.1, 1e-5);
        fused_bn_backward(x, f.y, at::ones_like(f.y), add, w, b, f.save_mean, f.save_invstd, f.reserve, 1e-5);
      }
      // A kernel that did not launch shows here, not in cuDNN's status.
      const auto launched = cudaDeviceSynchronize();
      if (launched != cudaSuccess) throw Error(std::string("the probe's kernels failed: ") + cudaGetErrorString(launched));
    } catch (const std::exception& e) {
      std::ostringstream s;
      s << "cuDNN " << cudnnGetVersion() << " refused " << dtype_name(dtype) << ": " << e.what();
      why = s.str();
      // What the failed launch left behind must not fail the next CUDA call.
      (void)cudaGetLastError();
    }
  }
  std::lock_guard<std::mutex> lock(probe_mutex);
  return probe_verdicts.emplace(dtype, why).first->second;
}

std::vector<FusedBnLayer> fused_bn_plan(torch::nn::Module& module, const FusedBnContext& context) {
  std::vector<FusedBnLayer> plan;
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    const auto* bn = dynamic_cast<const BatchNorm2dImpl*>(item.value().get());
    if (!bn) continue;
    FusedBnLayer l;
    l.name = item.key();
    l.fusion = bn->fusion();
    l.channels = bn->options.num_features();
    l.refusal = fused_bn_refusal(context, l.fusion, l.channels, bn->synchronized());
    plan.push_back(std::move(l));
  }
  return plan;
}

namespace {

// "; not fused: 4 for REASON (first, ...); 1 for OTHER (name)": the refused entries grouped by reason, in the order
// each reason first appears.
std::string grouped_refusals(const std::vector<std::pair<std::string, std::string>>& refused_names,
                             const char* lead) {
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  for (const auto& [name, reason] : refused_names) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == reason; });
    if (it == groups.end()) it = groups.insert(groups.end(), {reason, {}});
    it->second.push_back(name);
  }
  std::ostringstream s;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const auto& [reason, names] = groups[i];
    s << (i == 0 ? lead : "; ") << names.size() << " for " << reason << " (" << names.front();
    if (names.size() > 1) s << ", " << (names.size() == 2 ? names[1] : "...");
    s << ")";
  }
  return s.str();
}

}  // namespace

std::string describe_fused_bn_plan(const std::vector<FusedBnLayer>& plan) {
  int relu = 0, add_relu = 0;
  std::vector<std::pair<std::string, std::string>> refused;
  for (const auto& l : plan) {
    if (l.refusal.empty()) {
      (l.fusion == BnFusion::AddRelu ? add_relu : relu) += 1;
    } else {
      refused.emplace_back(l.name, l.refusal);
    }
  }
  std::ostringstream s;
  s << relu + add_relu << " of " << plan.size() << " BatchNorm layers fused (" << relu << " BN+ReLU, " << add_relu
    << " BN+add+ReLU)" << grouped_refusals(refused, "; not fused: ");
  return s.str();
}

std::vector<NormConvEntry> norm_conv_plan(torch::nn::Module& module, const FusedBnContext& context) {
  std::vector<NormConvEntry> plan;
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    if (const auto* block = dynamic_cast<const NormConvCapable*>(item.value().get())) {
      plan.push_back({item.key(), block->norm_conv_refusal(context)});
    }
  }
  return plan;
}

std::string describe_norm_conv_plan(const std::vector<NormConvEntry>& plan) {
  if (plan.empty()) return "";
  int taken = 0;
  std::vector<std::pair<std::string, std::string>> refused;
  for (const auto& e : plan) {
    if (e.refusal.empty()) ++taken;
    else refused.emplace_back(e.name, e.refusal);
  }
  std::ostringstream s;
  s << taken << " of " << plan.size() << " residual blocks as NormConv (BN statistics in the convolutions)"
    << grouped_refusals(refused, "; not: ");
  return s.str();
}

int set_norm_conv(torch::nn::Module& module, const FusedBnContext& context) {
  int count = 0;
  for (auto& m : module.modules(/*include_self=*/true)) {
    if (auto* block = dynamic_cast<NormConvCapable*>(m.get())) {
      const bool on = block->norm_conv_refusal(context).empty();
      block->set_norm_conv(on);
      count += on ? 1 : 0;
    }
  }
  return count;
}

int set_fused_batchnorm(torch::nn::Module& module, bool on) {
  int count = 0;
  for (auto& m : module.modules(/*include_self=*/true)) {
    if (auto* bn = dynamic_cast<BatchNorm2dImpl*>(m.get())) {
      bn->set_fused(on);
      if (bn->fusion() != BnFusion::None) ++count;
    }
  }
  return count;
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
