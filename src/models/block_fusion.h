// A residual block's fused training paths, kept beside the block rather than in it: what each path needs of the block's convolutions and BNs, which one it runs, NormConv's per-shape plans, and the input its first convolutions read through BnFold's gradient slot.
#pragma once

#include "models/fusion.h"
#include "models/grad_fold.h"
#include "models/layers.h"
#include "models/norm_conv.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace convnets::models {

// The modules of a residual block (He et al. 2016) that its fused paths run: the branch's conv/BN pairs in order,
// the downsample shortcut's pair (none: the identity), and whether an SE gate follows the branch.
struct ResidualParts {
  std::vector<std::pair<Conv2dImpl*, BatchNorm2dImpl*>> branch;
  Conv2dImpl* downsample_conv = nullptr;
  BatchNorm2dImpl* downsample_bn = nullptr;
  bool squeeze_excitation = false;
};

// The block's input as its first convolution and its shortcut read it. On BnFold both hold the slot where the two
// gradients that meet at the input are summed (models/grad_fold.h); elsewhere it is the input itself.
struct BlockInput {
  at::Tensor x;
  std::shared_ptr<GradSlot> slot;
  // conv_bn_act of a convolution that reads the block's input.
  at::Tensor conv_bn_act(Conv2dImpl& conv, BatchNorm2dImpl& bn, Activation act) const;
  // The identity shortcut.
  at::Tensor identity() const;
};

class ResidualFusion : public FusionTunable {
 public:
  // `block` owns the parts and outlives this; `forward` is its forward as the network calls it.
  ResidualFusion(torch::nn::Module& block, ResidualParts parts, std::function<at::Tensor(const at::Tensor&)> forward);

  std::string path_refusal(FusionPath path, const FusedBnContext& context) const override;
  void set_path(FusionPath path) override;
  FusionPath path() const override { return path_; }
  std::string signature() const override;
  at::Tensor train_forward(const at::Tensor& x) override { return forward_(x); }
  std::vector<std::int64_t> last_input_sizes() const override { return last_input_; }
  torch::nn::Module& module() override { return block_; }

  // Called first by the block's forward. On NormConv, in training, where the block's cuDNN plans build for x's
  // shape: the whole block as one function (models/norm_conv.h). Otherwise none, and `input` says how the block's
  // own ops read x.
  std::optional<at::Tensor> whole_block(const at::Tensor& x);
  BlockInput input(const at::Tensor& x) const;

 private:
  // Whether cuDNN built every plan of the block for x's shape: asked once per shape, outside a capture (the training
  // step's eager warm-up); a shape it has no engine for keeps the fused BN path, said once.
  bool planned(const at::Tensor& x);

  torch::nn::Module& block_;
  ResidualParts parts_;
  std::function<at::Tensor(const at::Tensor&)> forward_;
  norm_conv::Block norm_block_;
  FusionPath path_ = FusionPath::Bn;
  std::vector<std::int64_t> last_input_;
  std::map<std::vector<std::int64_t>, std::string> verdicts_;
};

}  // namespace convnets::models
