#include "train/rmsprop.h"

#include "core/error.h"
#include "io/state_dict.h"

#include <torch/torch.h>

namespace convnets::train {

RmsProp::RmsProp(torch::nn::Module& model, const OptimizerOptions& options)
    : options_(options),
      tf_(options.kind == "rmsproptf"),
      flat_(model, 2, [&](const std::string&, const at::Tensor& p) { return options.decay_all || p.dim() > 1 ? 0 : 1; }) {
  if (!tf_ && options.kind != "rmsprop") throw Error("RmsProp: kind must be rmsproptf or rmsprop, got '" + options.kind + "'");
  square_avg_ = flat_.make_buffer();
  if (tf_) square_avg_.fill_(1.0);  // TF initialises the mean square to 1, PyTorch to 0
  momentum_ = flat_.make_buffer();
}

void RmsProp::update(const at::Tensor& skip, const at::Tensor* lr_tensor, double lr) {
  torch::NoGradGuard no_grad;
  const double alpha = options_.alpha, mom = options_.momentum, eps = options_.eps;
  const auto times_lr = [&](at::Tensor t) { return lr_tensor ? t.mul_(*lr_tensor) : t.mul_(lr); };
  flat_.for_each_slice([&](std::int64_t begin, std::int64_t end, int group) {
    const double wd = group == 0 ? options_.weight_decay : 0.0;
    auto p = flat_.values().slice(0, begin, end);
    auto v = square_avg_.slice(0, begin, end);
    auto m = momentum_.slice(0, begin, end);
    const auto grad = flat_.grads().slice(0, begin, end);
    const auto g = wd != 0 ? grad.add(p, wd) : grad;
    auto v_next = v + (g.square() - v) * (1.0 - alpha);
    // TF's form scales the step before the momentum buffer, PyTorch's the buffer after it.
    const auto step = tf_ ? times_lr(g / (v_next + eps).sqrt()) : g / v_next.sqrt().add_(eps);
    const auto m_next = mom > 0 ? m.mul(mom).add_(step) : step;
    const auto p_step = tf_ ? m_next : (lr_tensor ? m_next.mul(*lr_tensor) : m_next.mul(lr));
    if (skip.defined()) {
      v.copy_(torch::where(skip, v, v_next));
      if (mom > 0) m.copy_(torch::where(skip, m, m_next));
      p.copy_(torch::where(skip, p, p - p_step));
    } else {
      v.copy_(v_next);
      if (mom > 0) m.copy_(m_next);
      p.sub_(p_step);
    }
  });
}

void RmsProp::step(double lr, const at::Tensor& skip) { update(skip, nullptr, lr); }

void RmsProp::step(const at::Tensor& lr, const at::Tensor& skip) { update(skip, &lr, 0.0); }

NamedTensors RmsProp::state() const {
  NamedTensors out;
  for (const auto& e : flat_.entries()) {
    out.emplace_back("optimizer.square_avg." + e.name, flat_.view(square_avg_, e));
    out.emplace_back("optimizer.momentum." + e.name, flat_.view(momentum_, e));
  }
  return out;
}

void RmsProp::load_state(const TensorFile& file, const std::string& source) {
  auto targets = state();
  std::vector<at::Tensor> loaded;
  for (const auto& [name, t] : targets) {
    const auto* f = file.find(name);
    if (!f) throw Error(source + ": no '" + name + "' (an " + this->name() + " state buffer)");
    if (f->sizes() != t.sizes()) {
      throw Error(source + ": '" + name + "' has shape " + c10::str(f->sizes()) + ", the model's parameter " +
                  c10::str(t.sizes()));
    }
    check_dtype_fills(t, *f, name, source);
    loaded.push_back(*f);
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < targets.size(); ++i) targets[i].second.copy_(loaded[i]);
}

}  // namespace convnets::train
