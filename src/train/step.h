// One optimizer step: forward/backward over micro-batches with label smoothing, mixup and distillation, unscale, update, EMA.
#pragma once

#include "models/network.h"
#include "runtime/gradient_sync.h"
#include "train/ema.h"
#include "train/loss_scale.h"
#include "train/optimizer.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace convnets::train {

struct MixupDraw {
  double lam = 1.0;
  std::vector<std::int64_t> perm;  // partner of each row
  // CutMix (Yun et al. 2019): the partner's box [top, top + height) x
  // [left, left + width) replaces the row's; lam is the area kept.
  bool cutmix = false;
  std::int64_t top = 0, left = 0, height = 0, width = 0;
};

// timm's Mixup switching: a batch is mixed with probability `prob`; with both
// alphas on, by cutmix with probability `switch_prob`, else by mixup.
struct MixOptions {
  double mixup = 0, cutmix = 0, prob = 1.0, switch_prob = 0.5;
};
// With cutmix off and prob 1 this is draw_mixup, draw for draw. CutMix's box
// is timm's rand_bbox (side sqrt(1 - lam) of the image's, clipped at its
// edges) and lam is corrected to the area kept, as timm's correct_lam.
// Partners are a random permutation (DLE) rather than timm's reversed batch:
// the batch order is itself random, so the pairs are distributed alike.
MixupDraw draw_mix(const MixOptions& o, std::int64_t batch, std::int64_t height, std::int64_t width,
                   std::uint64_t seed, std::int64_t step, std::int64_t micro);

// Zhang et al. 2018 ("mixup"), as DLE's MixUpWrapper: lam ~ Beta(alpha, alpha)
// and a random permutation of the batch. Drawn from a counter-based stream of
// (seed, step, micro-batch), so a resumed run draws what the original would.
MixupDraw draw_mixup(double alpha, std::int64_t batch, std::uint64_t seed, std::int64_t step, std::int64_t micro);

// Cross-entropy with label smoothing (Szegedy et al. 2016) averaged over the
// batch; with mixup, lam * CE(y) + (1 - lam) * CE(y[perm]), which equals DLE's
// NLLMultiLabelSmooth on the mixed smoothed one-hot targets.
at::Tensor classification_loss(const at::Tensor& logits, const at::Tensor& labels, double smoothing,
                               const MixupDraw* mix = nullptr);

// Knowledge distillation's soft-target term (Hinton et al. 2015 at
// temperature 1), as DLE's GPUNet train.py adds it to the classification
// loss: mean over the batch of sum_c -softmax(teacher)_c * log_softmax(student)_c.
at::Tensor soft_target_loss(const at::Tensor& student_logits, const at::Tensor& teacher_logits);

struct StepOptions {
  double label_smoothing = 0;
  MixOptions mix;  // mixup and CutMix, as draw_mix takes them
  std::uint64_t seed = 0;
  at::ScalarType autocast = at::kFloat;  // kHalf / kBFloat16: autocast on CUDA; kFloat: none
  runtime::GradientSync* sync = nullptr;  // data-parallel runs; not capturable in a CUDA graph
  // Knowledge distillation: a frozen teacher (eval mode, no gradients) sees
  // each (mixed) batch as loaded; the student sees it resized to
  // student_size (bicubic, as DLE's useTwoRes) when that differs.
  NetworkImpl* teacher = nullptr;
  std::int64_t student_size = 0;
  bool random_layers = false;            // the model draws dropout/drop-path masks in training
  // timm's random erasing fill (const | rand | pixel) of MicroBatch::erase's
  // boxes, after mixing as in timm's prefetcher; empty: off.
  std::string erase_mode;
};

struct MicroBatch {
  at::Tensor images;  // normalised float NCHW on the device
  at::Tensor labels;  // int64 on the device
  at::Tensor erase;   // random erasing boxes (data::Batch::erase), or undefined
};

struct StepOutput {
  at::Tensor loss;  // 0-dim, mean over the micro-batches, on the device (no sync)
  std::vector<MixupDraw> mixup;
};

// Gradients of the micro-batches accumulate (each loss divided by their
// count, so two of B equal one of 2B apart from BN statistics); then, with a
// scaler, gradients are unscaled and an overflow skips the update on the
// device; then the optimizer at `lr` and the EMA update.
StepOutput train_step(NetworkImpl& model, Optimizer& optimizer, LossScaler* scaler, Ema* ema,
                      const std::vector<MicroBatch>& micro, double lr, std::int64_t step, const StepOptions& options);
// The same step with the learning rate in a 0-dim device tensor (Optimizer::step's
// tensor form), so that nothing in it depends on a host value: capturable.
StepOutput train_step(NetworkImpl& model, Optimizer& optimizer, LossScaler* scaler, Ema* ema,
                      const std::vector<MicroBatch>& micro, const at::Tensor& lr, std::int64_t step,
                      const StepOptions& options);

}  // namespace convnets::train
