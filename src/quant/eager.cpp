#include "quant/eager.h"

#include "core/error.h"
#include "runtime/progress.h"

#include <torch/torch.h>

#include <chrono>
#include <map>
#include <variant>

namespace convnets::quant {
namespace {

enum class Mode { Plain, Observe, FakeQuant };

// GraphEmitter ops computed on tensors (values are names in a map), and the
// placement's quantize() as identity, observation or fake quantization.
class EagerEmitter : public GraphEmitter, public Backend {
 public:
  EagerEmitter(Mode mode, const std::vector<Point>* points, Activations activations, std::int64_t weight_qmax = 127,
               std::vector<Observer>* observers = nullptr, bool histogram = false)
      : mode_(mode),
        points_(points),
        activations_(activations),
        weight_qmax_(weight_qmax),
        observers_(observers),
        histogram_(histogram) {}

  Value bind(const torch::Tensor& x) { return put(x); }
  const torch::Tensor& get(const Value& v) const { return values_.at(v); }

  Value quantize(const Value& x, std::size_t index) override {
    const auto& t = get(x);
    const Point& p = points_->at(index);
    if (mode_ == Mode::FakeQuant) {
      const Params q = activation_params(p, activations_);
      // In fp32 whatever autocast computes in: the grid must be exact.
      const auto y = torch::fake_quantize_per_tensor_affine(t.to(torch::kFloat), q.scale, q.zero_point, q.qmin, q.qmax);
      return put(y.to(t.scalar_type()));
    }
    auto y = p.relu ? torch::relu(t) : t;
    if (mode_ == Mode::Observe) {
      if (observers_->size() <= index) observers_->resize(index + 1);
      auto& o = (*observers_)[index];
      if (histogram_) {
        o.add_histogram(y);
      } else {
        o.add_minmax(y);
      }
    }
    return put(y);
  }

  Value conv_bn(const Value& x, const models::Conv2dImpl& c, const std::string& name, const models::BatchNorm2dImpl& bn,
                const std::string&) override {
    // Folded as the export folds (models/graph.h fold_conv_bn), here in the
    // autograd graph so that gamma, beta and the weights train through it.
    const auto scale = bn.weight / (bn.running_var + bn.options.eps()).sqrt();
    const auto w = c.weight * scale.view({-1, 1, 1, 1});
    const auto b0 = c.bias.defined() ? c.bias : torch::zeros_like(bn.running_mean);
    const auto b = (b0 - bn.running_mean) * scale + bn.bias;
    return put(conv2d(get(x), c, name, weight(w), b));
  }

  Value conv(const Value& x, const models::Conv2dImpl& c, const std::string& name) override {
    return put(conv2d(get(x), c, name, weight(c.weight), c.bias));
  }

  Value linear(const Value& x, const models::LinearImpl& fc, const std::string&) override {
    return put(torch::linear(get(x), weight(fc.weight), fc.bias));
  }

  Value linear_1x1(const Value& x, const models::LinearImpl& fc, const std::string&) override {
    const auto w = weight(fc.weight).view({fc.weight.size(0), fc.weight.size(1), 1, 1});
    return put(torch::conv2d(get(x), w, fc.bias));
  }

  Value relu(const Value& x) override { return put(torch::relu(get(x))); }
  Value silu(const Value& x) override { return put(torch::silu(get(x))); }
  Value sigmoid(const Value& x) override { return put(torch::sigmoid(get(x))); }
  Value add(const Value& a, const Value& b) override { return put(get(a) + get(b)); }
  Value mul(const Value& a, const Value& b) override { return put(get(a) * get(b)); }
  Value max_pool(const Value& x, int kernel, int stride, int padding) override {
    return put(torch::max_pool2d(get(x), kernel, stride, padding));
  }
  Value global_avg_pool(const Value& x) override { return put(get(x).mean({2, 3}, /*keepdim=*/true)); }
  Value flatten(const Value& x) override { return put(get(x).flatten(1)); }

 private:
  Value put(torch::Tensor t) {
    // Appended rather than "v" + ...: GCC 12 warns falsely (-Wstringop-overflow) on operator+(const char*, string&&).
    Value name = "v";
    name += std::to_string(values_.size());
    values_.emplace(name, std::move(t));
    return name;
  }

  // Per output channel symmetric int8, as the export writes the weights.
  torch::Tensor weight(const torch::Tensor& w) const {
    if (mode_ != Mode::FakeQuant) return w;
    const auto scales = weight_scales(w, weight_qmax_).to(w.device());
    const auto zeros = torch::zeros({w.size(0)}, torch::dtype(torch::kInt).device(w.device()));
    return torch::fake_quantize_per_channel_affine(w.to(torch::kFloat), scales, zeros, 0, -weight_qmax_, weight_qmax_)
        .to(w.scalar_type());
  }

  static torch::Tensor conv2d(const torch::Tensor& x, const models::Conv2dImpl& c, const std::string& name,
                              const torch::Tensor& w, const torch::Tensor& b) {
    const auto& o = c.options;
    const auto* pad = std::get_if<torch::ExpandingArray<2>>(&o.padding());
    if (!pad) throw Error("quantization: layer " + name + " uses 'same'/'valid' padding by name");
    auto in = x;
    if (const auto* same = dynamic_cast<const models::Conv2dSameImpl*>(&c); same && same->dynamic()) {
      // timm's Conv2dSame: the odd pixel padded at the end, per call.
      const auto& k = *o.kernel_size();
      const auto& s = *o.stride();
      const auto& d = *o.dilation();
      const auto ph = models::same_padding(x.size(2), k[0], s[0], d[0]);
      const auto pw = models::same_padding(x.size(3), k[1], s[1], d[1]);
      if (ph > 0 || pw > 0) in = torch::constant_pad_nd(x, {pw / 2, pw - pw / 2, ph / 2, ph - ph / 2}, 0);
    }
    return torch::conv2d(in, w, b, *o.stride(), **pad, *o.dilation(), o.groups());
  }

  Mode mode_;
  const std::vector<Point>* points_;
  Activations activations_;
  std::int64_t weight_qmax_;
  std::vector<Observer>* observers_;
  bool histogram_;
  std::map<Value, torch::Tensor> values_;
};

}  // namespace

Plan calibrate(NetworkImpl& model, data::Loader& loader, const runtime::Runtime& rt, const Preprocessing& pre,
               Activations activations, Method method, bool reduce_range, Silu silu, const std::string& progress) {
  torch::NoGradGuard no_grad;
  model.eval();
  Plan plan;
  plan.activations = activations;
  plan.method = method;
  plan.reduce_range = reduce_range;
  plan.silu = silu;
  std::vector<Observer> observers;
  const int passes = method == Method::MinMax ? 1 : 2;
  for (int pass = 0; pass < passes; ++pass) {
    std::optional<runtime::Progress> bar;
    if (!progress.empty()) {
      bar.emplace(progress + (passes > 1 ? " pass " + std::to_string(pass + 1) + "/2" : ""), loader.batches_per_epoch(),
                  50, runtime::Progress::stdout_is_terminal());
    }
    loader.start_epoch(0);
    data::Batch batch;
    std::int64_t images = 0;
    const auto start = std::chrono::steady_clock::now();
    while (loader.next(batch)) {
      EagerEmitter e(Mode::Observe, &plan.points, activations, weight_qmax(reduce_range), &observers,
                     /*histogram=*/pass == 1);
      QdqEmitter q(e, e, plan.points, activations, silu, /*creating=*/pass == 0 && images == 0);
      (void)model.emit(q, e.bind(runtime::network_input(batch.images, pre, rt)));
      q.finish();
      images += batch.labels.size(0);
      if (bar) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        bar->update(batch.number + 1, s > 0 ? static_cast<double>(images) / s : 0, "");
      }
    }
    if (images == 0) throw Error("calibration: the data gave no images");
    plan.images = images;
  }
  for (std::size_t i = 0; i < plan.points.size(); ++i) choose_range(plan.points[i], observers.at(i), method, activations);
  return plan;
}

FakeQuantNetworkImpl::FakeQuantNetworkImpl(Network inner, std::shared_ptr<const Plan> plan)
    : inner_(std::move(inner)), plan_(std::move(plan)) {
  // LibTorch lists a module's own parameters before its children's: the
  // same order keeps optimizer state and EMA pairing position for position.
  for (auto& p : inner_->named_parameters(/*recurse=*/false)) register_parameter(p.key(), p.value(), p.value().requires_grad());
  for (auto& b : inner_->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  for (auto& c : inner_->named_children()) register_module(c.key(), c.value());
}

torch::Tensor FakeQuantNetworkImpl::forward(torch::Tensor x) {
  EagerEmitter e(Mode::FakeQuant, &plan_->points, plan_->activations, weight_qmax(plan_->reduce_range));
  auto points = plan_->points;  // matched, not extended: creating is off
  QdqEmitter q(e, e, points, plan_->activations, plan_->silu, /*creating=*/false);
  const auto out = inner_->emit(q, e.bind(x));
  q.finish();
  return e.get(out);
}

torch::Tensor graph_forward(NetworkImpl& inner, const torch::Tensor& x) {
  EagerEmitter e(Mode::Plain, nullptr, Activations::UInt8);
  return e.get(inner.emit(e, e.bind(x)));
}

}  // namespace convnets::quant
