// Synchronized BatchNorm: the batch statistics of every rank combined exactly, as torch.nn.SyncBatchNorm computes
// them (per-rank count, mean and M2 gathered, the gradient's two sums all-reduced).
#include "models/layers.h"

#include <torch/torch.h>

#include <algorithm>

namespace convnets::models {
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

torch::Tensor sync_batch_norm(const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias,
                              torch::Tensor running_mean, torch::Tensor running_var, double momentum, double eps,
                              BatchNormSync* sync) {
  return SyncBatchNormFunction::apply(input, weight, bias, running_mean, running_var, momentum, eps, sync);
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

}  // namespace convnets::models
