// Training pieces in isolation: LR schedules, loss scaling, EMA, recipes and config validation, percentiles, report charts.
#include "core/error.h"
#include "io/state_dict.h"
#include "models/registry.h"
#include "report/report.h"
#include "core/stats.h"
#include "runtime/evaluate.h"
#include "train/config.h"
#include "train/ema.h"
#include "train/graph_step.h"
#include "train/loss_scale.h"
#include "train/schedule.h"
#include "train/sgd.h"
#include "train/step.h"
#include "train/world_change.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <tuple>

namespace convnets::train {
namespace {

using runtime::FlatParameters;
using convnets::percentile;

ScheduleOptions schedule(const std::string& kind) {
  ScheduleOptions o;
  o.kind = kind;
  o.base_lr = 1.0;
  o.warmup_epochs = 1;
  o.steps_per_epoch = 10;
  o.epochs = 5;
  o.steps = {2, 4};
  o.step_factor = 0.1;
  o.per_epoch = false;
  return o;
}

TEST(LrSchedule, WarmupRisesLinearlyToTheBaseRate) {
  const LrSchedule s(schedule("cosine"));
  EXPECT_EQ(s.warmup_steps(), 10);
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
}

TEST(LrSchedule, CosineLinearAndStepAfterWarmup) {
  const LrSchedule cosine(schedule("cosine")), linear(schedule("linear")), step(schedule("step"));
  EXPECT_DOUBLE_EQ(cosine.at(10), 1.0);
  EXPECT_NEAR(cosine.at(30), 0.5, 1e-12);  // half-way through the 40 post-warmup steps
  EXPECT_NEAR(cosine.at(49), 0.5 * (1 + std::cos(M_PI * 39 / 40)), 1e-12);
  EXPECT_NEAR(linear.at(30), 0.5, 1e-12);
  EXPECT_NEAR(linear.at(49), 1.0 / 40, 1e-12);
  EXPECT_DOUBLE_EQ(step.at(19), 1.0);
  EXPECT_NEAR(step.at(20), 0.1, 1e-12);   // epoch 2
  EXPECT_NEAR(step.at(45), 0.01, 1e-12);  // epoch 4.5
}

TEST(LrSchedule, LinearScalingWithTheOptimizerBatch) {
  EXPECT_DOUBLE_EQ(scaled_lr(0.256, 1024, 256), 1.024);
  EXPECT_DOUBLE_EQ(scaled_lr(0.256, 1024, 0), 0.256);
}

TEST(LossScaler, OverflowSkipsTheStepAndHalvesTheScale) {
  auto w = torch::ones({3}, torch::requires_grad());
  torch::nn::Module m;
  m.register_parameter("w", w);
  Sgd sgd(m, {0.9, false, 0.0, false});
  LossScaler scaler(torch::kCPU, 1024.0, 2.0, 0.5, 2);
  // Clean step: the gradient is unscaled before SGD sees it.
  scaler.scale((w * 2).sum()).backward();
  auto found = scaler.unscale({w.grad()});
  EXPECT_FALSE(found.item<bool>());
  EXPECT_TRUE(torch::allclose(w.grad(), torch::full({3}, 2.0)));
  sgd.step(0.5, found);
  scaler.update(found);
  EXPECT_TRUE(torch::allclose(w.detach(), torch::zeros({3})));  // 1 - 0.5 * 2
  const auto after_clean = w.detach().clone();
  const auto momentum = sgd.params()[0].momentum.clone();
  // Overflow: parameters and momentum stay, the scale halves.
  sgd.zero_grad();
  w.mutable_grad().copy_(torch::tensor({1.0f, INFINITY, 1.0f}));
  found = scaler.unscale({w.grad()});
  EXPECT_TRUE(found.item<bool>());
  sgd.step(0.5, found);
  scaler.update(found);
  EXPECT_TRUE(torch::equal(w.detach(), after_clean));
  EXPECT_TRUE(torch::equal(sgd.params()[0].momentum, momentum));
  EXPECT_DOUBLE_EQ(scaler.value(), 512.0);
  // Two clean steps (the interval) double it.
  for (int i = 0; i < 2; ++i) {
    w.mutable_grad().fill_(1.0);
    found = scaler.unscale({w.grad()});
    scaler.update(found);
  }
  EXPECT_DOUBLE_EQ(scaler.value(), 1024.0);
}

TEST(FlatParameters, ParametersAndGradientsAreViewsOfTwoBuffers) {
  auto model = build_model(find_architecture("resnet8"), {});
  model->to(torch::kCPU);
  for (auto& p : model->parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
  }
  std::vector<at::Tensor> before;
  for (const auto& p : model->parameters()) before.push_back(p.detach().clone());
  Sgd sgd(*model, {0.9, false, 1e-4, false});
  const auto& flat = sgd.flat();
  ASSERT_EQ(flat.groups(), 2);
  const auto* base = static_cast<const char*>(flat.values().data_ptr());
  const auto bytes = static_cast<std::ptrdiff_t>(flat.values().nbytes());
  size_t i = 0;
  for (const auto& p : model->parameters()) {
    EXPECT_TRUE(torch::equal(p, before[i++])) << "values survive the move";
    const auto* at = static_cast<const char*>(p.data_ptr());
    EXPECT_TRUE(at >= base && at + p.nbytes() <= base + bytes);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(at) % 256, reinterpret_cast<std::uintptr_t>(base) % 256);
    if (p.dim() == 4) EXPECT_TRUE(p.is_contiguous(at::MemoryFormat::ChannelsLast));
  }
  // Decayed (conv/fc weights) then undecayed (BN, biases), each in reverse registration order.
  EXPECT_EQ(flat.entries().front().name, "fc.weight");
  EXPECT_EQ(flat.entries().back().name, "bn1.weight");
  for (const auto& e : flat.entries()) EXPECT_EQ(e.group, e.value.dim() > 1 ? 0 : 1) << e.name;
  // Autograd accumulates into the flat gradient buffer in place.
  const auto x = torch::randn({2, 3, 16, 16});
  model->train();
  model->forward(x).sum().backward();
  const auto g1 = flat.grads().clone();
  EXPECT_GT(g1.abs().sum().item<double>(), 0);
  model->forward(x).sum().backward();
  EXPECT_TRUE(torch::allclose(flat.grads(), 2 * g1, 1e-5, 1e-6));
  for (const auto& e : flat.entries()) EXPECT_TRUE(torch::equal(e.value.grad(), flat.view(flat.grads(), e)));
  sgd.zero_grad();
  EXPECT_EQ(flat.grads().abs().sum().item<double>(), 0);
  EXPECT_TRUE(model->parameters()[0].grad().defined());
}

TEST(Sgd, DeviceTensorLearningRateMatchesTheScalarOne) {
  // The graph-capturable step (lr read from a tensor) against the eager one.
  auto run = [](bool tensor_lr) {
    torch::manual_seed(3);
    auto model = build_model(find_architecture("resnet8"), {});
    Sgd sgd(*model, {0.875, true, 5e-5, false});
    const auto lr_t = torch::zeros({});
    for (int step = 0; step < 4; ++step) {
      sgd.zero_grad();
      torch::manual_seed(100 + step);
      model->forward(torch::randn({4, 3, 16, 16})).pow(2).mean().backward();
      const double lr = 0.1 * (step + 1);
      if (tensor_lr) {
        lr_t.fill_(lr);
        sgd.step(lr_t);
      } else {
        sgd.step(lr);
      }
    }
    return sgd.flat().values().clone();
  };
  const auto a = run(false), b = run(true);
  EXPECT_TRUE(torch::equal(a, run(false))) << "the eager step is deterministic";
  EXPECT_LE(((a - b).abs() / a.abs().clamp_min(1e-3)).max().item<double>(), 1e-5);
}

TEST(GraphedStep, StaticBufferStepEqualsTheEagerStep) {
  // What a CUDA graph replays: the step over static buffers with a device
  // learning rate, after warm-up steps whose effects are undone. On the CPU it
  // runs eagerly, so this checks everything but the capture itself.
  auto run = [](bool graphed) {
    torch::manual_seed(5);
    auto model = build_model(find_architecture("resnet8"), {});
    Sgd sgd(*model, {0.875, false, 5e-5, false});
    LossScaler scaler(torch::kCPU, 256.0, 2.0, 0.5, 2);
    auto shadow = build_model(find_architecture("resnet8"), {});
    Ema ema(shadow, *model, 0.9);
    StepOptions o;
    o.label_smoothing = 0.1;
    std::unique_ptr<GraphedStep> g;
    std::vector<double> losses;
    for (int step = 0; step < 4; ++step) {
      torch::manual_seed(200 + step);
      std::vector<MicroBatch> micro{{torch::randn({4, 3, 16, 16}), torch::randint(0, 10, {4}, torch::kLong)},
                                    {torch::randn({4, 3, 16, 16}), torch::randint(0, 10, {4}, torch::kLong)}};
      const double lr = 0.05 * (step + 1);
      if (graphed) {
        if (!g) g = std::make_unique<GraphedStep>(*model, sgd, &scaler, &ema, micro, o);
        losses.push_back(g->run(micro, lr).item<double>());
      } else {
        losses.push_back(train_step(*model, sgd, &scaler, &ema, micro, torch::tensor(lr), step, o).loss.item<double>());
      }
    }
    return std::make_tuple(losses, sgd.flat().values().clone(), sgd.momentum_buffer().clone(),
                           state_dict(*ema.model()).back().second.clone(), scaler.value());
  };
  const auto eager = run(false), graphed = run(true);
  EXPECT_EQ(std::get<0>(eager), std::get<0>(graphed));
  EXPECT_TRUE(torch::equal(std::get<1>(eager), std::get<1>(graphed)));
  EXPECT_TRUE(torch::equal(std::get<2>(eager), std::get<2>(graphed)));
  EXPECT_TRUE(torch::equal(std::get<3>(eager), std::get<3>(graphed)));
  EXPECT_EQ(std::get<4>(eager), std::get<4>(graphed));
  StepOptions mixup;
  mixup.mix.mixup = 0.2;
  EXPECT_NE(GraphedStep::unsupported_reason(mixup), "");
}

TEST(Ema, FollowsTheDecayOverParametersAndBnStatistics) {
  const auto& arch = find_architecture("resnet8");
  ModelOptions o;
  o.num_classes = 3;
  auto model = build_model(arch, o);
  Ema ema(build_model(arch, o), *model, 0.75);
  NamedTensors before;
  for (const auto& [k, t] : state_dict(*ema.model())) before.emplace_back(k, t.clone());
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.add_(1.0);
    for (auto& b : model->buffers()) {
      if (b.is_floating_point()) b.add_(2.0);
    }
  }
  ema.update(*model);
  const auto after = state_dict(*ema.model());
  for (size_t i = 0; i < after.size(); ++i) {
    const auto& name = after[i].first;
    if (!after[i].second.is_floating_point()) continue;
    const double shift = name.find("running_") != std::string::npos ? 2.0 : 1.0;
    EXPECT_TRUE(torch::allclose(after[i].second, before[i].second + 0.25 * shift, 1e-5, 1e-6)) << name;
  }
}

// DLE's EMA (ConvNets models/common.py): mu = min(decay, (1 + t) / (10 + t)).
TEST(Ema, WarmupFollowsDleDecayAtEachStep) {
  const auto& arch = find_architecture("resnet8");
  ModelOptions o;
  o.num_classes = 3;
  auto model = build_model(arch, o);
  Ema ema(build_model(arch, o), *model, 0.9999, /*warmup=*/true);
  EXPECT_DOUBLE_EQ(ema.decay_at(0), 0.1);
  EXPECT_DOUBLE_EQ(ema.decay_at(10), 11.0 / 20.0);
  EXPECT_DOUBLE_EQ(ema.decay_at(1000000), 0.9999);
  EXPECT_DOUBLE_EQ(Ema(build_model(arch, o), *model, 0.9999).decay_at(0), 0.9999);  // timm: no warm-up
  const auto before = state_dict(*ema.model()).front().second.clone();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.add_(1.0);
  }
  ema.set_step(10);  // decay 0.55: the shadow moves 0.45 of the way
  ema.update(*model);
  const auto after = state_dict(*ema.model()).front().second;
  EXPECT_TRUE(torch::allclose(after, before + 0.45, 1e-5, 1e-6));
}

TEST(Mixup, DrawsAreReproducibleAndBetaDistributed) {
  const auto a = draw_mixup(0.2, 8, 1, 5, 0), b = draw_mixup(0.2, 8, 1, 5, 0), c = draw_mixup(0.2, 8, 1, 6, 0);
  EXPECT_EQ(a.lam, b.lam);
  EXPECT_EQ(a.perm, b.perm);
  EXPECT_NE(a.lam, c.lam);
  // Beta(a, a) has mean 1/2 and variance 1 / (4 (2a + 1)): 0.1786 for a = 0.2.
  double sum = 0, sq = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double lam = draw_mixup(0.2, 2, 3, i, 0).lam;
    ASSERT_GE(lam, 0.0);
    ASSERT_LE(lam, 1.0);
    sum += lam;
    sq += lam * lam;
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 0.01);
  EXPECT_NEAR(var, 1.0 / (4 * 1.4), 0.01);
  EXPECT_TRUE(draw_mixup(0.0, 8, 1, 5, 0).perm.empty());
}

TEST(Mixup, CutmixBoxesAndTimmSwitching) {
  const MixOptions both{0.2, 1.0, 1.0, 0.5};
  int cutmix = 0;
  const int n = 4000;
  double lam_sum = 0;
  for (int i = 0; i < n; ++i) {
    const auto d = draw_mix(both, 4, 40, 30, 7, i, 0);
    ASSERT_EQ(d.perm.size(), 4u);
    if (!d.cutmix) continue;
    ++cutmix;
    ASSERT_GE(d.top, 0);
    ASSERT_GE(d.left, 0);
    ASSERT_LE(d.top + d.height, 40);
    ASSERT_LE(d.left + d.width, 30);
    // timm's correct_lam: lam is the area the box leaves to the sample.
    ASSERT_DOUBLE_EQ(d.lam, 1.0 - double(d.height * d.width) / (40.0 * 30.0));
    lam_sum += d.lam;
  }
  EXPECT_NEAR(cutmix / double(n), 0.5, 0.03);  // --mixup-switch-prob 0.5
  // Beta(1, 1) is uniform: uncovered fraction >= 1/2 on average (edges clip boxes).
  EXPECT_GT(lam_sum / cutmix, 0.5);
  EXPECT_LT(lam_sum / cutmix, 0.75);
  int mixed = 0;
  for (int i = 0; i < n; ++i) mixed += !draw_mix({0, 1.0, 0.3, 0.5}, 4, 40, 30, 7, i, 0).perm.empty();
  EXPECT_NEAR(mixed / double(n), 0.3, 0.03);  // --mixup-prob 0.3
  const auto a = draw_mix(both, 4, 40, 30, 7, 11, 0), b = draw_mix(both, 4, 40, 30, 7, 11, 0);
  EXPECT_EQ(std::tie(a.lam, a.top, a.left, a.height, a.width, a.perm), std::tie(b.lam, b.top, b.left, b.height, b.width, b.perm));
  // Mixup alone draws exactly what draw_mixup (DLE) does.
  EXPECT_EQ(draw_mix({0.2, 0, 1.0, 0.5}, 8, 40, 30, 1, 5, 0).lam, draw_mixup(0.2, 8, 1, 5, 0).lam);
}

TEST(Config, RecipesAreBuiltInAndValid) {
  for (const auto& name : builtin_recipes()) {
    TrainConfig c;
    c.data = "synthetic";
    apply_json(c, load_recipe(name), name);
    if (!c.teacher.empty()) c.teacher_checkpoint = "teacher.safetensors";  // the user's file, as timm downloads it
    EXPECT_NO_THROW(validate(c)) << name;
    EXPECT_NO_THROW(find_architecture(c.arch)) << name;
  }
  TrainConfig c;
  apply_json(c, load_recipe("resnet50-250ep"), "recipe");
  EXPECT_EQ(c.epochs, 250);
  EXPECT_DOUBLE_EQ(c.mixup, 0.2);
  EXPECT_DOUBLE_EQ(c.momentum, 0.875);
}

// DLE's --optimizer-batch-size across a world change: the fewest equal micro-batches that make the global batch, no
// larger than the batch that fit before; where none is equal, the nearest, said to be inexact.
TEST(WorldChange, TheGlobalBatchIsSplitOverTheNewWorld) {
  const auto split = [](std::int64_t g, std::int64_t b, std::int64_t w) {
    const auto s = train::split_global_batch(g, b, w);
    return std::make_tuple(s.batch, s.micro_batches, s.global, s.exact);
  };
  EXPECT_EQ(split(256, 64, 4), std::make_tuple(64, 1, 256, true));
  EXPECT_EQ(split(256, 64, 2), std::make_tuple(64, 2, 256, true));
  EXPECT_EQ(split(256, 64, 8), std::make_tuple(32, 1, 256, true));
  EXPECT_EQ(split(256, 32, 1), std::make_tuple(32, 8, 256, true));
  EXPECT_EQ(split(256, 64, 3), std::make_tuple(43, 2, 258, false));
  EXPECT_EQ(split(64, 32, 3), std::make_tuple(21, 1, 63, false));
  EXPECT_EQ(split(2048, 256, 6), std::make_tuple(171, 2, 2052, false));
}

// The start line names both worlds and what each process now runs; a checkpoint of the same world, or flags that
// already keep its images per step, change nothing; --resume-batch as-given keeps the flags.
TEST(WorldChange, AResumeOnAnotherWorldKeepsTheImagesPerStepAndSaysSo) {
  const nlohmann::json meta = {{"world_size", 4},
                               {"images_per_step", 256},
                               {"config", {{"batch_size", 64}, {"optimizer_batch_size", 0}}}};
  train::TrainConfig c;
  c.batch_size = 64;
  c.optimizer_batch_size = 0;
  auto three = c;
  EXPECT_EQ(train::keep_images_per_step(three, meta, 3),
            "resume: world 4 -> 3: 2 micro-batches of 43 per process instead of 1 of 64: no equal split of the "
            "checkpoint's 256 images a step over 3 processes, so 258 (+0.8 %); the LR stays the checkpoint's "
            "(absolute --lr)");
  EXPECT_EQ(three.batch_size, 43);
  EXPECT_EQ(three.optimizer_batch_size, 258);
  auto two = c;
  EXPECT_EQ(train::keep_images_per_step(two, meta, 2),
            "resume: world 4 -> 2: 2 micro-batches of 64 per process instead of 1 of 64, the checkpoint's 256 images "
            "a step kept (--resume-batch recipe)");
  EXPECT_EQ(two.batch_size, 64);
  EXPECT_EQ(two.optimizer_batch_size, 256);
  auto same = c;
  EXPECT_EQ(train::keep_images_per_step(same, meta, 4), "");
  auto given = c;
  given.resume_batch = "as-given";
  EXPECT_EQ(train::keep_images_per_step(given, meta, 2), "");
  EXPECT_EQ(given.batch_size, 64);
  EXPECT_EQ(given.optimizer_batch_size, 0);
  auto accumulated = c;  // DLE's line: the global batch given, 2 processes of 64 accumulating twice
  accumulated.optimizer_batch_size = 256;
  EXPECT_EQ(train::keep_images_per_step(accumulated, meta, 2),
            "resume: world 4 -> 2: 2 micro-batches of 64 per process instead of 1 of 64, the checkpoint's 256 images "
            "a step kept (--resume-batch recipe)");
  EXPECT_EQ(accumulated.batch_size, 64);
  EXPECT_EQ(accumulated.optimizer_batch_size, 256);
  auto grown_back = c;  // written at world 4 with 1 micro-batch of 64, resumed at 4 with the flags of 4
  const nlohmann::json shrunk = {{"world_size", 2},
                                 {"images_per_step", 256},
                                 {"config", {{"batch_size", 64}, {"optimizer_batch_size", 256}}}};
  EXPECT_EQ(train::keep_images_per_step(grown_back, shrunk, 4),
            "resume: world 2 -> 4: 1 micro-batch of 64 per process instead of 2 of 64, the checkpoint's 256 images a "
            "step kept (--resume-batch recipe)");
  EXPECT_EQ(grown_back.batch_size, 64);
  EXPECT_EQ(grown_back.optimizer_batch_size, 0);
}

TEST(Config, ShortRunsShrinkTheRecipesWarmup) {
  TrainConfig c;
  apply_json(c, load_recipe("resnet50-90ep"), "recipe");
  ASSERT_EQ(c.lr_granularity, "epoch");  // whole epochs: a 1-epoch run has no room for any warm-up
  const double planned = c.epochs, warmup = c.warmup;
  ASSERT_GE(warmup, 2);
  c.epochs = 1;
  EXPECT_NE(fit_warmup(c, planned).find("warm-up shortened to 0 epochs"), std::string::npos);
  EXPECT_EQ(c.warmup, 0);
  c.epochs = 45;  // fits already: untouched
  c.warmup = warmup;
  EXPECT_EQ(fit_warmup(c, planned), "");
  EXPECT_EQ(c.warmup, warmup);
  // Per-step granularity keeps the recipe's share of the run.
  c.lr_granularity = "step";
  c.epochs = 2;
  EXPECT_NE(fit_warmup(c, planned), "");
  EXPECT_DOUBLE_EQ(c.warmup, warmup * 2 / planned);
  c.data = "synthetic";
  EXPECT_NO_THROW(validate(c));
}

TEST(Config, UnknownFieldsAndWrongTypesAreNamed) {
  TrainConfig c;
  try {
    apply_json(c, nlohmann::json{{"learning_rate", 0.1}}, "my.json");
    FAIL() << "accepted an unknown field";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("my.json: unknown field 'learning_rate'"), std::string::npos);
  }
  EXPECT_THROW(apply_json(c, nlohmann::json{{"epochs", 1.5}}, "r"), Error);
  EXPECT_THROW(apply_json(c, nlohmann::json{{"nesterov", "yes"}}, "r"), Error);
  apply_json(c, nlohmann::json{{"epochs", 3}, {"_comment", "ignored"}}, "r");
  EXPECT_EQ(c.epochs, 3);
}

TEST(Config, ValidationNamesTheFlag) {
  auto expect_error = [](auto mutate, const std::string& text) {
    TrainConfig c;
    c.data = "synthetic";
    mutate(c);
    try {
      validate(c);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error([](TrainConfig& c) { c.batch_size = 0; }, "--batch-size");
  expect_error([](TrainConfig& c) { c.lr = -1; }, "--lr");
  expect_error([](TrainConfig& c) { c.mixup = -0.5; }, "--mixup");
  expect_error([](TrainConfig& c) { c.optimizer_batch_size = 300; }, "--optimizer-batch-size");
  expect_error([](TrainConfig& c) { c.lr_schedule = "exp"; }, "--lr-schedule");
  expect_error([](TrainConfig& c) { c.ema = 1.0; }, "--ema");
  expect_error([](TrainConfig& c) { c.mean = {0.5}; }, "--mean");
}

TEST(Percentile, NearestRank) {
  EXPECT_DOUBLE_EQ(percentile({5, 1, 4, 2, 3}, 50), 3);
  EXPECT_DOUBLE_EQ(percentile({5, 1, 4, 2, 3}, 99), 5);
  EXPECT_DOUBLE_EQ(percentile({5, 1, 4, 2, 3}, 0), 1);
  EXPECT_DOUBLE_EQ(percentile({}, 90), 0);
}

TEST(Report, ParsesDllLoggerAndDrawsCharts) {
  const std::string path = ::testing::TempDir() + "/log.json";
  {
    std::ofstream out(path);
    out << "not a DLLogger line\n"
        << R"(DLLL {"type": "LOG", "step": "PARAMETER", "data": {"arch": "resnet8", "steps_per_epoch": 4, "epochs": 2}})" "\n"
        << R"(DLLL {"type": "LOG", "step": [1, 2], "data": {"train.lr": 0.5}})" "\n"
        << R"(DLLL {"type": "LOG", "step": [1], "data": {"train.loss": 2.0, "val.top1": 40.0, "train.total_ips": 100}})" "\n"
        << R"(DLLL {"type": "LOG", "step": [2], "data": {"train.loss": 1.5, "val.top1": 30.0}})" "\n"
        << R"(DLLL {"type": "LOG", "step": [2], "data": {"train.loss": 1.0, "val.top1": 60.0}})" "\n"
        << R"(DLLL {"type": "LOG", "step": [], "data": {"val.best_top1": 60.0}})" "\n";
  }
  const auto run = report::parse_dllogger(path);
  ASSERT_EQ(run.epochs.size(), 2u);
  EXPECT_EQ(run.epochs[1].second["val.top1"], 60.0);  // the resumed epoch replaces the interrupted one
  ASSERT_EQ(run.steps.size(), 1u);
  EXPECT_DOUBLE_EQ(run.steps[0].first, 0.5);  // epoch 1, iteration 2 of 4
  EXPECT_EQ(run.summary["val.best_top1"], 60.0);
  const auto html = report::render_html(run, "t <run>");
  EXPECT_NE(html.find("t &lt;run&gt;"), std::string::npos);
  size_t svgs = 0;
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1)) ++svgs;
  EXPECT_EQ(svgs, 5u);  // loss, top-1, top-5, learning rate, throughput
  EXPECT_NE(html.find("aria-label=\"Top-5 accuracy\""), std::string::npos);
  const auto chart = report::svg_chart("c", "x", "y", {{"s", {{1, 2}, {2, 4}}}});
  EXPECT_NE(chart.find("<polyline"), std::string::npos);
  EXPECT_NE(report::svg_chart("c", "x", "y", {}).find("no data"), std::string::npos);
  // The summary in a person's units, and a finished run's page does not reload.
  EXPECT_NE(html.find("<th>validation best top-1</th><td>60.00 %</td>"), std::string::npos);
  EXPECT_EQ(html.find("http-equiv=\"refresh\""), std::string::npos);
  EXPECT_TRUE(report::finished(run));

  // A live run: its last line half written is not there yet, the page shows
  // the last epoch's figures and reloads itself.
  std::ofstream(path) << R"(DLLL {"type": "LOG", "step": [1], "data": {"val.top1": 50.0, "val.compute_latency_at99": 0.0123}})"
                      << "\n" << R"(DLLL {"type": "LOG", "st)";
  const auto live = report::parse_dllogger(path);
  EXPECT_FALSE(report::finished(live));
  const auto live_html = report::render_html(live, "t", 5);
  EXPECT_NE(live_html.find("<meta http-equiv=\"refresh\" content=\"5\">"), std::string::npos);
  EXPECT_NE(live_html.find("<th>validation latency, p99 (per batch)</th><td>12.30 ms</td>"), std::string::npos);
  EXPECT_NE(live_html.find("<th>validation top-1</th><td>50.00 %</td>"), std::string::npos);

  std::ofstream(path) << "{\"plain\": 1}\n";
  EXPECT_THROW(report::parse_dllogger(path), Error);
  std::ofstream(path) << "DLLL {broken\n";
  EXPECT_THROW(report::parse_dllogger(path), Error);
}

}  // namespace
}  // namespace convnets::train
