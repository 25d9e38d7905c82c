#include "distributed/grad_sync.h"

#include "core/error.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>

namespace convnets::distributed {
namespace {

// Runs after an AccumulateGrad node has added a parameter's gradient to .grad.
class AfterAccumulate : public torch::autograd::FunctionPostHook {
 public:
  explicit AfterAccumulate(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

// The module's buffers of floating (BN running statistics) or integer (BN
// batch counters) type: what DDP broadcasts, one dtype per packed broadcast.
std::vector<at::Tensor> buffers(torch::nn::Module& model, bool floating) {
  std::vector<at::Tensor> out;
  for (const auto& b : model.buffers()) {
    if (b.is_floating_point() == floating) out.push_back(b);
  }
  return out;
}

}  // namespace

GradientReducer::GradientReducer(Group& group, runtime::FlatParameters& flat, double bucket_mb, bool broadcast_buffers)
    : group_(group), flat_(flat), broadcast_buffers_(broadcast_buffers) {
  const auto bucket_bytes = static_cast<std::int64_t>(bucket_mb * (1 << 20));
  if (bucket_bytes <= 0) throw Error("--bucket-mb must be positive");
  const std::int64_t elem = static_cast<std::int64_t>(flat.grads().element_size());
  // DDP's first bucket is small (1 MiB) so the first all-reduce starts after
  // the last layers' gradients, not after 25 MiB of them.
  std::int64_t cap = std::min<std::int64_t>(bucket_bytes, 1 << 20) / elem;
  std::vector<std::size_t> bucket_of(flat.entries().size());
  for (int g = 0; g < flat.groups(); ++g) {
    std::vector<std::size_t> in_group;
    for (std::size_t i = 0; i < flat.entries().size(); ++i) {
      if (flat.entries()[i].group == g) in_group.push_back(i);
    }
    std::sort(in_group.begin(), in_group.end(),
              [&](std::size_t a, std::size_t b) { return flat.entries()[a].offset < flat.entries()[b].offset; });
    const auto range = flat.group(g);
    for (std::size_t k = 0; k < in_group.size(); ++k) {
      const auto& e = flat.entries()[in_group[k]];
      if (buckets_.empty() || buckets_.back().end != -1) {
        buckets_.push_back({e.offset, -1, 0, 0, nullptr});
      }
      auto& b = buckets_.back();
      ++b.params;
      bucket_of[in_group[k]] = buckets_.size() - 1;
      // The bucket reaches up to the next parameter, alignment padding included.
      const std::int64_t next = k + 1 < in_group.size() ? flat.entries()[in_group[k + 1]].offset : range.end;
      if (next - b.begin >= cap || k + 1 == in_group.size()) {
        b.end = next;
        cap = bucket_bytes / elem;
      }
    }
  }
  for (std::size_t i = 0; i < flat.entries().size(); ++i) {
    const auto& value = flat.entries()[i].value;
    auto acc = torch::autograd::impl::grad_accumulator(value);
    if (!acc) throw Error("parameter " + flat.entries()[i].name + " has no gradient accumulator (is it a leaf that requires grad?)");
    const std::size_t b = bucket_of[i];
    acc->add_post_hook(std::make_unique<AfterAccumulate>([this, b] { on_gradient(b); }));
    accumulators_.push_back(std::move(acc));
  }
  stats_.buckets = static_cast<std::int64_t>(buckets_.size());
  stats_.bytes_per_step = flat.grads().numel() * elem;
}

GradientReducer::~GradientReducer() = default;

void GradientReducer::broadcast_packed(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return;
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> flat_views;
  for (const auto& t : tensors) flat_views.push_back(t.reshape({-1}));
  auto packed = torch::cat(flat_views);
  group_.broadcast(packed, 0);
  std::int64_t at = 0;
  for (const auto& t : tensors) {
    t.copy_(packed.narrow(0, at, t.numel()).view(t.sizes()));
    at += t.numel();
  }
}

void GradientReducer::broadcast_state(torch::nn::Module& model) {
  auto values = flat_.values();
  group_.broadcast(values, 0);
  broadcast_packed(buffers(model, /*floating=*/true));
  broadcast_packed(buffers(model, /*floating=*/false));
}

void GradientReducer::begin_step(NetworkImpl& model) {
  if (broadcast_buffers_) broadcast_packed(buffers(model, /*floating=*/true));
}

void GradientReducer::before_backward(bool last_micro) {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = last_micro;
  next_launch_ = 0;
  for (auto& b : buckets_) {
    b.pending = b.params;
    b.work.reset();
  }
}

void GradientReducer::on_gradient(std::size_t bucket) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;
  --buckets_[bucket].pending;
  launch_ready();
}

void GradientReducer::launch_ready() {
  // In bucket order on every rank: collectives must be issued identically everywhere.
  const double inv = 1.0 / static_cast<double>(group_.world_size());
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending <= 0) {
    auto& b = buckets_[next_launch_++];
    auto view = flat_.grads().narrow(0, b.begin, b.end - b.begin);
    view.mul_(inv);
    b.work = group_.all_reduce_async(view, "gradient all-reduce");
  }
}

void GradientReducer::after_backward(bool last_micro) {
  if (!last_micro) return;
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Parameters that took no part in this backward leave their buckets
    // short; they are sent as they are, as DDP's find_unused_parameters does.
    for (auto& b : buckets_) b.pending = 0;
    launch_ready();
    armed_ = false;
  }
  for (auto& b : buckets_) group_.wait(*b.work);
  stats_.exposed_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.steps;
}

}  // namespace convnets::distributed
