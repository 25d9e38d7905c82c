// 2:4 structured sparsity (NVIDIA's ASP): the masks, which weights get one and why the others stay dense, and the optimizer that keeps them pruned.
#pragma once

#include "train/optimizer.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace convnets::train {

// apex's m4n2_1d (apex/contrib/sparsity/sparse_masklib.py): of every 4
// consecutive input channels the 2 of largest |w| are kept, for a conv at
// each (output channel, kh, kw) tap: the dimension sparse tensor cores reduce
// over (apex permutes a [K, C, R, S] weight to rows of C; a channels-last
// conv is a K x (R S C) GEMM with C innermost). A Linear [out, in] groups its
// inputs. Ties keep the lower channel, so every rank and device computes the
// same mask. `weight` is 2-D or 4-D with a multiple of 4 input channels.
// Returns uint8 0/1 in the weight's shape (default strides).
at::Tensor mask_2_4(const at::Tensor& weight);

// What a conv/linear weight holds: its zeros, and whether every group of 4
// consecutive input channels (as mask_2_4 groups them) has at most 2
// non-zeros, the pattern sparse tensor cores run.
struct Sparsity {
  std::int64_t numel = 0, zeros = 0;
  std::int64_t groups = 0, dense_groups = 0;  // groups of 4; those with more than 2 non-zeros
  bool groupable = false;                     // 2-D or 4-D with a multiple of 4 input channels
  bool is_2_4() const { return groupable && dense_groups == 0; }
};
Sparsity sparsity_of(const at::Tensor& weight);

// One Conv2d or Linear weight of a model, and why it stays dense ("" when it
// gets a mask).
struct AspLayer {
  std::string name;  // the parameter: "layer1.0.conv1.weight"
  std::vector<std::int64_t> shape;
  std::string dense_reason;
  bool masked() const { return dense_reason.empty(); }
  std::string describe() const;  // "conv1.weight [16, 3, 3, 3]: 3 input channels, not a multiple of 4"
};

// The Conv2d and Linear weights that require gradients, in registration
// order, as apex's init_model_for_pruning walks its whitelist. Left dense:
//   * a weight whose input channels (per group) are not a multiple of 4,
//     which cannot be 2:4 at all;
//   * apex's auto-skip rule, which it applies to fp32 and fp16 alike: output
//     channels not a multiple of 8 or input channels not of 16 (its sparse
//     tensor-core shape check, "For Conv2d dim= K x CRS; we prune along C");
//   * `classifier` (the classifier's weight name), as DLE's PaddlePaddle
//     RN50 v1.5 excludes fc with sparsity.set_excluded_layers (program.py).
std::vector<AspLayer> plan_2_4(const torch::nn::Module& model, const std::string& classifier);

// apex's ASP.init_optimizer_for_pruning around any Optimizer: the gradients
// of pruned weights are zeroed before each step and the weights after it, so
// neither momentum nor weight decay regrows them. The masks live in one flat
// uint8 buffer laid out like FlatParameters::values() (all ones until
// prune()), so each is one elementwise kernel over the flat buffers, on the
// same static tensors in eager steps and in a captured CUDA graph: pruning
// later fills the buffer in place and a graph captured before keeps working.
class AspOptimizer : public Optimizer {
 public:
  // `layers` from plan_2_4 on the model `inner` was made for.
  AspOptimizer(std::unique_ptr<Optimizer> inner, std::vector<AspLayer> layers);

  void zero_grad() override { inner_->zero_grad(); }
  void step(double lr, const at::Tensor& skip = {}) override;
  void step(const at::Tensor& lr, const at::Tensor& skip = {}) override;
  runtime::FlatParameters& flat() override { return inner_->flat(); }
  // The inner optimizer's state, then once pruned "asp_mask.<param>" (uint8)
  // per masked weight.
  NamedTensors state() const override;
  // The inner optimizer's state; masks when the file has any (strict: every
  // masked weight's, each a valid 2:4 mask of its shape), which also prunes
  // the weights. A file without masks leaves the run dense (not yet pruned).
  void load_state(const TensorFile& file, const std::string& source) override;
  std::string name() const override { return inner_->name(); }

  const std::vector<AspLayer>& layers() const { return layers_; }
  bool pruned() const { return pruned_; }
  // Masks from the current weights (mask_2_4), then zeroes the pruned weights.
  void prune();
  // The flat mask buffer, e.g. for a broadcast from rank 0; reapply() after
  // writing it.
  at::Tensor& flat_mask() { return mask_; }
  void reapply();
  // Zeroes the pruned weights in another copy of the model (the EMA), whose
  // parameters carry the same names.
  void apply_to(torch::nn::Module& copy) const;
  // Weights masked and zeroed so far (masked layers only).
  std::int64_t masked_numel() const;

 private:
  struct Masked {
    std::string name;
    const runtime::FlatParameters::Entry* entry;
  };
  std::unique_ptr<Optimizer> inner_;
  std::vector<AspLayer> layers_;
  std::vector<Masked> masked_;
  at::Tensor mask_;
  bool pruned_ = false;
};

}  // namespace convnets::train
