// The two gradients that meet at a residual block's input, summed by the convolution that makes the second one (its dgrad's epilogue) instead of by a separate add.
#pragma once

#include "models/layers.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

namespace convnets::models {

// A block's input x feeds its first convolution and its shortcut (x itself, or the downsample convolution), so
// backward brings x two gradients, which autograd sums with one more elementwise kernel per block: 16 fp16 adds a
// ResNet-50 step, 2.7 ms at batch 256 on an H100 (2026-11-27). Here both consumers share a slot: the first
// gradient to arrive is kept in it, and the second, when it is a convolution's, is added as that convolution's
// dgrad writes its output (cuDNN's dgrad with an add in its epilogue, read once instead of written, read and
// written again). Autograd then sees one gradient and an undefined one, and adds nothing.
//
// The slot holds at most one gradient, for one forward's backward; the consumers are x's only two.
class GradSlot;
std::shared_ptr<GradSlot> make_grad_slot();

// x, forward. Backward: its gradient goes into `slot`, or, if a convolution's already waits there, the two are added
// here (the order autograd chose: no epilogue to fold into).
at::Tensor fold_tap(const at::Tensor& x, const std::shared_ptr<GradSlot>& slot);

// conv.forward(x), as autocast would run it (the weight cast to x's half dtype where autocast is on). Backward: the
// weight's gradient as ATen's; the input's gradient summed with what waits in `slot`: by cuDNN's dgrad+add graph on
// CUDA where it has an engine for the shape, else ATen's dgrad and an in-place add (the same arithmetic as
// autograd's sum, bit for bit on the CPU). The first to arrive leaves its gradient in the slot instead.
at::Tensor fold_conv(Conv2dImpl& conv, const at::Tensor& x, const std::shared_ptr<GradSlot>& slot);

// How the gradients handed over through slots were summed since the last reset: in a dgrad's epilogue (cuDNN),
// by an add after an ATen dgrad, or at a tap. What the GPU tests assert ran.
struct FoldCounts {
  std::int64_t epilogue = 0, dgrad_then_add = 0, at_tap = 0;
};
FoldCounts fold_counts();
void reset_fold_counts();

}  // namespace convnets::models
