// The step tuner and the folded input gradients on the GPU: what it times and keeps for ResNet-50, the second run's cache, the fold's epilogue against the unfused sum. Each skips without a GPU.
#include "models/fusion.h"
#include "models/grad_fold.h"
#include "models/registry.h"
#include "runtime/block_timer.h"
#include "runtime/fusion_setup.h"
#include "runtime/runtime.h"
#include "runtime/tuner.h"
#include "train/sgd.h"
#include "train/loss_scale.h"
#include "train/graph_step.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <filesystem>
#include <iostream>
#include <unistd.h>

namespace convnets {
namespace {

using models::FusionMode;
using models::FusionPath;

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: this check runs on the GPU machine (scripts/gpu.sh)"

Network resnet50_on(const runtime::Runtime& rt) {
  torch::manual_seed(21);
  ModelOptions o;
  o.num_classes = 100;
  auto m = build_model(find_architecture("resnet50"), o);
  runtime::prepare_model(*m, rt);
  return m;
}

// ResNet-50 amp at batch 64 and 128 px: 8 block shapes, each timed on its verified paths (NormConv is not one), each
// fused path within its numerics bound of the unfused one on this GPU; a second run from the cache times nothing,
// chooses the same and takes less time; a graphed training step then runs on the choices.
TEST(Gpu, FusedStepTunerChoosesVerifiedPathsAndCachesThem) {
  SKIP_WITHOUT_CUDA();
  const auto rt = runtime::resolve_runtime("cuda", "amp", "nhwc");
  const auto cache = (std::filesystem::temp_directory_path() / ("convnets-gpu-tuning-" + std::to_string(::getpid())))
                         .string();
  std::filesystem::remove(cache);
  const std::vector<std::int64_t> sizes{64, 3, 128, 128};
  // A run's start: a fresh network, its fusion set, then tuned against the cache.
  auto start = [&](Network& model, const char* which) {
    model = resnet50_on(rt);
    runtime::set_fusion(*model, rt, FusionMode::Auto);
    auto report = runtime::tune_fusion(*model, rt, FusionMode::Auto, sizes, cache);
    std::cout << which << " run, " << report.seconds << " s:\n" << report.describe() << "\n";
    return report;
  };
  Network first, second;
  const auto one = start(first, "first");
  EXPECT_EQ(one.timed, 8);
  EXPECT_EQ(one.cached, 0);
  for (const auto& shape : one.shapes) {
    EXPECT_NE(shape.chosen, FusionPath::NormConv) << shape.key;
    for (const auto& c : shape.candidates) {
      if (c.path == FusionPath::NormConv) {
        EXPECT_NE(c.refusal.find("unverified"), std::string::npos) << c.refusal;
        continue;
      }
      EXPECT_EQ(c.refusal, "") << shape.key << " " << models::path_name(c.path);
      EXPECT_TRUE(c.numerics_ok) << shape.key << " " << models::path_name(c.path) << ": " << c.numerics;
      EXPECT_GT(c.ms, 0);
    }
  }
  const auto two = start(second, "second");
  EXPECT_EQ(two.timed, 0);
  EXPECT_EQ(two.cached, 8);
  EXPECT_TRUE(torch::equal(models::block_paths(*first), models::block_paths(*second)));
  EXPECT_LT(two.seconds, one.seconds);
  std::filesystem::remove(cache);

  // The tuned network trains as one graphed step.
  train::Sgd sgd(*second, {0.875, false, 3.0517578125e-05, false});
  train::LossScaler scaler(rt.device);
  train::StepOptions so;
  so.autocast = rt.autocast;
  so.label_smoothing = 0.1;
  train::StepRunner runner(*second, sgd, &scaler, nullptr, so, rt.device, /*cuda_graph=*/true);
  const auto x = torch::randn({64, 3, 128, 128}, torch::kCUDA).to(rt.autocast).contiguous(at::MemoryFormat::ChannelsLast);
  const auto y = torch::randint(0, 100, {64}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kLong));
  double loss = 0;
  for (int step = 0; step < 6; ++step) loss = runner.run({{x, y, {}}}, 0.1, step).item<double>();
  EXPECT_TRUE(runner.graphed());
  EXPECT_TRUE(std::isfinite(loss)) << loss;
}

// The fold on one ResNet-50 bottleneck of each kind (identity, downsample) at batch 128 in fp16: the block's input
// gradient made by cuDNN's dgrad+add epilogue, within the numerics bound of the unfused sum, and counted there.
TEST(Gpu, FusedFoldSumsEachBlockInputInTheEpilogue) {
  SKIP_WITHOUT_CUDA();
  const auto rt = runtime::resolve_runtime("cuda", "amp", "nhwc");
  auto net = resnet50_on(rt);
  runtime::set_fusion(*net, rt, FusionMode::Bn);
  runtime::record_block_inputs(*net, rt, {128, 3, 224, 224});
  runtime::DeviceBlockTimer timer(true, 1, 2);
  for (const auto& [name, block] : models::tunable_blocks(*net)) {
    if (name != "layer1.0" && name != "layer1.1" && name != "layer3.0") continue;
    models::reset_fold_counts();
    const auto got = timer.time(block->module(), *block,
                                {FusionPath::Bn, FusionPath::BnFold}, block->last_input_sizes(), at::kHalf);
    for (const auto& c : got) {
      std::cout << name << " " << models::path_name(c.path) << ": " << c.ms << " ms, " << c.numerics << "\n";
      EXPECT_EQ(c.refusal, "") << name;
      EXPECT_TRUE(c.numerics_ok) << name << " " << models::path_name(c.path) << ": " << c.numerics;
    }
    // The fold ran in its check, its warm-up and its 2 timed passes: 4 epilogues, no add.
    const auto counts = models::fold_counts();
    EXPECT_EQ(counts.epilogue, 4) << name;
    EXPECT_EQ(counts.dgrad_then_add + counts.at_tap, 0) << name;
  }
}

}  // namespace
}  // namespace convnets
