// How a residual block may run its training step (the fusion paths), which paths `--fusion` admits and which are verified, and what the step's tuner asks of a block.
#pragma once

#include "models/fusion_mode.h"
#include "models/layers.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace convnets::models {

// What decides whether a BatchNorm2d's forward_fused runs as one cuDNN call, as known before the first step: the
// --fusion mode, a training run's device, the activations' dtype (autocast's), their memory format, and whether cuDNN
// took a probe call of the fused kernels in that dtype (cudnn_fused_bn_refusal; the CPU tests set it by hand).
struct FusedBnContext {
  FusionMode mode = FusionMode::Auto;
  bool cuda = false;
  bool training = true;
  at::ScalarType dtype = at::kFloat;
  bool channels_last = true;
  std::string cudnn_refusal;     // "" where cuDNN ran the probe in `dtype` (or it was not asked)
};

// Why a BatchNorm of `channels` followed by `fusion` cannot run fused in `context`, or "" if it can. The same rule
// forward_fused applies to the tensors it is given.
std::string fused_bn_refusal(const FusedBnContext& context, BnFusion fusion, std::int64_t channels, bool synchronized);

// What cuDNN's fused BN kernels take, the part of that rule a tensor shows: fp16 or bfloat16 activations, NHWC,
// channels a multiple of 4. Why `dtype`, `channels_last` and `channels` are not that, or "".
std::string fused_bn_layout_refusal(at::ScalarType dtype, bool channels_last, std::int64_t channels);

// cuDNN asked once per dtype (cached), with a tiny BN+add+ReLU forward and backward on the current CUDA device:
// "" if it ran them, else what cuDNN said ("cuDNN 9.19.0 refused bfloat16: CUDNN_STATUS_NOT_SUPPORTED"). The
// kernels exist for fp16 in every cuDNN 9; for bfloat16 only in some. Must not run while a CUDA graph is captured.
// Defined with the kernels' calls in models/fused_bn.cpp.
std::string cudnn_fused_bn_refusal(at::ScalarType dtype);

// One BatchNorm2d of a network and what happens to it.
struct FusedBnLayer {
  std::string name;       // its state_dict prefix: layer1.0.bn3
  BnFusion fusion = BnFusion::None;
  std::int64_t channels = 0;
  std::string refusal;    // "" where it runs fused
};
// Every BatchNorm2d of `module` in registration order, with the rule applied; a layer the rule allows whose block
// runs unfused (the tuner's choice) says so.
std::vector<FusedBnLayer> fused_bn_plan(torch::nn::Module& module, const FusedBnContext& context);
// One line for the training run's start: "49 of 53 BatchNorm layers fused (33 BN+ReLU, 16 BN+add+ReLU); not
// fused: 4 with no ReLU after them (layer1.0.downsample.1, ...)", the reasons grouped.
std::string describe_fused_bn_plan(const std::vector<FusedBnLayer>& plan);
// Turns the fused path of every BatchNorm2d in `module` on or off (forward_fused still applies the rule to the tensors
// it is given); returns how many have a fusion to run.
int set_fused_batchnorm(torch::nn::Module& module, bool on);

// Why `path` in `dtype` is not yet shown on a GPU to learn as the unfused step does (Gpu.*'s bounds, the 200-step
// parity among them), or "" where it is. `auto` never chooses an unverified path; a forced --fusion runs it and says so.
std::string unverified(FusionPath path, at::ScalarType dtype);

// How many fused calls were made since the last reset, counted on the host as each is made (a replayed CUDA graph
// adds none): cuDNN's BN+ReLU and BN+add+ReLU calls, residual blocks run as NormConv on cuDNN. What the GPU tests
// assert ran before they compare anything.
struct FusedRuns {
  std::int64_t bn = 0, normconv = 0;
};
FusedRuns fused_runs();
void reset_fused_runs();
enum class FusedRun { Bn, NormConv };
void note_fused_run(FusedRun what);

// A residual block whose training path can be chosen: the tuner asks it what it can run, times it in isolation on
// an input of the shape it last saw, and sets what it keeps.
class FusionTunable {
 public:
  virtual ~FusionTunable() = default;
  // Why this block cannot run `path` in `context` ("" if it can): the path's rules (CUDA, half precision, NHWC, the
  // mode admitting it) and the block's shape.
  virtual std::string path_refusal(FusionPath path, const FusedBnContext& context) const = 0;
  virtual void set_path(FusionPath path) = 0;
  virtual FusionPath path() const = 0;
  // What besides its input's shape decides this block's speed: its convolutions and shortcut
  // ("bottleneck 256>64>64>256 s1, identity").
  virtual std::string signature() const = 0;
  // The block's forward, as the network calls it: what the tuner times.
  virtual at::Tensor train_forward(const at::Tensor& x) = 0;
  // The sizes of the input of its last training forward (NCHW order); empty before one.
  virtual std::vector<std::int64_t> last_input_sizes() const = 0;
  // The block's module: its parameters and buffers, which the tuner's timing leaves as it found them.
  virtual torch::nn::Module& module() = 0;
};

// A module whose training path can be chosen (a residual block), as tunable_blocks finds it.
class TunableModule {
 public:
  virtual ~TunableModule() = default;
  virtual FusionTunable& tunable() = 0;
};

// Every TunableModule's FusionTunable in `module`, with its state_dict prefix (layer1.0), in registration order.
std::vector<std::pair<std::string, FusionTunable*>> tunable_blocks(torch::nn::Module& module);

// Each block's path set from `mode` alone, before any timing: its most preferred admitted path that the block can
// run in `context` (for auto: of the verified ones, Bn first, as measured fastest on the H100 of 2026-11-27), else
// Unfused. Returns how many blocks run a fused path.
int set_default_paths(torch::nn::Module& module, const FusedBnContext& context);

// Each tunable block's path as an int64 tensor (CPU), in tunable_blocks' order, and back: how a data-parallel run's
// ranks agree on rank 0's choices. set_block_paths throws for a count or value that is not this network's.
at::Tensor block_paths(torch::nn::Module& module);
void set_block_paths(torch::nn::Module& module, const at::Tensor& paths);

// "16 of 16 residual blocks: 13 bn+fold, 3 bn" with the blocks that run unfused and why; "" for a network without
// such blocks.
std::string describe_block_paths(torch::nn::Module& module, const FusedBnContext& context);

}  // namespace convnets::models
