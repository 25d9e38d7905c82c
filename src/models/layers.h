// The layers the networks are built from: Conv2d and Linear that count their multiply-accumulates (models/mac_count.h), BatchNorm2d (synchronized: models/sync_bn.cpp; foldable; fused with its ReLU and residual add on CUDA) and the conv+BN+activation dispatch (models/conv_bn_act.cpp).
#pragma once

#include "models/cudnn_graphs.h"
#include "models/mac_count.h"

#include <torch/nn/module.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <ostream>
#include <memory>
#include <string>
#include <vector>

namespace convnets {

class NetworkImpl;

namespace models {

// While one is alive on its thread, the Conv2d and Linear layers built get zero-filled parameters of their shapes
// instead of LibTorch's random initialisation: for networks built only to be measured (parameter counts, MACs).
// The random numbers were 62% of `convnets models`, which builds all 24 networks (perf, 2026-11-26).
class ShapesOnly {
 public:
  ShapesOnly();
  ~ShapesOnly();
  ShapesOnly(const ShapesOnly&) = delete;
  ShapesOnly& operator=(const ShapesOnly&) = delete;

 private:
  bool previous_;
};

// These derive from LibTorch's own modules so parameter names ("weight", "bias"),
// initialisation and state_dict layout stay exactly PyTorch's.
class Conv2dImpl : public torch::nn::Conv2dImpl {
 public:
  explicit Conv2dImpl(torch::nn::Conv2dOptions options);
  // Virtual: conv_bn_act's unfused path must pad as a Conv2dSame does.
  virtual torch::Tensor forward(const torch::Tensor& input);
  // Gives a bias-free conv a bias (BN folding). LibTorch registers "bias" as
  // an undefined tensor then, so the registered entry is replaced, not added.
  void set_bias(const torch::Tensor& b);
  // Inference's fused convolution (conv_bn_act): off by default; the CUDA graph engine turns it on.
  void set_fused_inference(bool on) { fused_inference_ = on; }
  bool fused_inference() const { return fused_inference_; }
  // Why this conv runs unfused after all: the first refusal it met (asked at each call until one; from then on
  // the ops), "" while none. `fused_ran`: it has run as one cuDNN graph at least once.
  std::string fused_failure;
  bool fused_ran = false;

 private:
  bool fused_inference_ = false;
};
TORCH_MODULE(Conv2d);

// A conv with TensorFlow's "SAME" padding (output ceil(input / stride)), as
// timm 0.5.4's create_conv2d(padding='same') builds the convs of its TF ports
// (layers/padding.py, layers/conv2d_same.py): a fixed symmetric padding where
// SAME is one (stride 1 and an even dilated kernel extent: is_static_pad),
// otherwise the input is zero-padded at each call from its size, the odd
// pixel going to the bottom and right (Conv2dSame's pad_same). Same weights
// as a plain conv; exporters write the per-call case as ONNX's auto_pad SAME_UPPER.
class Conv2dSameImpl : public Conv2dImpl {
 public:
  explicit Conv2dSameImpl(torch::nn::Conv2dOptions options);
  torch::Tensor forward(const torch::Tensor& input) override;
  // Whether the padding depends on the input size (timm's Conv2dSame).
  bool dynamic() const { return dynamic_; }

 private:
  bool dynamic_;
};
TORCH_MODULE(Conv2dSame);

// timm's get_same_padding: the total "SAME" padding along one dimension of `size`.
std::int64_t same_padding(std::int64_t size, std::int64_t kernel, std::int64_t stride, std::int64_t dilation);

class LinearImpl : public torch::nn::LinearImpl {
 public:
  LinearImpl(int64_t in_features, int64_t out_features);
  explicit LinearImpl(torch::nn::LinearOptions options);
  torch::Tensor forward(const torch::Tensor& input);
};
TORCH_MODULE(Linear);

// The collectives synchronized BatchNorm needs, implemented by the process
// group (distributed::Group); the model code stays free of communication.
class BatchNormSync {
 public:
  virtual ~BatchNormSync() = default;
  // [world_size, ...]: every rank's `t`, in rank order.
  virtual at::Tensor all_gather(const at::Tensor& t) = 0;
  // In place: the sum of `t` over ranks.
  virtual void all_reduce_sum(at::Tensor& t) = 0;
  virtual int world_size() const = 0;
};

// What a block does with a BatchNorm's output next: nothing the BN could take over, a ReLU, or the residual add
// and then a ReLU. The block says so when it is built, so that which layers fuse is known before the first step.
enum class BnFusion { None, Relu, AddRelu };

// nn.BatchNorm2d, written out, so that it can be synchronized across ranks
// and folded into its conv: the same parameters and buffers, registered in
// PyTorch's order (weight, bias, running_mean, running_var,
// num_batches_tracked), the same initialisation and forward.
//
// Once given a BatchNormSync it normalises training batches with the
// statistics of the global batch (torch.nn.SyncBatchNorm): per-rank count,
// mean and M2 are all-gathered and combined with Chan et al.'s parallel
// variance formula, and backward all-reduces sum(dy) and sum(dy * x_hat).
class BatchNorm2dImpl : public torch::nn::Cloneable<BatchNorm2dImpl> {
 public:
  explicit BatchNorm2dImpl(std::int64_t num_features) : BatchNorm2dImpl(torch::nn::BatchNormOptions(num_features)) {}
  explicit BatchNorm2dImpl(const torch::nn::BatchNormOptions& options);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& input);
  void pretty_print(std::ostream& stream) const override;
  void set_sync(std::shared_ptr<BatchNormSync> sync) { sync_ = std::move(sync); }
  // Folded into the preceding conv (fold_batchnorm): forward is the identity,
  // and training mode is refused.
  void set_folded() { folded_ = true; }
  bool folded() const { return folded_; }
  bool synchronized() const { return sync_ != nullptr; }

  // forward() followed by what `fusion()` names: relu(bn(x)), or relu(bn(x) + residual) with AddRelu. In training
  // on CUDA, with the fused path on, NHWC half or bfloat16 activations and C a multiple of 4, it is one cuDNN call
  // forward and one backward (cudnnBatchNormalization{ForwardTraining,Backward}Ex with CUDNN_BATCHNORM_OPS_BN_
  // [ADD_]ACTIVATION: Paddle's fused_bn_add_activation, MXNet's fused BN): batch statistics in fp32, the running
  // statistics updated as nn.BatchNorm2d's (momentum, unbiased variance), the ReLU mask kept as a bit per element,
  // and the residual's gradient coming out of the same backward pass. Elsewhere the same function as three ops.
  torch::Tensor forward_fused(const torch::Tensor& input, const torch::Tensor& residual = {});
  void set_fusion(BnFusion fusion) { fusion_ = fusion; }
  BnFusion fusion() const { return fusion_; }
  // Off by default: training turns it on (set_fused_batchnorm) unless the block runs unfused or --fusion none.
  void set_fused(bool on) { fused_ = on; }
  bool fused() const { return fused_; }

  torch::nn::BatchNormOptions options;
  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  std::shared_ptr<BatchNormSync> sync_;
  bool folded_ = false;
  BnFusion fusion_ = BnFusion::None;
  bool fused_ = false;
  std::string fused_failure_;  // what cuDNN said when it refused this layer's shape: the three ops from then on
};
TORCH_MODULE(BatchNorm2d);

// What forward_fused calls where it may fuse: the cuDNN implementation (models/fused_bn.cpp), installed once by
// the CUDA build (runtime::set_fused_batchnorm does). The models alone (the fuzz targets, built without CUDA) have
// none, and forward_fused is then always the three ops.
class FusedBnBackend {
 public:
  virtual ~FusedBnBackend() = default;
  // These tensors are what the fused kernels take (CUDA, fp16/bf16 NHWC, C % 4, fp32 parameters, ...).
  virtual bool takes(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight) const = 0;
  // relu(bn(x) [+ residual]) in training mode, the running statistics updated; an Error where cuDNN refuses.
  virtual at::Tensor forward(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                             const at::Tensor& bias, at::Tensor running_mean, at::Tensor running_var, double momentum,
                             double eps) const = 0;
  // Whether the current stream is being captured into a CUDA graph.
  virtual bool capturing() const = 0;
};
void install_fused_bn_backend(const FusedBnBackend* backend);
// The cuDNN backend (models/fused_bn.cpp).
const FusedBnBackend& cudnn_fused_bn_backend();

// An activation dtype as the refusals name it: "fp16", "bfloat16", "fp32", "fp64".
const char* dtype_name(at::ScalarType t);
// fp16 or bfloat16: the activations the fused kernels take.
bool is_half_dtype(at::ScalarType t);

// act(x), the identity for Activation::None.
torch::Tensor activate(const torch::Tensor& x, Activation act);

// act(bn(conv(x)) [+ residual]), the unit of every network's blocks. In inference on CUDA, with the BN folded into
// the conv (fold_batchnorm), its weights in the activations' fp16/bf16 and the fused path on (set_fused_inference),
// one cuDNN graph for the conv, its bias, the add and the activation (TensorRT's conv fusion; cudnn_graphs.h). In
// training, a ReLU the BN was marked for (BnFusion) goes through bn.forward_fused; elsewhere the ops in that order.
torch::Tensor conv_bn_act(Conv2dImpl& conv, BatchNorm2dImpl& bn, const torch::Tensor& x, Activation act,
                          const torch::Tensor& residual = {});
// Its second half, act(bn(y) [+ residual]), for a block that computes the convolution itself.
torch::Tensor bn_act(BatchNorm2dImpl& bn, const torch::Tensor& y, Activation act, const torch::Tensor& residual = {});

// Why `conv` is not a convolution cuDNN's graphs describe (one group, no dilation, a square kernel and stride, one
// symmetric zero padding that does not depend on the input's size), or "". Its bias is the caller's to judge.
std::string conv_shape_refusal(const Conv2dImpl& conv);

// Whether a conv could run fused on an input of `sizes` in `dtype` (fp16 or bf16, NHWC) followed by `act` and
// maybe a residual add, from its options alone: "" and `out` filled with the cuDNN graph's description, else why
// not (grouped, dilated, not square, TF "SAME" padding that depends on the input, ...). cuDNN itself is not asked.
std::string fused_conv_shape_refusal(const Conv2dImpl& conv, at::IntArrayRef sizes, at::ScalarType dtype,
                                     Activation act, bool residual, norm_conv::ConvAct& out);

// What conv_bn_act calls where it may fuse: the cuDNN implementation (models/fused_conv.cpp), installed by the
// CUDA graph engine; without one conv_bn_act is always the ops.
class FusedConvBackend {
 public:
  virtual ~FusedConvBackend() = default;
  // "" where cuDNN runs `conv` on x fused with this epilogue (its plan built), else why not.
  virtual std::string refusal(const Conv2dImpl& conv, const at::Tensor& x, Activation act,
                              const at::Tensor& residual) const = 0;
  virtual at::Tensor forward(const Conv2dImpl& conv, const at::Tensor& x, Activation act,
                             const at::Tensor& residual) const = 0;
};
void install_fused_conv_backend(const FusedConvBackend* backend);
const FusedConvBackend& cudnn_fused_conv_backend();
// Turns inference's fused convolution on or off in every Conv2d of `module` (clearing what each was told before);
// returns how many there are.
int set_fused_inference(torch::nn::Module& module, bool on);
// What ran fused so far: "cuDNN conv+bias+act: 53 of 53 convs" and, for those that did not, their names and why
// ("" when no conv has been through conv_bn_act's fused path or been refused by it).
std::string describe_fused_convs(torch::nn::Module& module);

// Turns synchronized BatchNorm on for every models::BatchNorm2d in `module`;
// returns how many there are.
int enable_sync_batchnorm(torch::nn::Module& module, const std::shared_ptr<BatchNormSync>& sync);
// BatchNorm's training forward with every rank's statistics (models/sync_bn.cpp), through its autograd function.
torch::Tensor sync_batch_norm(const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias,
                              torch::Tensor running_mean, torch::Tensor running_var, double momentum, double eps,
                              BatchNormSync* sync);

}  // namespace models

}  // namespace convnets
