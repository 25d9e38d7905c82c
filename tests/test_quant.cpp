// INT8 pieces: the eager graph interpreter against forward(), fake quantization, the calibrators' thresholds, the placement.
#include "core/error.h"
#include "data/dataset.h"
#include "models/registry.h"
#include "quant/eager.h"
#include "quant/qdq.h"
#include "runtime/evaluate.h"
#include "runtime/runtime.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>

namespace convnets {
namespace {

Network trained_looking(const std::string& arch, std::int64_t classes) {
  torch::manual_seed(0);
  ModelOptions o;
  o.num_classes = classes;
  auto net = build_model(find_architecture(arch), o);
  // Non-trivial BN statistics, so that folding them is exercised.
  torch::NoGradGuard no_grad;
  for (auto& b : net->named_buffers()) {
    if (b.key().find("running_mean") != std::string::npos) b.value().uniform_(-0.5, 0.5);
    if (b.key().find("running_var") != std::string::npos) b.value().uniform_(0.5, 2.0);
  }
  net->eval();
  return net;
}

// The interpreter every quantized path runs through (calibration, QAT) is the
// network: each arch family's emit() evaluated on tensors equals forward().
TEST(Quant, GraphForwardEqualsForwardForEachFamily) {
  for (const std::string arch : {"resnet18", "se_resnext101_32x4d", "gpunet-0", "tf_efficientnet_b2"}) {
    SCOPED_TRACE(arch);
    auto net = trained_looking(arch, 10);
    torch::NoGradGuard no_grad;
    const auto x = torch::randn({2, 3, 64, 64});
    const auto ref = net->forward(x);
    const auto got = quant::graph_forward(*net, x);
    EXPECT_LT((got - ref).abs().max().item<double>(), 1e-4 * std::max(1.0, ref.abs().max().item<double>()));
  }
}

TEST(Quant, ActivationParamsHoldZeroAndFoldTheRelu) {
  quant::Point relu{"relu 1", true, 0.0, 5.1};
  auto p = quant::activation_params(relu, quant::Activations::UInt8);
  EXPECT_EQ(p.zero_point, 0);  // the bottom of the range is 0: ReLU's clip
  EXPECT_DOUBLE_EQ(p.scale, 5.1 / 255);
  quant::Point both{"add 2", false, -1.0, 3.0};
  p = quant::activation_params(both, quant::Activations::UInt8);
  EXPECT_EQ(p.zero_point, 64);  // round(1 / (4/255)) = round(63.75)
  p = quant::activation_params(both, quant::Activations::Int8);
  EXPECT_EQ(p.zero_point, 0);
  EXPECT_DOUBLE_EQ(p.scale, 3.0 / 127);
  quant::Point positive{"conv", false, 2.0, 4.0};  // widened to hold 0 exactly
  EXPECT_DOUBLE_EQ(quant::activation_params(positive, quant::Activations::UInt8).scale, 4.0 / 255);
}

TEST(Quant, WeightScalesArePerOutputChannel) {
  auto w = torch::zeros({3, 2, 1, 1});
  w[0][0][0][0] = -2.54;
  w[1][1][0][0] = 1.27;
  const auto s = quant::weight_scales(w, quant::weight_qmax(false));
  EXPECT_NEAR(s[0].item<double>(), 0.02, 1e-7);
  EXPECT_NEAR(s[1].item<double>(), 0.01, 1e-7);
  EXPECT_EQ(s[2].item<double>(), 1.0);  // an all-zero channel
  EXPECT_NEAR(quant::weight_scales(w, quant::weight_qmax(true))[0].item<double>(), 2.54 / 63, 1e-7);
}

TEST(Quant, PercentileAndEntropyThresholds) {
  // Uniform over [0, 1): nothing to clip for entropy; the 99.99th percentile is the top bin.
  std::vector<double> uniform(2048, 10.0);
  EXPECT_DOUBLE_EQ(quant::entropy_threshold(uniform, 1.0, 128), 1.0);
  EXPECT_DOUBLE_EQ(quant::percentile_threshold(uniform, 1.0, 99.99), 1.0);
  EXPECT_DOUBLE_EQ(quant::percentile_threshold(uniform, 1.0, 50.0), 0.5);
  // A mass near 0 and one far outlier: both clip well below the outlier.
  std::vector<double> tailed(2048, 0.0);
  for (int i = 0; i < 200; ++i) tailed[static_cast<std::size_t>(i)] = 1000.0 * std::exp(-i / 40.0);
  tailed[2047] = 1;
  const double t = quant::entropy_threshold(tailed, 1.0, 128);
  EXPECT_LT(t, 0.25);
  EXPECT_GE(t, 128.0 / 2048);  // never below `levels` bins
  EXPECT_LT(quant::percentile_threshold(tailed, 1.0, 99.99), 0.2);
}

// The plan's JSON (checkpoints, ONNX metadata) keeps every field, the SiLU placement among them.
TEST(Quant, PlanJsonKeepsTheSiluPlacementAndReadsOlderPlansAsOps) {
  quant::Plan plan;  // every field away from its default, so a field the JSON drops shows
  plan.activations = quant::Activations::Int8;
  plan.method = quant::Method::Entropy;
  plan.reduce_range = true;
  plan.silu = quant::Silu::Float;
  plan.images = 8;
  plan.points.push_back({"conv1", false, -1.5, 2.0});
  plan.points.push_back({"add 3", true, 0.0, 0.1 + 0.2});  // a double that needs all 17 digits
  const auto j = quant::to_json(plan);
  // Through the text a checkpoint or an ONNX file stores, then the whole document compared, not a sample of it.
  const auto back = quant::plan_from_json(nlohmann::json::parse(j.dump()), "a.safetensors");
  EXPECT_EQ(quant::to_json(back), j);
  EXPECT_EQ(back.activations, quant::Activations::Int8);
  EXPECT_EQ(back.method, quant::Method::Entropy);
  EXPECT_TRUE(back.reduce_range);
  EXPECT_EQ(back.silu, quant::Silu::Float);
  EXPECT_EQ(back.images, 8);
  ASSERT_EQ(back.points.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back.points[i].site, plan.points[i].site);
    EXPECT_EQ(back.points[i].relu, plan.points[i].relu);
    EXPECT_EQ(back.points[i].lo, plan.points[i].lo);
    EXPECT_EQ(back.points[i].hi, plan.points[i].hi);
  }
  // Checkpoints from before the choice existed carry no "silu": they were the ops form.
  auto older = j;
  older.erase("silu");
  EXPECT_EQ(quant::plan_from_json(older, "old.safetensors").silu, quant::Silu::Ops);
  auto bad = j;
  bad["silu"] = "fused";
  try {
    quant::plan_from_json(bad, "bad.safetensors");
    FAIL() << "silu 'fused' was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.safetensors: silu fused: expected ops"), std::string::npos) << e.what();
  }
}

// Calibrated on images, the fake-quantized network stays close to the float
// one, trains (gradients reach the weights and BN's gamma, its statistics
// stay frozen), and the ranges of one network are refused by another.
TEST(Quant, CalibratedFakeQuantizedNetworkIsCloseTrainsAndFitsOnlyItsNetwork) {
  auto net = trained_looking("resnet18", 1000);
  Preprocessing pre;
  pre.input_size = 64;
  data::PipelineOptions lo;
  lo.batch_size = 8;
  lo.workers = 0;
  lo.max_image_pixels = 0;
  const auto loader = runtime::make_eval_loader(data::open_dataset("synthetic:16", "train"), pre, lo);
  const runtime::Runtime rt;
  auto plan = std::make_shared<quant::Plan>(
      quant::calibrate(*net, *loader, rt, pre, quant::Activations::UInt8, quant::Method::Percentile, false,
                      quant::Silu::Ops, ""));
  EXPECT_EQ(plan->images, 16);
  ASSERT_FALSE(plan->points.empty());
  EXPECT_EQ(plan->points.front().site, "conv1");  // the normalised image
  int folded = 0;
  for (const auto& p : plan->points) {
    EXPECT_LE(p.lo, p.hi) << p.site;
    if (p.relu) {
      ++folded;
      EXPECT_EQ(p.lo, 0.0) << p.site;
    }
  }
  EXPECT_EQ(folded, 17);  // the stem's ReLU and two per basic block

  quant::FakeQuantNetworkImpl fq(net, plan);
  torch::manual_seed(1);
  const auto input = torch::randn({4, 3, 64, 64}) * 0.5;
  {
    torch::NoGradGuard no_grad;
    const auto ref = net->forward(input).flatten();
    const auto got = fq.forward(input).flatten();
    const double cosine = (ref * got).sum().item<double>() / (ref.norm() * got.norm()).item<double>();
    EXPECT_GT(cosine, 0.95);
  }
  const auto mean_before = net->named_buffers()["bn1.running_mean"].clone();
  fq.train();
  fq.forward(input).square().mean().backward();
  const auto params = net->named_parameters();
  EXPECT_GT(params["conv1.weight"].grad().abs().sum().item<double>(), 0);
  EXPECT_GT(params["bn1.weight"].grad().abs().sum().item<double>(), 0);
  EXPECT_TRUE(torch::equal(net->named_buffers()["bn1.running_mean"], mean_before));
  // Same parameters under the same names: checkpoints and optimizers see the plain network.
  EXPECT_EQ(fq.named_parameters().keys(), net->named_parameters().keys());

  auto other = trained_looking("resnet34", 1000);
  quant::FakeQuantNetworkImpl wrong(other, plan);
  torch::NoGradGuard no_grad;
  try {
    wrong.forward(input);
    FAIL() << "resnet18's ranges accepted by resnet34";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the quantization ranges do not fit this network"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace convnets
