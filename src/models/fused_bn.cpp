#include "models/layers.h"

#include "core/error.h"
#include "models/fusion.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <cudnn.h>
#include <torch/torch.h>

#include <map>
#include <mutex>
#include <optional>
#include <sstream>

namespace convnets::models {
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
  if (!x.is_cuda() || x.dim() != 4 ||
      !fused_bn_layout_refusal(x.scalar_type(), x.is_contiguous(at::MemoryFormat::ChannelsLast), x.size(1)).empty() ||
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


// The backend forward_fused calls (layers.h).
class CudnnFusedBn final : public FusedBnBackend {
 public:
  bool takes(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight) const override {
    return fused_bn_takes(x, residual, weight);
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, const at::Tensor& bias,
                     at::Tensor running_mean, at::Tensor running_var, double momentum, double eps) const override {
    auto y = FusedBnReluFunction::apply(x, residual.defined() ? std::optional<at::Tensor>(residual) : std::nullopt,
                                        weight, bias, running_mean, running_var, momentum, eps);
    note_fused_run(FusedRun::Bn);
    return y;
  }
  bool capturing() const override {
    return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  }
};

}  // namespace

const FusedBnBackend& cudnn_fused_bn_backend() {
  static const CudnnFusedBn backend;
  return backend;
}

std::string cudnn_fused_bn_refusal(at::ScalarType dtype) {
  if (auto verdict = cached_probe(dtype)) return *verdict;
  TORCH_CHECK(!at::cuda::is_available() ||
                  c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None,
              "cudnn_fused_bn_refusal: a first probe inside a CUDA graph capture would be recorded into the graph");
  std::string why;
  if (!is_half_dtype(dtype)) {
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

}  // namespace convnets::models
