#include "train/step.h"

#include "core/autocast.h"
#include "data/loader.h"
#include "data/rng.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace convnets::train {
namespace {

// Marsaglia & Tsang 2000, "A simple method for generating gamma variables";
// shape < 1 via Gamma(a + 1) * U^(1/a).
double sample_gamma(double shape, data::Rng& rng) {
  if (shape < 1.0) return sample_gamma(shape + 1.0, rng) * std::pow(1.0 - rng.uniform(), 1.0 / shape);
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = rng.normal();
      v = 1.0 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = 1.0 - rng.uniform();
    if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
  }
}

}  // namespace

MixupDraw draw_mixup(double alpha, std::int64_t batch, std::uint64_t seed, std::int64_t step, std::int64_t micro) {
  return draw_mix({alpha, 0, 1.0, 0.5}, batch, 0, 0, seed, step, micro);
}

MixupDraw draw_mix(const MixOptions& o, std::int64_t batch, std::int64_t height, std::int64_t width,
                   std::uint64_t seed, std::int64_t step, std::int64_t micro) {
  MixupDraw d;
  if (o.mixup <= 0 && o.cutmix <= 0) return d;
  // A stream of its own: the data loader uses (seed, epoch, index).
  data::Rng rng(seed ^ 0x6d69787570ULL /* "mixup" */, step, micro);
  // timm's _params_per_batch: the prob test, then the switch, then lambda.
  if (o.prob < 1.0 && !(rng.uniform() < o.prob)) return d;
  d.cutmix = o.cutmix > 0 && (o.mixup <= 0 || rng.uniform() < o.switch_prob);
  const double alpha = d.cutmix ? o.cutmix : o.mixup;
  const double x = sample_gamma(alpha, rng), y = sample_gamma(alpha, rng);
  d.lam = x + y > 0 ? x / (x + y) : 0.5;
  if (d.cutmix) {
    // timm's rand_bbox: a box of int(side * sqrt(1 - lam)) about a uniform
    // centre, clipped to the image; lam becomes the fraction left uncovered.
    const double ratio = std::sqrt(1.0 - d.lam);
    const auto cut_h = static_cast<std::int64_t>(height * ratio), cut_w = static_cast<std::int64_t>(width * ratio);
    const std::int64_t cy = rng.integer(0, height - 1), cx = rng.integer(0, width - 1);
    const std::int64_t y0 = std::clamp<std::int64_t>(cy - cut_h / 2, 0, height), y1 = std::clamp<std::int64_t>(cy + cut_h / 2, 0, height);
    const std::int64_t x0 = std::clamp<std::int64_t>(cx - cut_w / 2, 0, width), x1 = std::clamp<std::int64_t>(cx + cut_w / 2, 0, width);
    d.top = y0, d.left = x0, d.height = y1 - y0, d.width = x1 - x0;
    d.lam = 1.0 - double(d.height * d.width) / double(height * width);
  }
  d.perm.resize(static_cast<size_t>(batch));
  std::iota(d.perm.begin(), d.perm.end(), 0);
  for (std::int64_t i = batch - 1; i > 0; --i) std::swap(d.perm[i], d.perm[rng.integer(0, i)]);
  return d;
}

at::Tensor classification_loss(const at::Tensor& logits, const at::Tensor& labels, double smoothing,
                               const MixupDraw* mix) {
  namespace F = torch::nn::functional;
  const auto opts = F::CrossEntropyFuncOptions().label_smoothing(smoothing);
  const auto x = logits.to(torch::kFloat);
  if (!mix || mix->perm.empty()) return F::cross_entropy(x, labels, opts);
  const auto perm = torch::tensor(mix->perm, torch::dtype(torch::kLong).device(labels.device()));
  return F::cross_entropy(x, labels, opts) * mix->lam +
         F::cross_entropy(x, labels.index_select(0, perm), opts) * (1.0 - mix->lam);
}

at::Tensor soft_target_loss(const at::Tensor& student_logits, const at::Tensor& teacher_logits) {
  const auto target = torch::softmax(teacher_logits.to(torch::kFloat), 1);
  return -(target * torch::log_softmax(student_logits.to(torch::kFloat), 1)).sum(1).mean();
}

namespace {

template <typename Lr>
StepOutput step_impl(NetworkImpl& model, Optimizer& optimizer, LossScaler* scaler, Ema* ema,
                     const std::vector<MicroBatch>& micro, const Lr& lr, std::int64_t step,
                     const StepOptions& options) {
  StepOutput out;
  model.train();
  optimizer.zero_grad();
  const double n = static_cast<double>(micro.size());
  // Mixup's stream is keyed by the micro-batch's place in the global batch
  // (micro m of rank r is global micro-batch m * world + r, the loader's
  // order), so 2 ranks draw what 1 process accumulating 2 micro-batches draws.
  const std::int64_t world = options.sync ? options.sync->world_size() : 1;
  const std::int64_t rank = options.sync ? options.sync->rank() : 0;
  at::Tensor total;
  for (size_t m = 0; m < micro.size(); ++m) {
    const bool last = m + 1 == micro.size();
    if (options.sync && m == 0) options.sync->begin_step(model);
    auto images = micro[m].images;
    auto draw = draw_mix(options.mix, images.size(0), images.size(2), images.size(3), options.seed, step,
                         static_cast<std::int64_t>(m) * world + rank);
    if (!draw.perm.empty()) {
      torch::NoGradGuard no_grad;
      const auto perm = torch::tensor(draw.perm, torch::dtype(torch::kLong).device(images.device()));
      if (draw.cutmix) {
        const auto partner = images.index_select(0, perm);
        images = images.clone();
        images.narrow(2, draw.top, draw.height).narrow(3, draw.left, draw.width)
            .copy_(partner.narrow(2, draw.top, draw.height).narrow(3, draw.left, draw.width));
      } else {
        images = images.mul(draw.lam).add_(images.index_select(0, perm), 1.0 - draw.lam);
      }
    }
    // timm's prefetcher erases after mixing, on the normalised batch.
    if (!options.erase_mode.empty() && micro[m].erase.defined()) {
      torch::NoGradGuard no_grad;
      images = data::apply_random_erasing(images, micro[m].erase, options.erase_mode);
    }
    at::Tensor loss;
    {
      AutocastGuard autocast(images.device(), options.autocast);
      at::Tensor teacher_logits, student_in = images;
      if (options.teacher) {
        torch::NoGradGuard no_grad;
        teacher_logits = options.teacher->forward(images);
        if (options.student_size > 0 && images.size(2) != options.student_size) {
          namespace F = torch::nn::functional;
          student_in = F::interpolate(images, F::InterpolateFuncOptions()
                                                  .size(std::vector<int64_t>{options.student_size, options.student_size})
                                                  .mode(torch::kBicubic)
                                                  .align_corners(false));
        }
      }
      const auto logits = model.forward(student_in);
      loss = classification_loss(logits, micro[m].labels, options.label_smoothing, &draw);
      if (options.teacher) loss = loss + soft_target_loss(logits, teacher_logits);
    }
    auto scaled = loss / n;
    if (scaler) scaled = scaler->scale(scaled);
    if (options.sync) options.sync->before_backward(last);
    scaled.backward();
    if (options.sync) options.sync->after_backward(last);
    total = total.defined() ? total + loss.detach() : loss.detach();
    out.mixup.push_back(std::move(draw));
  }
  // A profiler annotation (free when no profiler runs): bench/profile_families.py counts the kernels launched
  // inside it as the optimizer's, which an eager trace could not otherwise tell from the network's elementwise ops.
  RECORD_USER_SCOPE("convnets::optimizer.step");
  at::Tensor skip;
  if (scaler) {
    skip = scaler->unscale({optimizer.flat().grads()});
  }
  optimizer.step(lr, skip);
  if (scaler) scaler->update(skip);
  if (ema) ema->update(model);
  out.loss = total / n;
  return out;
}

}  // namespace

StepOutput train_step(NetworkImpl& model, Optimizer& optimizer, LossScaler* scaler, Ema* ema,
                      const std::vector<MicroBatch>& micro, double lr, std::int64_t step, const StepOptions& options) {
  return step_impl(model, optimizer, scaler, ema, micro, lr, step, options);
}

StepOutput train_step(NetworkImpl& model, Optimizer& optimizer, LossScaler* scaler, Ema* ema,
                      const std::vector<MicroBatch>& micro, const at::Tensor& lr, std::int64_t step,
                      const StepOptions& options) {
  return step_impl(model, optimizer, scaler, ema, micro, lr, step, options);
}

}  // namespace convnets::train
