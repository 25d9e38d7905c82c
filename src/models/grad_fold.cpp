#include "models/grad_fold.h"

#include "models/cudnn_graphs.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <atomic>
#include <variant>

namespace convnets::models {

class GradSlot {
 public:
  at::Tensor held;  // the first of the two gradients, until the second arrives
};

std::shared_ptr<GradSlot> make_grad_slot() { return std::make_shared<GradSlot>(); }

namespace {

std::atomic<std::int64_t> epilogue_sums{0}, add_sums{0}, tap_sums{0};

// saved_data holds IValues: the slot travels in a capsule.
struct SlotHolder : torch::CustomClassHolder {
  explicit SlotHolder(std::shared_ptr<GradSlot> s) : slot(std::move(s)) {}
  std::shared_ptr<GradSlot> slot;
};

c10::IValue capsule(const std::shared_ptr<GradSlot>& slot) {
  return c10::IValue::make_capsule(c10::make_intrusive<SlotHolder>(slot));
}

GradSlot& slot_of(torch::autograd::AutogradContext* ctx) {
  auto held = ctx->saved_data["slot"].toCapsule();
  return *static_cast<SlotHolder*>(held.get())->slot;
}

struct TapFunction : public torch::autograd::Function<TapFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const std::shared_ptr<GradSlot>& slot) {
    ctx->saved_data["slot"] = capsule(slot);
    return x;  // autograd hands it on as a view with this function as its grad_fn
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto& slot = slot_of(ctx);
    if (!slot.held.defined()) {
      slot.held = grads[0];
      return {at::Tensor(), at::Tensor()};
    }
    // The convolution came first: its dgrad waits here, and the sum is an add after all.
    auto sum = slot.held + grads[0];
    slot.held = at::Tensor();
    ++tap_sums;
    return {sum, at::Tensor()};
  }
};

// What fold_conv's backward needs of the convolution besides its tensors.
struct ConvShape {
  std::vector<std::int64_t> stride, padding, dilation;
  std::int64_t groups = 1;
};

ConvShape shape_of(const Conv2dImpl& conv) {
  const auto& o = conv.options;
  const auto* pad = std::get_if<torch::ExpandingArray<2>>(&o.padding());
  TORCH_CHECK(pad, "fold_conv: a convolution with explicit padding (not TF \"SAME\")");
  return {{(*o.stride())[0], (*o.stride())[1]}, {(**pad)[0], (**pad)[1]}, {(*o.dilation())[0], (*o.dilation())[1]},
          o.groups()};
}

// dgrad(dy, w) + addend, written once: cuDNN's graph where it has an engine for this shape, else ATen's dgrad and an
// in-place add on its fresh output.
at::Tensor dgrad_plus(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const ConvShape& s,
                      const at::Tensor& addend) {
  if (dy.is_cuda() && (dy.scalar_type() == at::kHalf || dy.scalar_type() == at::kBFloat16) && s.groups == 1 &&
      s.stride[0] == s.stride[1] && s.padding[0] == s.padding[1] && s.dilation[0] == 1 && s.dilation[1] == 1 &&
      w.size(2) == w.size(3) && addend.scalar_type() == dy.scalar_type() && w.scalar_type() == dy.scalar_type()) {
    norm_conv::ConvGeometry g;
    g.n = x.size(0), g.c = x.size(1), g.h = x.size(2), g.w = x.size(3);
    g.k = w.size(0), g.r = w.size(2), g.s = w.size(3), g.stride = s.stride[0], g.pad = s.padding[0];
    g.dtype = dy.scalar_type();
    if (norm_conv::dgrad_add_refusal(g).empty()) {
      const auto cl = at::MemoryFormat::ChannelsLast;
      auto dx = at::empty_like(x, cl);
      norm_conv::dgrad_add(g, dy.contiguous(cl), w.contiguous(cl), addend.contiguous(cl), dx);
      ++epilogue_sums;
      return dx;
    }
  }
  auto dx = std::get<0>(at::convolution_backward(dy, x, w, std::nullopt, s.stride, s.padding, s.dilation, false,
                                                 {0, 0}, s.groups, {true, false, false}));
  dx.add_(addend);
  ++add_sums;
  return dx;
}

struct FoldConvFunction : public torch::autograd::Function<FoldConvFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const std::shared_ptr<GradSlot>& slot, const ConvShape& s) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["slot"] = capsule(slot);
    ctx->saved_data["stride"] = s.stride;
    ctx->saved_data["padding"] = s.padding;
    ctx->saved_data["dilation"] = s.dilation;
    ctx->saved_data["groups"] = s.groups;
    return at::convolution(x, w, std::nullopt, s.stride, s.padding, s.dilation, false, {0, 0}, s.groups);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& w = saved[1];
    const ConvShape s{ctx->saved_data["stride"].toIntVector(), ctx->saved_data["padding"].toIntVector(),
                      ctx->saved_data["dilation"].toIntVector(), ctx->saved_data["groups"].toInt()};
    const auto& dy = grads[0];
    at::Tensor dw, dx;
    if (ctx->needs_input_grad(1)) {
      dw = std::get<1>(at::convolution_backward(dy, x, w, std::nullopt, s.stride, s.padding, s.dilation, false, {0, 0},
                                                s.groups, {false, true, false}));
    }
    if (ctx->needs_input_grad(0)) {
      auto& slot = slot_of(ctx);
      if (!slot.held.defined()) {
        slot.held = std::get<0>(at::convolution_backward(dy, x, w, std::nullopt, s.stride, s.padding, s.dilation,
                                                         false, {0, 0}, s.groups, {true, false, false}));
      } else {
        dx = dgrad_plus(dy, x, w, s, slot.held);
        slot.held = at::Tensor();
      }
    }
    return {dx, dw, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor fold_tap(const at::Tensor& x, const std::shared_ptr<GradSlot>& slot) {
  if (!x.requires_grad() || !torch::GradMode::is_enabled()) return x;
  return TapFunction::apply(x, slot);
}

at::Tensor fold_conv(Conv2dImpl& conv, const at::Tensor& x, const std::shared_ptr<GradSlot>& slot) {
  TORCH_CHECK(!conv.options.bias(), "fold_conv: a convolution without bias (a ResNet block's)");
  at::Tensor in = x, w = conv.weight;
  // What autocast does for conv2d, done before the function so that its cast's backward is autocast's own.
  const auto type = x.device().type();
  if ((type == at::kCUDA || type == at::kCPU) && at::autocast::is_autocast_enabled(type)) {
    const auto half = at::autocast::get_autocast_dtype(type);
    in = at::autocast::cached_cast(half, x, type);
    w = at::autocast::cached_cast(half, w, type);
  }
  return FoldConvFunction::apply(in, w, slot, shape_of(conv));
}

FoldCounts fold_counts() { return {epilogue_sums.load(), add_sums.load(), tap_sums.load()}; }

void reset_fold_counts() { epilogue_sums = 0, add_sums = 0, tap_sums = 0; }

}  // namespace convnets::models
