// GPUNet's training pieces: RMSpropTF (and DLE's torch.optim.RMSprop) against their formulas, the staircase schedule, warmup from a small LR, distillation loss.
#include "core/error.h"
#include "models/network.h"
#include "train/config.h"
#include "train/rmsprop.h"
#include "train/schedule.h"
#include "train/step.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <memory>

namespace convnets::train {
namespace {

// Three steps of the optimizer `kind` on a 2x2 weight (decayed) and a 2-vector bias (not decayed), weight decay 0.1,
// alpha 0.9, eps 1e-3, against `reference`: one step of element i in double, given the step's LR and the gradient
// with its decay added. Gradients of 1e-4 and below make eps's place (inside or outside the root) show. Returns the
// optimizer, for its state.
std::unique_ptr<Optimizer> expect_formula(torch::nn::Module& m, const char* kind, double momentum,
                                          const std::function<void(int i, double lr, double g, double& p)>& reference) {
  auto w = m.register_parameter("w", torch::tensor({{0.5f, -1.0f}, {2.0f, 0.0f}}));
  auto b = m.register_parameter("b", torch::tensor({0.25f, -0.75f}));
  OptimizerOptions o;
  o.kind = kind;
  o.momentum = momentum;
  o.weight_decay = 0.1;
  o.alpha = 0.9;
  o.eps = 1e-3;
  auto opt = make_optimizer(m, o);
  EXPECT_EQ(opt->name(), kind);
  std::vector<double> p = {0.5, -1.0, 2.0, 0.0, 0.25, -0.75};
  const double lrs[] = {0.1, 0.05, 0.02};
  const std::vector<std::vector<double>> grads = {{1e-4, -0.5, 3.0, 0.0, 0.2, -2e-5},
                                                  {0.3, 0.3, -1.0, 1e-3, 0.0, 0.7},
                                                  {-2.0, 1e-6, 0.5, -0.25, 1.5, 0.1}};
  for (int step = 0; step < 3; ++step) {
    const auto& g = grads[step];
    opt->zero_grad();
    {
      // The flat buffer owns the gradients: write through the bound views.
      torch::NoGradGuard no_grad;
      w.grad().copy_(torch::tensor({{g[0], g[1]}, {g[2], g[3]}}, torch::kFloat));
      b.grad().copy_(torch::tensor({g[4], g[5]}, torch::kFloat));
    }
    opt->step(lrs[step]);
    for (int i = 0; i < 6; ++i) reference(i, lrs[step], g[i] + (i < 4 ? 0.1 : 0.0) * p[i], p[i]);
    const auto flat = torch::cat({w.detach().flatten(), b.detach()}).to(torch::kDouble);
    for (int i = 0; i < 6; ++i) {
      EXPECT_NEAR(flat[i].item<double>(), p[i], 2e-6) << kind << " momentum " << momentum << " step " << step
                                                       << " element " << i;
    }
  }
  return opt;
}

// timm's RMSpropTF: v += (1 - alpha)(g^2 - v) from v = 1; m = mom m + lr g / sqrt(v + eps); p -= m.
TEST(RmsPropTf, FollowsTimmsFormulaElementByElement) {
  torch::nn::Module m;
  std::vector<double> v(6, 1.0), mom(6, 0.0);
  const auto opt = expect_formula(m, "rmsproptf", 0.9, [&](int i, double lr, double g, double& p) {
    v[i] += 0.1 * (g * g - v[i]);
    mom[i] = 0.9 * mom[i] + lr * g / std::sqrt(v[i] + 1e-3);
    p -= mom[i];
  });
  // The state round-trips by name.
  const auto state = opt->state();
  ASSERT_EQ(state.size(), 4u);
  EXPECT_EQ(state[0].first.rfind("optimizer.square_avg.", 0), 0u);
}

// torch.optim.RMSprop (DLE's --optimizer rmsprop), as PyTorch's documentation writes it:
// v = alpha v + (1 - alpha) g^2 from v = 0; b = mom b + g / (sqrt(v) + eps); p -= lr b (without momentum,
// p -= lr g / (sqrt(v) + eps)).
TEST(RmsProp, FollowsTorchsFormulaElementByElement) {
  for (const double momentum : {0.9, 0.0}) {
    torch::nn::Module m;
    std::vector<double> v(6, 0.0), buf(6, 0.0);
    expect_formula(m, "rmsprop", momentum, [&](int i, double lr, double g, double& p) {
      v[i] = 0.9 * v[i] + 0.1 * g * g;
      const double s = g / (std::sqrt(v[i]) + 1e-3);
      buf[i] = momentum * buf[i] + s;
      p -= lr * (momentum > 0 ? buf[i] : s);
    });
  }
}

// A device-tensor LR (the CUDA graph form) gives the same update as the scalar.
TEST(RmsPropTf, TensorLearningRateMatchesTheScalarOne) {
  for (const char* kind : {"rmsproptf", "rmsprop"}) {
    std::vector<at::Tensor> results;
    for (bool tensor_lr : {false, true}) {
      torch::nn::Module m;
      auto w = m.register_parameter("w", torch::linspace(-1, 1, 12).view({3, 4}));
      OptimizerOptions o;
      o.kind = kind;
      o.momentum = 0.9;
      auto opt = make_optimizer(m, o);
      for (int s = 0; s < 3; ++s) {
        opt->zero_grad();
        (w * w * (s + 1)).sum().backward();
        if (tensor_lr) {
          opt->step(torch::full({}, 0.01));
        } else {
          opt->step(0.01);
        }
      }
      results.push_back(w.detach().clone());
    }
    EXPECT_TRUE(torch::allclose(results[0], results[1], 1e-6, 1e-7)) << kind;
  }
}

TEST(RmsPropTf, OverflowSkipLeavesParametersAndStateUnchanged) {
  torch::nn::Module m;
  auto w = m.register_parameter("w", torch::ones({4, 2}));
  OptimizerOptions o;
  o.kind = "rmsproptf";
  auto opt = make_optimizer(m, o);
  (w * 3).sum().backward();
  std::vector<at::Tensor> before{w.detach().clone()};
  for (const auto& t : opt->state()) before.push_back(t.second.clone());
  opt->step(0.1, torch::full({}, true));
  EXPECT_TRUE(torch::equal(w.detach(), before[0]));
  for (size_t i = 0; i < opt->state().size(); ++i) EXPECT_TRUE(torch::equal(opt->state()[i].second, before[i + 1]));
}

// timm's step scheduler of the GPUNet recipe: base * rate^floor(epoch / 2.4),
// with warmup from --warmup-lr.
TEST(LrSchedule, StaircaseDecaysEveryFractionOfAnEpochAfterWarmupFromASmallLr) {
  ScheduleOptions o;
  o.kind = "staircase";
  o.base_lr = 0.06;
  o.step_factor = 0.97;
  o.decay_epochs = 2.4;
  o.warmup_epochs = 1;
  o.warmup_lr = 1e-6;
  o.steps_per_epoch = 10;
  o.epochs = 10;
  o.per_epoch = false;
  const LrSchedule s(o);
  EXPECT_DOUBLE_EQ(s.at(0), 1e-6);
  EXPECT_NEAR(s.at(5), 1e-6 + (0.06 - 1e-6) * 0.5, 1e-15);
  EXPECT_DOUBLE_EQ(s.at(10), 0.06);
  EXPECT_DOUBLE_EQ(s.at(23), 0.06);                 // epoch 2.3
  EXPECT_NEAR(s.at(24), 0.06 * 0.97, 1e-15);        // epoch 2.4 exactly
  EXPECT_NEAR(s.at(47), 0.06 * 0.97, 1e-15);
  EXPECT_NEAR(s.at(48), 0.06 * 0.97 * 0.97, 1e-15); // epoch 4.8
  EXPECT_NEAR(s.at(99), 0.06 * std::pow(0.97, 4), 1e-15);
}

// GPUNet's train.params (--sched step --decay-epochs 2.4 --decay-rate .97
// --warmup-lr 1e-6 --lr .06, timm's default --warmup-epochs 3) through the
// built-in recipe: the LR of epochs 0-15 as timm 0.5.4's StepLRScheduler sets
// it, worked out by hand (e // 2.4 = 0,0,0,1,1,2,2,2,3,3,4,4,5,5,5,6).
TEST(LrSchedule, GpunetRecipeChangesTheLrAtEpochStartsAsTimm) {
  TrainConfig c;
  apply_json(c, load_recipe("gpunet-0-450ep"), "gpunet-0-450ep");
  ASSERT_EQ(c.lr_granularity, "epoch");
  ScheduleOptions o;
  o.kind = c.lr_schedule;
  o.per_epoch = true;
  o.base_lr = scaled_lr(c.lr, 8 * 192, c.lr_reference_batch);  // the recipe's 8 GPUs x 192
  o.warmup_epochs = c.warmup;
  o.warmup_lr = c.warmup_lr;
  o.decay_epochs = c.lr_decay_epochs;
  o.step_factor = c.lr_step_factor;
  o.steps_per_epoch = 7;
  o.epochs = c.epochs;
  const LrSchedule s(o);
  const double expected[] = {1e-6,     0.020000666666666667, 0.040000333333333333, 0.0582,     0.0582,
                             0.056454, 0.056454,             0.056454,             0.05476038, 0.05476038,
                             0.0531175686, 0.0531175686,     0.051524041542,       0.051524041542,
                             0.051524041542, 0.04997832029574};
  for (int e = 0; e < 16; ++e) {
    for (int i = 0; i < 7; ++i) EXPECT_NEAR(s.at(e * 7 + i), expected[e], 1e-15) << "epoch " << e << " step " << i;
  }
}

TEST(LrSchedule, PythonFloorDivisionAsTimmUsesIt) {
  EXPECT_EQ(python_floordiv(12, 2.4), 5);  // 12 / 2.4 rounds to 4.999...; CPython says 5
  EXPECT_EQ(python_floordiv(7, 2.4), 2);
  EXPECT_EQ(python_floordiv(2, 2.4), 0);
  EXPECT_EQ(python_floordiv(24, 2.4), 10);
}

// DLE's lr_{cosine,linear,step}_policy: the epoch decides, warmup (e + 1) / W.
TEST(LrSchedule, DlePoliciesPerEpoch) {
  ScheduleOptions o;
  o.base_lr = 2.048;
  o.warmup_epochs = 8;
  o.epochs = 250;
  o.steps_per_epoch = 10;
  o.steps = {30, 60, 80};
  o.step_factor = 0.1;
  o.kind = "cosine";
  const LrSchedule cosine(o);
  EXPECT_DOUBLE_EQ(cosine.at(0), 2.048 / 8);
  EXPECT_DOUBLE_EQ(cosine.at(9), 2.048 / 8);      // the whole first epoch
  EXPECT_DOUBLE_EQ(cosine.at(79), 2.048);         // epoch 7: (7 + 1) / 8
  EXPECT_DOUBLE_EQ(cosine.at(80), 2.048);         // epoch 8: cos(0)
  EXPECT_NEAR(cosine.at(1290), 0.5 * (1 + std::cos(M_PI * 121 / 242)) * 2.048, 1e-12);  // epoch 129
  o.kind = "linear";
  EXPECT_NEAR(LrSchedule(o).at(2495), 2.048 * (1 - 241.0 / 242), 1e-12);  // epoch 249
  o.kind = "step";
  const LrSchedule step(o);
  EXPECT_DOUBLE_EQ(step.at(299), 2.048);
  EXPECT_NEAR(step.at(300), 0.2048, 1e-12);
  EXPECT_NEAR(step.at(805), 0.002048, 1e-12);
}

TEST(TrainConfig, EpochGranularityNeedsWholeWarmupEpochs) {
  TrainConfig c;
  c.data = "synthetic";
  c.warmup = 0.5;
  EXPECT_THROW(validate(c), Error);
  c.lr_granularity = "step";
  EXPECT_NO_THROW(validate(c));
}

// A network that returns fixed logits (plus 0 * a parameter, for a gradient)
// and records the input size it saw.
class FixedLogits : public NetworkImpl {
 public:
  explicit FixedLogits(torch::Tensor logits) : logits_(std::move(logits)) {
    w_ = register_parameter("w", torch::zeros({1}));
  }
  torch::Tensor forward(torch::Tensor x) override {
    seen = x.size(2);
    return logits_ + w_ * x.mean();
  }
  std::int64_t seen = 0;

 private:
  torch::Tensor logits_, w_;
};

// The bar: a distillation step's loss equals a hand-computed value. Two
// images, three classes, smoothing 0.1; the teacher sees 8 px, the student 4 px.
TEST(Distillation, StepLossEqualsTheHandComputedValue) {
  const double s[2][3] = {{2.0, 0.5, -1.0}, {0.0, 1.0, 0.0}};
  const double t[2][3] = {{1.0, 1.0, 0.0}, {-1.0, 2.0, 0.5}};
  const int64_t labels[2] = {0, 2};
  auto student = std::make_shared<FixedLogits>(torch::tensor({{2.0f, 0.5f, -1.0f}, {0.0f, 1.0f, 0.0f}}));
  auto teacher = std::make_shared<FixedLogits>(torch::tensor({{1.0f, 1.0f, 0.0f}, {-1.0f, 2.0f, 0.5f}}));
  teacher->eval();
  OptimizerOptions oo;
  oo.momentum = 0;
  auto opt = make_optimizer(*student, oo);
  StepOptions so;
  so.label_smoothing = 0.1;
  so.teacher = teacher.get();
  so.student_size = 4;
  const auto out = train_step(*student, *opt, nullptr, nullptr,
                              {{torch::zeros({2, 3, 8, 8}), torch::tensor({labels[0], labels[1]})}}, 0.0, 0, so);

  double expected = 0;
  for (int n = 0; n < 2; ++n) {
    double zs = 0, zt = 0;
    for (int c = 0; c < 3; ++c) {
      zs += std::exp(s[n][c]);
      zt += std::exp(t[n][c]);
    }
    for (int c = 0; c < 3; ++c) {
      const double log_p = s[n][c] - std::log(zs);
      const double smooth = (c == labels[n] ? 0.9 : 0.0) + 0.1 / 3;
      expected += -smooth * log_p / 2;                          // label-smoothed CE, batch mean
      expected += -(std::exp(t[n][c]) / zt) * log_p / 2;        // soft targets, batch mean
    }
  }
  EXPECT_NEAR(out.loss.item<double>(), expected, 1e-6);
  EXPECT_EQ(teacher->seen, 8);
  EXPECT_EQ(student->seen, 4);
  // The teacher stays frozen: no gradient reaches it.
  for (const auto& p : teacher->parameters()) EXPECT_FALSE(p.grad().defined());
}

}  // namespace
}  // namespace convnets::train
