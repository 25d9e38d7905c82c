// 2:4 structured sparsity (train/asp.h): the masks, the eligible layers, and the optimizer that keeps them.
#include "core/error.h"
#include "io/state_dict.h"
#include "models/layers.h"
#include "models/registry.h"
#include "train/asp.h"
#include "train/ema.h"
#include "train/graph_step.h"
#include "train/sgd.h"
#include "train/step.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <numeric>

namespace convnets::train {
namespace {

// The mask by its definition, one group at a time: at every (out, kh, kw), of
// input channels 4g .. 4g+3 the two of largest |w|, the lower channel on a tie.
at::Tensor reference_mask(const at::Tensor& w4) {
  auto mask = torch::zeros(w4.sizes(), torch::kUInt8);
  auto a = w4.accessor<float, 4>();
  auto m = mask.accessor<std::uint8_t, 4>();
  for (int64_t k = 0; k < w4.size(0); ++k)
    for (int64_t r = 0; r < w4.size(2); ++r)
      for (int64_t s = 0; s < w4.size(3); ++s)
        for (int64_t g = 0; g < w4.size(1); g += 4) {
          std::array<int64_t, 4> idx{g, g + 1, g + 2, g + 3};
          std::stable_sort(idx.begin(), idx.end(),
                           [&](int64_t x, int64_t y) { return std::abs(a[k][x][r][s]) > std::abs(a[k][y][r][s]); });
          m[k][idx[0]][r][s] = m[k][idx[1]][r][s] = 1;
        }
  return mask;
}

TEST(Asp, MaskKeepsTheTwoLargestOfEveryFourInputChannelsAtEachTap) {
  torch::manual_seed(1);
  const auto w = torch::randn({8, 16, 3, 3});
  const auto mask = mask_2_4(w);
  ASSERT_EQ(mask.scalar_type(), torch::kUInt8);
  ASSERT_EQ(mask.sizes(), w.sizes());
  EXPECT_TRUE(torch::equal(mask, reference_mask(w)));
  // Exactly 2 of every 4 consecutive input channels; not along any other dimension.
  EXPECT_TRUE(mask.view({8, 4, 4, 3, 3}).sum(2).eq(2).all().item<bool>());
  EXPECT_FALSE(mask.permute({1, 2, 3, 0}).reshape({-1, 4}).sum(1).eq(2).all().item<bool>());
  // A channels-last weight (as training holds it) masks the same.
  EXPECT_TRUE(torch::equal(mask_2_4(w.contiguous(at::MemoryFormat::ChannelsLast)), mask));
  // By hand: |w| = 0.1, 3, 2, 0.5 keeps the 2nd and 3rd; equal magnitudes keep the first two.
  const auto one = torch::tensor({0.1f, -3.f, 2.f, 0.5f, 1.f, -1.f, 1.f, 1.f}).view({1, 8, 1, 1});
  EXPECT_TRUE(torch::equal(mask_2_4(one).flatten().to(torch::kLong), torch::tensor({0, 1, 1, 0, 1, 1, 0, 0}, torch::kLong)));
}

TEST(Asp, LinearGroupsItsInputs) {
  torch::manual_seed(2);
  const auto w = torch::randn({16, 32});
  const auto mask = mask_2_4(w);
  EXPECT_TRUE(torch::equal(mask, reference_mask(w.view({16, 32, 1, 1})).view({16, 32})));
  EXPECT_TRUE(mask.view({16, 8, 4}).sum(2).eq(2).all().item<bool>());
  EXPECT_THROW(mask_2_4(torch::randn({16, 3, 3, 3})), Error);  // 3 input channels
}

TEST(Asp, SparsityOfAWeight) {
  torch::manual_seed(3);
  const auto w = torch::randn({8, 16, 3, 3});
  const auto pruned = w * mask_2_4(w);
  const auto s = sparsity_of(pruned);
  EXPECT_TRUE(s.is_2_4());
  EXPECT_EQ(s.zeros, w.numel() / 2);
  EXPECT_EQ(s.groups, w.numel() / 4);
  auto three = pruned.clone();
  three[0][0][0][0] = three[0][1][0][0] = three[0][2][0][0] = 1.0;  // one group with 3 non-zeros
  EXPECT_EQ(sparsity_of(three).dense_groups, 1);
  EXPECT_FALSE(sparsity_of(three).is_2_4());
  EXPECT_FALSE(sparsity_of(w).is_2_4());
  EXPECT_FALSE(sparsity_of(torch::zeros({16, 3, 3, 3})).groupable);
}

struct Shapes : torch::nn::Module {
  Shapes() {
    register_module("ok", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3)));
    register_module("odd_out", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 12, 1)));
    register_module("narrow_in", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 1)));
    register_module("depthwise", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 16, 3).groups(16)));
    register_module("head", torch::nn::Linear(64, 16));
    register_module("frozen", torch::nn::Linear(64, 16))->weight.set_requires_grad(false);
  }
};

TEST(Asp, PlanSaysWhichWeightsStayDenseAndWhy) {
  Shapes m;
  std::vector<std::string> got;
  for (const auto& l : plan_2_4(m, "head.weight")) got.push_back(l.describe());
  EXPECT_EQ(got, (std::vector<std::string>{
                     "ok.weight [32, 16, 3, 3]: 2:4",
                     "odd_out.weight [12, 16, 1, 1]: 12 output channels, not a multiple of 8 (apex ASP's sparse "
                     "tensor-core shape rule)",
                     "narrow_in.weight [16, 8, 1, 1]: 8 input channels, not a multiple of 16 (apex ASP's sparse "
                     "tensor-core shape rule)",
                     "depthwise.weight [16, 1, 3, 3]: 1 input channel per group, not a multiple of 4",
                     "head.weight [16, 64]: the classifier, left dense as DLE's PaddlePaddle RN50 v1.5 --asp leaves fc",
                 }));
  ModelOptions o;
  o.num_classes = 10;
  const auto net = build_model(find_architecture("resnet8"), o);
  const auto plan = plan_2_4(*net, "fc.weight");
  ASSERT_EQ(plan.size(), 10u);  // 7 3x3 convs, 2 projections, the classifier
  EXPECT_EQ(plan.front().describe(), "conv1.weight [16, 3, 3, 3]: 3 input channels, not a multiple of 4");
  EXPECT_EQ(std::count_if(plan.begin(), plan.end(), [](const AspLayer& l) { return l.masked(); }), 8);
}

// A resnet8 behind AspOptimizer, pruned, then trained a few steps.
struct Pruned {
  Network model;
  std::unique_ptr<AspOptimizer> opt;
  Network shadow;
  std::unique_ptr<Ema> ema;
  explicit Pruned(std::uint64_t seed) {
    torch::manual_seed(seed);
    ModelOptions o;
    o.num_classes = 10;
    model = build_model(find_architecture("resnet8"), o);
    for (auto& w : model->parameters()) {
      if (w.dim() == 4) w.set_data(w.contiguous(at::MemoryFormat::ChannelsLast));  // as training holds them
    }
    opt = std::make_unique<AspOptimizer>(std::make_unique<Sgd>(*model, SgdOptions{0.875, true, 5e-4, false}),
                                         plan_2_4(*model, "fc.weight"));
    shadow = build_model(find_architecture("resnet8"), o);
    ema = std::make_unique<Ema>(shadow, *model, 0.9, true);
  }
  std::map<std::string, at::Tensor> weights(const torch::nn::Module& m) const {
    std::map<std::string, at::Tensor> out;
    for (const auto& l : opt->layers()) out[l.name] = m.named_parameters()[l.name].detach().clone();
    return out;
  }
};

std::vector<MicroBatch> batch(int step) {
  torch::manual_seed(300 + step);
  return {{torch::randn({4, 3, 16, 16}), torch::randint(0, 10, {4}, torch::kLong)}};
}

TEST(AspOptimizer, StepsKeepThePatternInTheModelAndTheEma) {
  Pruned p(7);
  EXPECT_TRUE(p.opt->state().back().first.rfind("optimizer.momentum.", 0) == 0) << "no masks before pruning";
  // Dense steps first, so the momentum of the weights about to be pruned is not zero.
  for (int s = 0; s < 2; ++s) train_step(*p.model, *p.opt, nullptr, p.ema.get(), batch(s), 0.1, s, {});
  p.opt->prune();
  p.opt->apply_to(*p.ema->model());
  const auto at_prune = p.weights(*p.model);
  StepOptions o;
  o.label_smoothing = 0.1;
  // Eager steps, then the static-buffer step a CUDA graph replays.
  for (int s = 2; s < 5; ++s) train_step(*p.model, *p.opt, nullptr, p.ema.get(), batch(s), 0.1, s, o);
  GraphedStep graphed(*p.model, *p.opt, nullptr, p.ema.get(), batch(5), o);
  for (int s = 5; s < 8; ++s) graphed.run(batch(s), 0.1);
  const auto after = p.weights(*p.model), ema = p.weights(*p.ema->model());
  for (const auto& l : p.opt->layers()) {
    if (!l.masked()) {
      EXPECT_FALSE(sparsity_of(after.at(l.name)).is_2_4()) << l.name;
      continue;
    }
    const auto kept = at_prune.at(l.name).ne(0);
    EXPECT_TRUE(sparsity_of(after.at(l.name)).is_2_4()) << l.name;
    EXPECT_TRUE(sparsity_of(ema.at(l.name)).is_2_4()) << l.name;
    EXPECT_TRUE(after.at(l.name).masked_select(kept.logical_not()).eq(0).all().item<bool>()) << l.name;
    EXPECT_TRUE(ema.at(l.name).masked_select(kept.logical_not()).eq(0).all().item<bool>()) << l.name;
    EXPECT_FALSE(torch::equal(after.at(l.name), at_prune.at(l.name))) << l.name << " trained";
  }
}

TEST(AspOptimizer, MasksComeBackFromTheStateNotFromTheWeights) {
  Pruned a(8);
  a.opt->prune();
  for (int s = 0; s < 3; ++s) train_step(*a.model, *a.opt, nullptr, nullptr, batch(s), 0.2, s, {});
  const auto state = a.opt->state();
  TensorFile file;
  int masks = 0;
  for (const auto& [k, t] : state) {
    file.tensors.emplace_back(k, t.contiguous().clone());
    if (k.rfind("asp_mask.", 0) == 0) {
      ++masks;
      EXPECT_EQ(t.scalar_type(), torch::kUInt8) << k;
    }
  }
  EXPECT_EQ(masks, 8);
  // Other weights: masks recomputed from them would differ.
  Pruned b(9);
  b.opt->load_state(file, "ckpt");
  EXPECT_TRUE(b.opt->pruned());
  for (const auto& [k, t] : file.tensors) {
    if (k.rfind("asp_mask.", 0) != 0) continue;
    const auto name = k.substr(9);
    const auto w = b.model->named_parameters()[name];
    EXPECT_TRUE(w.masked_select(t.eq(0)).eq(0).all().item<bool>()) << name;
    EXPECT_FALSE(torch::equal(mask_2_4(Pruned(9).model->named_parameters()[name]), t)) << name;
  }
  // A damaged mask (3 of a group kept) and a missing one are refused by name.
  TensorFile bad = file;
  for (auto& [k, t] : bad.tensors) {
    if (k == "asp_mask.layer1.0.conv1.weight") t[0][0][0][0] = t[0][1][0][0] = t[0][2][0][0] = 1;
  }
  Pruned c(10);
  try {
    c.opt->load_state(bad, "ckpt");
    FAIL() << "a damaged mask loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("asp_mask.layer1.0.conv1.weight"), std::string::npos) << e.what();
  }
  TensorFile missing;
  for (const auto& [k, t] : file.tensors)
    if (k != "asp_mask.layer2.0.conv2.weight") missing.tensors.emplace_back(k, t);
  EXPECT_THROW(c.opt->load_state(missing, "ckpt"), Error);
  // Without any mask the run stays dense.
  TensorFile dense;
  for (const auto& [k, t] : file.tensors)
    if (k.rfind("asp_mask.", 0) != 0) dense.tensors.emplace_back(k, t);
  Pruned d(11);
  d.opt->load_state(dense, "ckpt");
  EXPECT_FALSE(d.opt->pruned());
}

}  // namespace
}  // namespace convnets::train
