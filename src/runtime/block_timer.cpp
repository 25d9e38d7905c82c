#include "runtime/block_timer.h"

#include "core/autocast.h"
#include "core/error.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <optional>

namespace convnets::runtime {
namespace {

// A fixed, aperiodic pattern of values in [-1, 1] (sin of the element's index times an irrational step): inputs that
// exercise every sign and magnitude without drawing from the run's random generators.
at::Tensor pattern(at::IntArrayRef sizes, at::ScalarType dtype, const c10::Device& device, bool channels_last,
                   double step) {
  std::int64_t n = 1;
  for (const auto s : sizes) n *= s;
  auto t = at::arange(n, at::TensorOptions().dtype(at::kFloat).device(device)).mul_(step).sin_().view(sizes);
  if (channels_last && sizes.size() == 4) t = t.contiguous(at::MemoryFormat::ChannelsLast);
  return t.to(dtype);
}

class Stopwatch {
 public:
  explicit Stopwatch(const c10::Device& device) {
    if (device.is_cuda()) start_.emplace(cudaEventDefault), stop_.emplace(cudaEventDefault);
  }
  void start() {
    if (start_) start_->record();
    else t0_ = std::chrono::steady_clock::now();
  }
  double stop_ms() {
    if (!start_) return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
    stop_->record();
    stop_->synchronize();
    return start_->elapsed_time(*stop_);
  }

 private:
  std::optional<at::cuda::CUDAEvent> start_, stop_;
  std::chrono::steady_clock::time_point t0_;
};

std::string format_distance(double d, std::size_t which, double own, double bound) {
  char text[200];
  const std::string what = which == 0 ? "the output" : which == 1 ? "the input's gradient"
                                                                  : "parameter " + std::to_string(which - 2) + "'s gradient";
  std::snprintf(text, sizeof text, "%.1e of %s from fp32's unfused (the unfused path's own: %.1e; bound %.1e)", d,
                what.c_str(), own, bound);
  return text;
}

}  // namespace

double numerics_bound(at::ScalarType dtype) {
  if (dtype == at::kHalf) return 2e-2;
  if (dtype == at::kBFloat16) return 4e-2;
  return 1e-4;
}

std::pair<double, std::size_t> worst_distance(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  double worst = 0;
  std::size_t which = 0;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (!got[i].defined() || !want[i].defined()) {
      if (got[i].defined() != want[i].defined()) return {std::numeric_limits<double>::infinity(), i};
      continue;
    }
    const auto a = got[i].to(at::kFloat), b = want[i].to(at::kFloat);
    const double norm = b.norm().item<double>();
    const double d = (a - b).norm().item<double>() / std::max(norm, 1e-30);
    if (!(d <= worst)) worst = d, which = i;  // NaN counts as the worst
  }
  return {worst, which};
}

std::vector<Candidate> DeviceBlockTimer::time(torch::nn::Module& block, models::FusionTunable& tunable,
                                              const std::vector<models::FusionPath>& paths,
                                              const std::vector<std::int64_t>& sizes, at::ScalarType dtype) {
  const auto params = block.parameters();
  TORCH_CHECK(!params.empty(), "DeviceBlockTimer: a block without parameters");
  const auto device = params.front().device();
  // The timed passes must leave the training run as they found it.
  std::vector<at::Tensor> buffers, saved;
  for (auto& b : block.buffers()) buffers.push_back(b), saved.push_back(b.detach().clone());
  const auto original = tunable.path();
  const bool was_training = block.is_training();
  block.train();
  std::vector<Candidate> out;
  {
    torch::AutoGradMode grad(true);
    const bool half = dtype == at::kHalf || dtype == at::kBFloat16;
    const auto x = pattern(sizes, dtype, device, channels_last_, 0.7548776662).relu_();
    std::vector<at::Tensor> inputs{at::Tensor()};
    inputs.insert(inputs.end(), params.begin(), params.end());
    at::Tensor dy;
    // One forward and backward in `type` (autocast on for a half type, off for fp32): the output, then the input's
    // and each parameter's gradient.
    auto run_path = [&](models::FusionPath p, at::ScalarType type) {
      AutocastGuard autocast(device, type == at::kFloat ? at::kFloat : type);
      tunable.set_path(p);
      inputs[0] = x.to(type).detach().requires_grad_(true);
      auto y = tunable.train_forward(inputs[0]);
      if (!dy.defined()) dy = pattern(y.sizes(), at::kFloat, device, channels_last_, 0.5698402910);
      auto grads = torch::autograd::grad({y}, inputs, {dy.to(y.scalar_type())}, /*retain_graph=*/false,
                                         /*create_graph=*/false, /*allow_unused=*/true);
      grads.insert(grads.begin(), y.detach());
      return grads;
    };
    // Each path is held to fp32's unfused function, within the larger of a fixed bound and 1.5x the distance of
    // the unfused path in the same half precision: a fused path may err as half precision errs, no more.
    const auto exact = run_path(models::FusionPath::Unfused, at::kFloat);
    const double own = half ? worst_distance(run_path(models::FusionPath::Unfused, dtype), exact).first : 0.0;
    const double bound = std::max(numerics_bound(dtype), 1.5 * own);
    std::vector<bool> ran;
    for (const auto p : paths) {
      Candidate c;
      c.path = p;
      try {
        const auto [d, which] = worst_distance(run_path(p, dtype), exact);
        c.numerics = format_distance(d, which, own, bound);
        c.numerics_ok = d <= bound;
        run_path(p, dtype);  // warm: whatever the first pass built or allocated is not timed
      } catch (const std::exception& e) {
        c.refusal = std::string("it failed: ") + e.what();
      }
      ran.push_back(c.refusal.empty());
      c.ms = std::numeric_limits<double>::infinity();
      out.push_back(std::move(c));
    }
    Stopwatch watch(device);
    for (int r = 0; r < rounds_; ++r) {
      for (std::size_t i = 0; i < paths.size(); ++i) {
        if (!ran[i]) continue;
        watch.start();
        for (int k = 0; k < repeats_; ++k) run_path(paths[i], dtype);
        out[i].ms = std::min(out[i].ms, watch.stop_ms() / repeats_);
      }
    }
    for (std::size_t i = 0; i < paths.size(); ++i) {
      if (!ran[i]) out[i].ms = 0;
    }
  }
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(saved[i]);
  tunable.set_path(original);
  block.train(was_training);
  return out;
}

void record_block_inputs(NetworkImpl& model, const Runtime& rt, const std::vector<std::int64_t>& sizes) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> buffers, saved;
  for (auto& b : model.buffers()) buffers.push_back(b), saved.push_back(b.clone());
  const bool was_training = model.is_training();
  model.train();
  {
    AutocastGuard autocast(rt.device, rt.autocast);
    auto x = at::zeros(sizes, at::TensorOptions().device(rt.device).dtype(rt.autocast));
    if (rt.channels_last && sizes.size() == 4) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    model.forward(x);
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(saved[i]);
  model.train(was_training);
}

TuningDevice tuning_device(const Runtime& rt) {
  TuningDevice d;
  d.convnets = CONVNETS_VERSION;
  if (rt.device.is_cuda()) {
    d.cudnn = at::detail::getCUDAHooks().versionRuntimeCuDNN();  // the library loaded, not the one compiled against
    const auto* p = at::cuda::getDeviceProperties(rt.device.index());
    d.gpu = p->name;
    d.sms = p->multiProcessorCount;
  } else {
    d.gpu = "cpu";
  }
  return d;
}

}  // namespace convnets::runtime
