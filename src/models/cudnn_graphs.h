// The cuDNN graphs convnets runs, built and cached per shape through cuDNN's header-only frontend (the one file that includes it): the NormConv block's (MLPerf's, Paddle's fused_resunit: a convolution with a scale+bias+ReLU prologue and per-channel statistics in its epilogue, its dgrad with the ReLU's and BN's backward reductions, its wgrad with the prologue again) and inference's convolution with its bias, residual add and activation in one.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace convnets::models {

// What a convolution's output goes through last in inference: nothing, a ReLU, or SiLU (GPUNet's and
// EfficientNet's swish).
enum class Activation { None, ReLU, SiLU };

}  // namespace convnets::models

namespace convnets::models::norm_conv {

// One convolution of a block: its input (sizes in NCHW order, memory NHWC), filters [k, c, r, s] (memory KRSC: a
// channels-last weight), stride and padding; fp16 or bfloat16 activations, fp32 statistics.
struct ConvGeometry {
  std::int64_t n = 0, c = 0, h = 0, w = 0;
  std::int64_t k = 0, r = 1, s = 1;
  std::int64_t stride = 1, pad = 0;
  at::ScalarType dtype = at::kHalf;

  // An input of sizes n, c, h, w and filters of sizes k, c, r, s: how every caller fills one.
  static ConvGeometry of(at::IntArrayRef input, at::IntArrayRef weight, std::int64_t stride, std::int64_t pad,
                         at::ScalarType dtype) {
    ConvGeometry g;
    g.n = input[0], g.c = input[1], g.h = input[2], g.w = input[3];
    g.k = weight[0], g.r = weight[2], g.s = weight[3];
    g.stride = stride, g.pad = pad, g.dtype = dtype;
    return g;
  }

  std::int64_t out_h() const { return (h + 2 * pad - r) / stride + 1; }
  std::int64_t out_w() const { return (w + 2 * pad - s) / stride + 1; }
  std::string str() const;  // "3x3/2 256->256 at 28x28, batch 64, fp16"
};

// y = conv(prologue ? relu(x * scale + bias) : x, w), and sum(y) and sum(y^2) per output channel (fp32 [k]).
// scale and bias: [c] in the activations' dtype (the previous BN as one affine map).
void conv_genstats(const ConvGeometry& g, bool prologue, const at::Tensor& x, const at::Tensor& w,
                   const at::Tensor& scale, const at::Tensor& bias, const at::Tensor& y, const at::Tensor& sum,
                   const at::Tensor& sumsq);

// The backward of relu(bn(y)) followed by the convolution `g` (whose input is that ReLU's output): the conv's
// dgrad of dy, masked where gamma * (y - mean) * invstd + beta <= 0, written to dz; and per channel of y the sums
// BN's backward needs, sum(dz) into dsum and sum(dz * (y - mean) * invstd) into dsum_xhat (fp32 [c]).
void dgrad_drelu_dbn(const ConvGeometry& g, const at::Tensor& dy, const at::Tensor& w, const at::Tensor& y,
                     const at::Tensor& mean, const at::Tensor& invstd, const at::Tensor& gamma, const at::Tensor& beta,
                     const at::Tensor& dz, const at::Tensor& dsum, const at::Tensor& dsum_xhat);

// The filters' gradient of `g` when its input is relu(x * scale + bias): dw = wgrad(dy, that input), in the
// activations' dtype.
void wgrad_prologue(const ConvGeometry& g, const at::Tensor& dy, const at::Tensor& x, const at::Tensor& scale,
                    const at::Tensor& bias, const at::Tensor& dw);

// Builds (and caches) the plan of a block's convolution `g`'s forward graph (with or without the prologue): an
// Error naming it where cuDNN has no engine, and the block keeps the fused BN path. Call outside a capture. Its two
// backward graphs are built at the first backward, on autograd's thread; their absence is not an error: that step
// then runs unfused (ATen's convolution and the project's kernels), which fused_dgrad / fused_wgrad say.
void prepare(const ConvGeometry& g, bool prologue);
bool fused_dgrad(const ConvGeometry& g);
bool fused_wgrad(const ConvGeometry& g);
// Off: every backward step runs unfused as where cuDNN has no engine (the GPU tests check that path this way).
void set_fused_backward(bool on);
// What cuDNN said of each graph it had no engine for (forward or backward), "; "-separated; "" if none.
std::string backward_fallbacks();

// Each graph of `g` (with and without the prologue, dgrad, wgrad) taken as far as cuDNN goes without a GPU:
// validated and lowered to cuDNN's operation graph. "" when all pass, else which failed and what cuDNN said.
std::string check_graphs(const ConvGeometry& g);

// Further, still without a GPU, for the device `device_json` describes (cuDNN's own JSON form of a device's
// properties, as DeviceProperties::serialize writes it on one: cuDNN 9.8 and later plan for it deviceless): cuDNN's
// heuristics asked for engines, their support checked and the plans built, for each graph a training step of `g`
// runs (with a prologue: the three; without: the forward's). "" when all build, else which did not and why.
// `sm_version`: the device's compute capability as cuDNN counts it (90: an H100 or H200).
std::string check_plans(const ConvGeometry& g, bool prologue, const std::string& device_json, int sm_version);

// ---- Inference: y = act(conv(x, w) + bias [+ residual]), BN folded into w and bias (TensorRT's conv fusion) ----

struct ConvAct {
  ConvGeometry g;
  Activation act = Activation::None;
  bool residual = false;
};
// "" where cuDNN has an engine for `c` on this device (its plan built and cached, once per shape and handle; inside
// a CUDA graph capture only a plan built before counts), else what cuDNN said.
std::string conv_bias_act_refusal(const ConvAct& c);
// bias: [k] in the activations' dtype; residual: y's shape, or undefined without one.
void conv_bias_act(const ConvAct& c, const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                   const at::Tensor& residual, const at::Tensor& y);
// check_plans's question for this graph: "" when cuDNN plans it for the described device.
std::string check_conv_act_plans(const ConvAct& c, const std::string& device_json, int sm_version);

// ---- Training: a block input's gradient summed as the convolution's dgrad writes it (models/grad_fold.h) ----

// "" where cuDNN has an engine for dx = dgrad(dy, w) + addend of the convolution `g` on this device (its plan built
// and cached; inside a capture only a plan built before counts), else what cuDNN said.
std::string dgrad_add_refusal(const ConvGeometry& g);
// dy: the conv's output gradient; addend and dx: its input's shape; all channels-last in g.dtype.
void dgrad_add(const ConvGeometry& g, const at::Tensor& dy, const at::Tensor& w, const at::Tensor& addend,
               const at::Tensor& dx);
// check_plans's question for this graph: "" when cuDNN plans it for the described device.
std::string check_dgrad_add_plans(const ConvGeometry& g, const std::string& device_json, int sm_version);

// How many plans the cache holds (each a graph built for one shape on one cuDNN handle).
std::size_t cached_plans();

}  // namespace convnets::models::norm_conv
