#include "train/sgd.h"

#include "core/error.h"
#include "io/state_dict.h"

#include <torch/torch.h>


namespace convnets::train {

Sgd::Sgd(torch::nn::Module& model, SgdOptions options)
    : options_(options),
      flat_(model, 2, [&](const std::string&, const at::Tensor& p) { return options.decay_all || p.dim() > 1 ? 0 : 1; }) {
  // Zeros until the first step: 0 * m + d equals torch's clone(d) bit for bit.
  momentum_ = flat_.make_buffer();
  for (const auto& e : flat_.entries()) {
    params_.push_back({e.name, e.value, flat_.view(momentum_, e), e.group == 0 ? options_.weight_decay : 0.0});
  }
}

template <typename Apply>
void Sgd::update(const at::Tensor& skip, Apply&& apply_lr) {
  torch::NoGradGuard no_grad;
  // torch/optim/sgd.py _single_tensor_sgd (dampening 0) on one slice.
  auto update_slice = [&](std::int64_t begin, std::int64_t end, double wd) {
    auto p = flat_.values().slice(0, begin, end);
    auto m = momentum_.slice(0, begin, end);
    const auto grad = flat_.grads().slice(0, begin, end);
    auto d_p = wd != 0 ? grad.add(p, wd) : grad;
    if (options_.momentum != 0) {
      if (skip.defined()) {
        auto buf = m.mul(options_.momentum).add_(d_p);
        d_p = options_.nesterov ? d_p.add(buf, options_.momentum) : buf;
        m.copy_(torch::where(skip, m, buf));
      } else {
        m.mul_(options_.momentum).add_(d_p);
        d_p = options_.nesterov ? d_p.add(m, options_.momentum) : m;
      }
    }
    if (skip.defined()) {
      auto next = p.clone();
      apply_lr(next, d_p);
      p.copy_(torch::where(skip, p, next));
    } else {
      apply_lr(p, d_p);
    }
  };
  flat_.for_each_slice([&](std::int64_t begin, std::int64_t end, int group) {
    update_slice(begin, end, group == 0 ? options_.weight_decay : 0.0);
  });
}

void Sgd::step(double lr, const at::Tensor& skip) {
  update(skip, [lr](at::Tensor& p, const at::Tensor& d) { p.add_(d, -lr); });
}

void Sgd::step(const at::Tensor& lr, const at::Tensor& skip) {
  update(skip, [&lr](at::Tensor& p, const at::Tensor& d) { p.sub_(d * lr); });
}

NamedTensors Sgd::state() const {
  NamedTensors out;
  for (const auto& p : params_) out.emplace_back("optimizer.momentum." + p.name, p.momentum);
  return out;
}

void Sgd::load_state(const TensorFile& file, const std::string& source) {
  std::vector<at::Tensor> loaded;
  for (const auto& p : params_) {
    const auto* t = file.find("optimizer.momentum." + p.name);
    if (!t) throw Error(source + ": no momentum buffer for parameter '" + p.name + "'");
    if (t->sizes() != p.momentum.sizes()) {
      throw Error(source + ": momentum buffer '" + p.name + "' has shape " + c10::str(t->sizes()) +
                  ", the model's parameter " + c10::str(p.momentum.sizes()));
    }
    check_dtype_fills(p.momentum, *t, "optimizer.momentum." + p.name, source);
    loaded.push_back(*t);
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].momentum.copy_(loaded[i]);
}

}  // namespace convnets::train
