// Model zoo: state_dict layout against the reference implementations, GMACs, init options, bad input.
#include "core/error.h"
#include "io/state_dict.h"
#include "export/onnx_export.h"
#include "models/fusion.h"
#include "models/graph.h"
#include "kernels/bn_stats.h"
#include "models/layers.h"
#include "models/norm_conv.h"
#include "models/resnet.h"
#include "norm_conv_block.h"
#include "models/registry.h"
#include "test_util.h"
#include "cudnn_devices.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

namespace convnets {
namespace {

// DLE reference files name stages `layers.N.`; the published NGC checkpoints
// and convnets use torchvision's `layer{N+1}.` (independent of resnet_key_from_dle).
std::string dle_to_tv(const std::string& key) {
  static const std::regex stage(R"(^layers\.(\d+)\.)");
  std::smatch m;
  if (!std::regex_search(key, m, stage)) return key;
  return "layer" + std::to_string(std::stoi(m[1]) + 1) + "." + m.suffix().str();
}

ModelOptions classes(int64_t n) {
  ModelOptions o;
  o.num_classes = n;
  return o;
}

class ReferenceLayout : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceLayout, KeysShapesOrderAndParameterCountMatchReference) {
  CONVNETS_REQUIRE_SHARED(shared);
  const auto& arch = find_architecture(GetParam());
  const std::string path = shared + "/reference/models/" + arch.reference + ".keys.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "missing reference " << path;
  const auto ref = nlohmann::json::parse(in);

  auto net = build_model(arch, ModelOptions{});
  const auto ours = state_dict(*net);
  const auto& ref_sd = ref.at("state_dict");
  ASSERT_EQ(ours.size(), ref_sd.size()) << arch.name << " vs " << arch.reference;
  for (size_t i = 0; i < ours.size(); ++i) {
    const auto ref_key = dle_to_tv(ref_sd[i][0].get<std::string>());
    const auto ref_shape = ref_sd[i][1].get<std::vector<int64_t>>();
    ASSERT_EQ(ours[i].first, ref_key) << "entry " << i;
    ASSERT_EQ(ours[i].second.sizes().vec(), ref_shape) << ours[i].first;
  }
  EXPECT_EQ(count_parameters(*net), ref.at("params").get<int64_t>());

  std::vector<std::string> buffers;
  for (const auto& b : net->named_buffers()) buffers.push_back(b.key());
  std::vector<std::string> ref_buffers;
  for (const auto& b : ref.at("buffers")) ref_buffers.push_back(dle_to_tv(b.get<std::string>()));
  EXPECT_EQ(buffers, ref_buffers);
}

std::vector<std::string> archs_with_reference() {
  std::vector<std::string> names;
  for (const auto& a : architectures()) {
    if (!a.reference.empty()) names.push_back(a.name);
  }
  return names;
}

INSTANTIATE_TEST_SUITE_P(AllArchs, ReferenceLayout, ::testing::ValuesIn(archs_with_reference()),
                         [](const auto& info) {
                           std::string name = info.param;  // gtest names allow [A-Za-z0-9_] only
                           for (auto& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

TEST(Models, ParameterCountsFromTheIssue) {
  EXPECT_EQ(count_parameters(*build_model(find_architecture("resnet50"), {})), 25'557'032);
  EXPECT_EQ(count_parameters(*build_model(find_architecture("se_resnext101_32x4d"), {})), 45'251'128);
}

// torchvision's model docs list these "GFLOPS" (multiply-accumulates at 224 px).
TEST(Models, GmacsMatchTorchvisionPublishedFigures) {
  const std::pair<const char*, double> published[] = {
      {"resnet18", 1.81},        {"resnet34", 3.66},          {"resnet50", 4.09},
      {"resnet101", 7.80},       {"resnet152", 11.51},        {"resnext50_32x4d", 4.23},
      {"resnext101_32x8d", 16.41}, {"wide_resnet50_2", 11.40},
  };
  for (const auto& [name, gmacs] : published) {
    auto net = build_model(find_architecture(name), {});
    EXPECT_NEAR(static_cast<double>(count_macs(*net, 224)) / 1e9, gmacs, 0.005) << name;
  }
}

TEST(Models, MacCountingLeavesTheModelUsable) {
  auto net = build_model(find_architecture("resnet18"), {});
  net->train();
  count_macs(*net, 64);
  EXPECT_TRUE(net->is_training());
  torch::NoGradGuard no_grad;
  auto y = net->forward(torch::randn({2, 3, 64, 64}));
  EXPECT_GT(y.abs().sum().item<double>(), 0.0) << "convs must compute again after the shape-only pass";
}

// `convnets models` builds every network under ShapesOnly: it must give what a normal build gives (parameter names,
// shapes and order, each conv's options, the MACs), with zeros instead of random numbers, and only in its scope.
// Which BatchNorm layers a training run fuses with their ReLU and residual add (models::fused_bn_plan), decided
// before the first step from the run's device, dtype and layout: in ResNet-50 the stem's and each bottleneck's
// first two BNs are BN+ReLU, each bottleneck's last BN+add+ReLU, the four downsample BNs have nothing after them.
TEST(Models, FusedBnPlanNamesEveryLayerAndWhy) {
  models::FusedBnContext gpu;
  gpu.cuda = true;
  gpu.dtype = torch::kHalf;
  auto count = [](const std::vector<models::FusedBnLayer>& plan, models::BnFusion f, bool fused) {
    return std::count_if(plan.begin(), plan.end(),
                         [&](const auto& l) { return l.fusion == f && l.refusal.empty() == fused; });
  };
  // Only the structure matters here: built as `convnets models` builds its listing.
  models::ShapesOnly shapes_only;
  ModelOptions listing;
  listing.initialize = false;
  auto resnet50 = build_model(find_architecture("resnet50"), listing);
  const auto plan = models::fused_bn_plan(*resnet50, gpu);
  ASSERT_EQ(plan.size(), 53u);
  EXPECT_EQ(count(plan, models::BnFusion::Relu, true), 33);
  EXPECT_EQ(count(plan, models::BnFusion::AddRelu, true), 16);
  EXPECT_EQ(count(plan, models::BnFusion::None, false), 4);
  std::map<std::string, models::BnFusion> by_name;
  for (const auto& l : plan) by_name[l.name] = l.fusion;
  EXPECT_EQ(by_name.at("bn1"), models::BnFusion::Relu);
  EXPECT_EQ(by_name.at("layer1.0.bn2"), models::BnFusion::Relu);
  EXPECT_EQ(by_name.at("layer4.2.bn3"), models::BnFusion::AddRelu);
  EXPECT_EQ(by_name.at("layer3.0.downsample.1"), models::BnFusion::None);
  EXPECT_EQ(models::describe_fused_bn_plan(plan),
            "49 of 53 BatchNorm layers fused (33 BN+ReLU, 16 BN+add+ReLU); not fused: 4 for no ReLU after it "
            "(layer1.0.downsample.1, ...)");

  // DLE's SE-ResNeXt: the SE gate sits between each block's last BN and the add.
  auto se = build_model(find_architecture("se_resnext101_32x4d"), listing);
  const auto se_plan = models::fused_bn_plan(*se, gpu);
  EXPECT_EQ(count(se_plan, models::BnFusion::AddRelu, true), 0);
  EXPECT_EQ(count(se_plan, models::BnFusion::Relu, true), 1 + 2 * 33);
  // A BasicBlock ResNet: bn1 BN+ReLU, bn2 BN+add+ReLU.
  auto resnet18 = build_model(find_architecture("resnet18"), listing);
  const auto plan18 = models::fused_bn_plan(*resnet18, gpu);
  EXPECT_EQ(count(plan18, models::BnFusion::Relu, true), 9);
  EXPECT_EQ(count(plan18, models::BnFusion::AddRelu, true), 8);
  // Networks whose blocks do not mark their BNs fuse none, and say so.
  auto gpunet = build_model(find_architecture("gpunet-0"), listing);
  const auto gplan = models::fused_bn_plan(*gpunet, gpu);
  EXPECT_FALSE(gplan.empty());
  EXPECT_EQ(count(gplan, models::BnFusion::None, false), static_cast<long>(gplan.size()));

  // Every reason a layer of a ResNet-50 run stays unfused, named.
  auto reason = [&](models::FusedBnContext c, std::int64_t channels = 64, bool sync = false) {
    return models::fused_bn_refusal(c, models::BnFusion::AddRelu, channels, sync);
  };
  EXPECT_EQ(reason(gpu), "");
  auto c = gpu;
  c.dtype = torch::kBFloat16;
  EXPECT_EQ(reason(c), "");
  c.mode = models::FusionMode::None;
  EXPECT_EQ(reason(c), "--fusion none");
  c = gpu, c.cuda = false;
  EXPECT_EQ(reason(c), "not on CUDA");
  c = gpu, c.dtype = torch::kFloat;
  EXPECT_NE(reason(c).find("fp32 activations"), std::string::npos) << reason(c);
  c = gpu, c.channels_last = false;
  EXPECT_NE(reason(c).find("--memory-format nhwc"), std::string::npos) << reason(c);
  c = gpu, c.training = false;
  EXPECT_NE(reason(c).find("inference"), std::string::npos) << reason(c);
  EXPECT_NE(reason(gpu, 64, true).find("--sync-bn"), std::string::npos);
  EXPECT_EQ(reason(gpu, 30), "30 channels (cuDNN's fused kernels need a multiple of 4)");
  c = gpu, c.cudnn_refusal = "cuDNN 91900 refused bfloat16: CUDNN_STATUS_NOT_SUPPORTED";
  EXPECT_EQ(reason(c), c.cudnn_refusal);
  EXPECT_EQ(models::fused_bn_refusal(gpu, models::BnFusion::None, 64, false), "no ReLU after it");
  c = gpu, c.dtype = torch::kFloat;
  EXPECT_EQ(models::describe_fused_bn_plan(models::fused_bn_plan(*resnet18, c)),
            "0 of 20 BatchNorm layers fused (0 BN+ReLU, 0 BN+add+ReLU); not fused: 17 for fp32 activations (the "
            "fused kernels take fp16 or bfloat16: --precision amp or bf16) (bn1, ...); 3 for no ReLU after it "
            "(layer2.0.downsample.1, ...)");
  // On the CPU the probe never asks cuDNN.
  EXPECT_NE(models::cudnn_fused_bn_refusal(torch::kFloat).find("not fp32"), std::string::npos);
}

// ResNet-18's training forward with every BN, residual add and ReLU written out as ATen ops (batch_norm, add, relu)
// over `m`'s own convolutions, parameters and buffers, as nn.BatchNorm2d and torchvision's blocks compute them: the
// reference the fused path's CPU fallback is held to.
at::Tensor resnet18_by_ops(torch::nn::Module& m, const at::Tensor& x) {
  std::map<std::string, std::shared_ptr<torch::nn::Module>> by;
  for (const auto& item : m.named_modules("", /*include_self=*/false)) by[item.key()] = item.value();
  auto conv = [&](const std::string& n, const at::Tensor& t) {
    return by.at(n)->as<models::Conv2dImpl>()->torch::nn::Conv2dImpl::forward(t);
  };
  auto bn = [&](const std::string& n, const at::Tensor& t) {
    auto* b = by.at(n)->as<models::BatchNorm2dImpl>();
    {
      torch::NoGradGuard no_grad;
      b->num_batches_tracked.add_(1);
    }
    return at::batch_norm(t, b->weight, b->bias, b->running_mean, b->running_var, /*training=*/true, 0.1,
                          b->options.eps(), /*cudnn_enabled=*/false);
  };
  auto t = at::max_pool2d(at::relu(bn("bn1", conv("conv1", x))), {3, 3}, {2, 2}, {1, 1});
  for (int s = 1; s <= 4; ++s) {
    for (int k = 0; k < 2; ++k) {
      const std::string p = "layer" + std::to_string(s) + "." + std::to_string(k) + ".";
      const auto y = bn(p + "bn2", conv(p + "conv2", at::relu(bn(p + "bn1", conv(p + "conv1", t)))));
      const auto shortcut = by.count(p + "downsample.0") ? bn(p + "downsample.1", conv(p + "downsample.0", t)) : t;
      t = at::relu(at::add(y, shortcut));
    }
  }
  auto* fc = by.at("fc")->as<torch::nn::LinearImpl>();
  return at::linear(at::adaptive_avg_pool2d(t, {1, 1}).flatten(1), fc->weight, fc->bias);
}

// Where the fused path cannot run (here: the CPU), forward_fused falls back to the three ops it replaces: a ResNet-18
// training step with every marked BN switched to the fused path equals the step written out with ATen's batch_norm,
// add and relu (resnet18_by_ops), outputs, gradients and running statistics bit for bit.
TEST(Models, FusedBnFallsBackToTheSameOpsOffCuda) {
  auto make = [] {
    torch::manual_seed(3);
    return build_model(find_architecture("resnet18"), classes(10));
  };
  auto written = make(), switched = make();
  EXPECT_EQ(models::set_fused_batchnorm(*switched, true), 17);
  const auto x = torch::randn({4, 3, 32, 32}).contiguous(at::MemoryFormat::ChannelsLast);
  written->train();
  switched->train();
  const auto a = resnet18_by_ops(*written, x), b = switched->forward(x);
  a.sum().backward();
  b.sum().backward();
  EXPECT_TRUE(torch::equal(a, b)) << (a - b).abs().max().item<double>();
  const auto pa = written->named_parameters(), pb = switched->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    const auto &ga = pa[i].value().grad(), &gb = pb[i].value().grad();
    ASSERT_TRUE(ga.defined() && gb.defined()) << pa[i].key() << ": every parameter has a gradient";
    EXPECT_TRUE(torch::equal(ga, gb)) << pa[i].key();
  }
  const auto ba = written->named_buffers(), bb = switched->named_buffers();
  for (std::size_t i = 0; i < ba.size(); ++i) EXPECT_TRUE(torch::equal(ba[i].value(), bb[i].value())) << ba[i].key();

  // One layer, against relu(batch_norm(x) + z) written out.
  models::BatchNorm2d bn(8);
  bn->set_fusion(models::BnFusion::AddRelu);
  bn->set_fused(true);
  const auto in = torch::randn({2, 8, 3, 3}), z = torch::randn({2, 8, 3, 3});
  auto mean = torch::zeros({8}), var = torch::ones({8});
  const auto want = torch::relu(torch::batch_norm(in, bn->weight, bn->bias, mean, var, true, 0.1, 1e-5, false) + z);
  EXPECT_TRUE(torch::allclose(bn->forward_fused(in, z), want));
  EXPECT_TRUE(torch::allclose(bn->running_var, var));
  EXPECT_EQ(bn->num_batches_tracked.item<std::int64_t>(), 1);
  EXPECT_THROW(bn->forward_fused(in), c10::Error) << "AddRelu needs its residual";
}

// ---- Part 3 of issue 58: the residual block with its BN statistics taken in the convolutions (NormConv) --------

// The decomposition, with ATen's ops for its primitives, is the block's function: in fp64, the output, every
// gradient (input, each conv weight, each BN gamma and beta) and each BN's running statistics and batch count equal
// autograd's through the plain modules to 1e-10. This is the arithmetic the GPU runs with cuDNN's graphs and the
// project's kernels in their place (Gpu.NormConv* compare those with these ops there).
TEST(Models, NormConvBlockIsTheBlocksFunctionForwardAndBackward) {
  struct Case {
    const char* what;
    std::int64_t in;
    std::vector<std::int64_t> widths;
    std::int64_t stride;
  };
  for (const Case& c : {Case{"bottleneck, downsample, stride 2", 16, {8, 8, 32}, 2},
                        Case{"bottleneck, identity shortcut", 32, {8, 8, 32}, 1},
                        Case{"basic block, downsample, stride 2", 8, {16, 16}, 2},
                        Case{"basic block, identity shortcut", 16, {16, 16}, 1}}) {
    testing_blocks::BlockModules plain_mods(c.in, c.widths, c.stride, 21, torch::kDouble),
        fused_mods(c.in, c.widths, c.stride, 21, torch::kDouble);
    torch::manual_seed(22);
    // A conv output's statistics: off-centre, not unit scale.
    const auto x0 = (torch::rand({3, c.in, 9, 7}, torch::kDouble) * 2.0).contiguous(at::MemoryFormat::ChannelsLast);
    const auto dout = torch::randn({3, c.widths.back(), (9 - 1) / c.stride + 1, (7 - 1) / c.stride + 1}, torch::kDouble);
    auto xa = x0.clone().requires_grad_(true), xb = x0.clone().requires_grad_(true);
    const auto want = plain_mods.plain(xa);
    const auto got = models::norm_conv::forward(fused_mods.block, xb, models::norm_conv::Backend::Aten);
    ASSERT_EQ(got.sizes(), want.sizes()) << c.what;
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-10) << c.what << ": output";
    want.backward(dout);
    got.backward(dout);
    EXPECT_LE((xb.grad() - xa.grad()).abs().max().item<double>(), 1e-10) << c.what << ": d(input)";
    const auto a = plain_mods.gradients_and_buffers(), b = fused_mods.gradients_and_buffers();
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(b[i].value.defined()) << c.what << ": " << a[i].name;
      EXPECT_LE((b[i].value.to(torch::kDouble) - a[i].value.to(torch::kDouble)).abs().max().item<double>(), 1e-10)
          << c.what << ": " << a[i].name;
    }
  }
}

// kernels/bn_stats.h's arithmetic, as the CPU loops run it (the CUDA kernels share each per-element function), against
// the formulas in fp64 written out with ATen: BN finalised from sums (nn.BatchNorm2d's unbiased running variance),
// the block's closing scale-bias-add-ReLU, its backward reductions and BN's backward applied.
TEST(Models, BnStatsArithmeticMatchesTheFormulas) {
  namespace bn = kernels::bn;
  torch::manual_seed(31);
  const std::int64_t rows = 50, C = 16;
  const double m = 0.1, eps = 1e-5;
  auto f32 = [](const at::Tensor& t) { return t.to(torch::kFloat).contiguous(); };
  const auto y = torch::randn({rows, C}, torch::kDouble) * 1.5 + 0.4, yr = torch::randn({rows, C}, torch::kDouble);
  const auto gamma = torch::rand({C}, torch::kDouble) + 0.5, beta = torch::randn({C}, torch::kDouble) * 0.2;
  const auto rm0 = torch::randn({C}, torch::kDouble) * 0.1, rv0 = torch::rand({C}, torch::kDouble) + 0.5;
  // finalize
  auto sum = f32(y.sum(0)), sumsq = f32(y.square().sum(0)), g = f32(gamma), b = f32(beta), rm = f32(rm0), rv = f32(rv0);
  auto mean = torch::empty({C}), invstd = torch::empty({C}), scale = torch::empty({C}), bias = torch::empty({C});
  auto scale2 = torch::empty({C}), bias2 = torch::empty({C});
  bn::FinalizeArgs fa;
  fa.sum = sum.data_ptr<float>(), fa.sumsq = sumsq.data_ptr<float>(), fa.gamma = g.data_ptr<float>();
  fa.beta = b.data_ptr<float>(), fa.running_mean = rm.data_ptr<float>(), fa.running_var = rv.data_ptr<float>();
  fa.mean = mean.data_ptr<float>(), fa.invstd = invstd.data_ptr<float>(), fa.scale = scale.data_ptr<float>();
  fa.bias = bias.data_ptr<float>(), fa.scale_lowp = scale2.data_ptr(), fa.bias_lowp = bias2.data_ptr();
  fa.lowp = bn::Storage::Float32, fa.channels = C, fa.count = rows, fa.momentum = m, fa.eps = eps;
  bn::finalize_cpu(fa);
  const auto mu = y.mean(0), var = y.var(0, /*unbiased=*/false), is = (var + eps).rsqrt();
  auto near = [](const at::Tensor& got, const at::Tensor& want, double tol) {
    return (got.to(torch::kDouble) - want).abs().max().item<double>() <= tol * (1 + want.abs().max().item<double>());
  };
  EXPECT_TRUE(near(mean, mu, 1e-5));
  EXPECT_TRUE(near(invstd, is, 1e-4));
  EXPECT_TRUE(near(scale, gamma * is, 1e-4));
  EXPECT_TRUE(near(bias, beta - mu * gamma * is, 1e-4));
  EXPECT_TRUE(torch::equal(scale2, scale));
  EXPECT_TRUE(near(rm, (1 - m) * rm0 + m * mu, 1e-5));
  EXPECT_TRUE(near(rv, (1 - m) * rv0 + m * y.var(0, /*unbiased=*/true), 1e-5)) << "the unbiased batch variance";
  // scale-bias-add-ReLU, with a BN on the residual and without
  const auto yf = f32(y), yrf = f32(yr), rs = f32(gamma * 0.5), rb = f32(beta * 2);
  for (const bool res_bn : {true, false}) {
    auto out = torch::empty({rows, C});
    bn::AddReluArgs aa;
    aa.y = yf.data_ptr(), aa.scale = scale.data_ptr<float>(), aa.bias = bias.data_ptr<float>(), aa.residual = yrf.data_ptr();
    if (res_bn) aa.res_scale = rs.data_ptr<float>(), aa.res_bias = rb.data_ptr<float>();
    aa.out = out.data_ptr(), aa.storage = bn::Storage::Float32, aa.rows = rows, aa.channels = C;
    bn::scale_bias_add_relu_cpu(aa);
    const auto r = res_bn ? yr * (gamma * 0.5) + beta * 2 : yr;
    EXPECT_TRUE(near(out, torch::relu(y * scale.to(torch::kDouble) + bias.to(torch::kDouble) + r), 1e-5)) << res_bn;
  }
  // the ReLU's backward and BN's reductions
  const auto out = f32(torch::relu(torch::randn({rows, C}, torch::kDouble)));
  const auto dout = torch::randn({rows, C}, torch::kDouble), doutf = f32(dout);
  auto dz = torch::empty({rows, C}), dsum = torch::zeros({C}), dsx = torch::zeros({C}), dsxr = torch::zeros({C});
  const auto mr = f32(yr.mean(0)), isr = f32((yr.var(0, false) + eps).rsqrt());
  bn::ReluBackwardArgs ra;
  ra.dout = doutf.data_ptr(), ra.out = out.data_ptr(), ra.y = yf.data_ptr(), ra.mean = mean.data_ptr<float>();
  ra.invstd = invstd.data_ptr<float>(), ra.y_res = yrf.data_ptr(), ra.mean_res = mr.data_ptr<float>();
  ra.invstd_res = isr.data_ptr<float>(), ra.dz = dz.data_ptr(), ra.dsum = dsum.data_ptr<float>();
  ra.dsum_xhat = dsx.data_ptr<float>(), ra.dsum_xhat_res = dsxr.data_ptr<float>(), ra.storage = bn::Storage::Float32;
  ra.rows = rows, ra.channels = C;
  bn::relu_backward_reduce_cpu(ra);
  const auto dzd = dout * (out.to(torch::kDouble) > 0).to(torch::kDouble);
  const auto xhat = (y - mean.to(torch::kDouble)) * invstd.to(torch::kDouble);
  EXPECT_TRUE(near(dz, dzd, 1e-6));
  EXPECT_TRUE(near(dsum, dzd.sum(0), 1e-5));
  EXPECT_TRUE(near(dsx, (dzd * xhat).sum(0), 1e-5));
  EXPECT_TRUE(near(dsxr, (dzd * (yr - mr.to(torch::kDouble)) * isr.to(torch::kDouble)).sum(0), 1e-5));
  // BN's backward applied, against autograd through batch_norm in fp64
  auto yg = y.clone().requires_grad_(true);
  auto gg = gamma.clone().requires_grad_(true);
  torch::batch_norm(yg.t().unsqueeze(0).unsqueeze(-1), gg, beta, {}, {}, true, 0.1, eps, false)
      .squeeze(-1).squeeze(0).t().backward(dzd);
  auto dy = torch::empty({rows, C});
  const auto dzf = f32(dzd);
  bn::DbnApplyArgs da;
  da.dz = dzf.data_ptr(), da.y = yf.data_ptr(), da.gamma = g.data_ptr<float>(), da.mean = mean.data_ptr<float>();
  da.invstd = invstd.data_ptr<float>(), da.dsum = dsum.data_ptr<float>(), da.dsum_xhat = dsx.data_ptr<float>();
  da.dy = dy.data_ptr(), da.storage = bn::Storage::Float32, da.rows = rows, da.channels = C, da.count = rows;
  bn::dbn_apply_cpu(da);
  EXPECT_TRUE(near(dy, yg.grad(), 1e-4));
  EXPECT_TRUE(near(dsx, gg.grad(), 1e-4)) << "d(gamma) = sum(dz * xhat)";
}

// Each cuDNN graph of ResNet-50's convolutions (the shapes of its four stages, the strided ones included) is one
// cuDNN takes: validated and lowered to its operation graph, which cuDNN 9.8 and later do without a GPU. Whether an
// engine runs it is the GPU's to say (Gpu.NormConv*).
TEST(Models, NormConvGraphsAreValidCudnnGraphs) {
  using models::norm_conv::ConvGeometry;
  std::vector<ConvGeometry> shapes;
  auto add = [&](std::int64_t c, std::int64_t hw, std::int64_t k, std::int64_t r, std::int64_t stride, at::ScalarType t) {
    ConvGeometry g;
    g.n = 32, g.c = c, g.h = hw, g.w = hw, g.k = k, g.r = r, g.s = r, g.stride = stride, g.pad = r / 2, g.dtype = t;
    shapes.push_back(g);
  };
  for (const auto t : {at::kHalf, at::kBFloat16}) {
    add(64, 56, 64, 1, 1, t);     // layer1: 1x1 reduce
    add(64, 56, 64, 3, 1, t);     // layer1: 3x3
    add(64, 56, 256, 1, 1, t);    // layer1: 1x1 expand
    add(256, 56, 128, 1, 1, t);   // layer2.0: 1x1 at the input's resolution
    add(128, 56, 128, 3, 2, t);   // layer2.0: the strided 3x3 (v1.5)
    add(256, 56, 512, 1, 2, t);   // layer2.0: the strided downsample
    add(1024, 14, 512, 1, 1, t);  // layer4.0
    add(512, 7, 2048, 1, 1, t);   // layer4: expand
  }
  for (const auto& g : shapes) EXPECT_EQ(models::norm_conv::check_graphs(g), "") << g.str();
  // A graph cuDNN must refuse is refused, each of the four, for what is wrong with it: a kernel of zero rows, whose
  // output size no spatial dimension can give (CUDNN_STATUS_BAD_PARAM from its spatial-dimension check).
  ConvGeometry bad = shapes.front();
  bad.r = 0;
  const auto why = models::norm_conv::check_graphs(bad);
  for (const char* graph : {"conv+genstats: ", "scale-bias-relu+conv+genstats: ", "dgrad+drelu+dbn_weight: ",
                            "scale-bias-relu+wgrad: "}) {
    const auto at = why.find(graph);
    ASSERT_NE(at, std::string::npos) << graph << " was not refused: " << why;
    const auto part = why.substr(at, why.find("; ", at) - at);
    EXPECT_NE(part.find("is_valid_spatial_dim"), std::string::npos) << part;
    EXPECT_NE(part.find("CUDNN_STATUS_BAD_PARAM"), std::string::npos) << part;
  }
}

// cuDNN (the wheels' 9.24) plans every graph of a ResNet-50 and a ResNet-18 training step at batch 256 in fp16
// for an H100, without one: heuristics, support check and plan build, deviceless. The GPU machine's cuDNN (9.19)
// may choose other engines; whether they run is the GPU's to say. In bfloat16 it finds none: why the plan refuses
// NormConv there.
TEST(Models, NormConvPlansBuildForAnH100) {
  using models::norm_conv::ConvGeometry;
  struct Case {
    std::int64_t c, hw, k, r, stride;
    bool prologue;
  };
  const std::vector<Case> cases{
      {256, 56, 64, 1, 1, false},   // layer1.1.conv1: reads the block's input as it is
      {64, 56, 64, 3, 1, true},     // layer1.x.conv2: BN1 + ReLU as its prologue
      {64, 56, 256, 1, 1, true},    // layer1.x.conv3
      {128, 56, 128, 3, 2, true},   // layer2.0.conv2: the strided 3x3 (v1.5)
      {256, 56, 512, 1, 2, false},  // layer2.0's downsample
      {512, 7, 2048, 1, 1, true},   // layer4.x.conv3
      {64, 56, 128, 3, 2, false},   // ResNet-18 layer2.0.conv1
      {128, 28, 128, 3, 1, true},   // ResNet-18 layer2.0.conv2
  };
  for (const auto& c : cases) {
    ConvGeometry g;
    g.n = 256, g.c = c.c, g.h = c.hw, g.w = c.hw, g.k = c.k, g.r = c.r, g.s = c.r, g.stride = c.stride, g.pad = c.r / 2;
    g.dtype = at::kHalf;
    EXPECT_EQ(models::norm_conv::check_plans(g, c.prologue, test::kH100, 90), "") << g.str();
  }
  ConvGeometry bf16;
  bf16.n = 256, bf16.c = 64, bf16.h = 56, bf16.w = 56, bf16.k = 64, bf16.r = 3, bf16.s = 3, bf16.pad = 1;
  bf16.dtype = at::kBFloat16;
  EXPECT_NE(models::norm_conv::check_plans(bf16, true, test::kH100, 90), "") << "cuDNN found bf16 engines: lift the refusal";
}

// Which path each residual block can train on (models::FusionTunable::path_refusal) and which one it runs before any
// timing (set_default_paths), named with why the others are not taken.
TEST(Models, BlockPathsNameEveryBlockAndWhy) {
  using models::FusionMode;
  using models::FusionPath;
  models::ShapesOnly shapes_only;
  ModelOptions listing;
  listing.initialize = false;
  models::FusedBnContext gpu;
  gpu.cuda = true;
  gpu.dtype = torch::kHalf;
  auto able = [](torch::nn::Module& model, FusionPath p, const models::FusedBnContext& c) {
    int n = 0;
    for (const auto& [name, block] : models::tunable_blocks(model)) n += block->path_refusal(p, c).empty() ? 1 : 0;
    return n;
  };
  auto first = [](torch::nn::Module& model, FusionPath p, const models::FusedBnContext& c) {
    return models::tunable_blocks(model).front().second->path_refusal(p, c);
  };
  auto resnet50 = build_model(find_architecture("resnet50"), listing);
  const auto blocks = models::tunable_blocks(*resnet50);
  ASSERT_EQ(blocks.size(), 16u);
  EXPECT_EQ(blocks.front().first, "layer1.0");
  EXPECT_EQ(blocks.back().first, "layer4.2");
  for (const auto p : models::all_fusion_paths()) EXPECT_EQ(able(*resnet50, p, gpu), 16) << models::path_name(p);
  auto resnet18 = build_model(find_architecture("resnet18"), listing);
  EXPECT_EQ(able(*resnet18, FusionPath::NormConv, gpu), 8);
  auto resnext = build_model(find_architecture("resnext50_32x4d"), listing);
  EXPECT_EQ(able(*resnext, FusionPath::NormConv, gpu), 0);
  EXPECT_EQ(able(*resnext, FusionPath::BnFold, gpu), 16);
  EXPECT_NE(first(*resnext, FusionPath::NormConv, gpu).find("grouped convolution (ResNeXt)"), std::string::npos);
  auto se = build_model(find_architecture("se_resnext101_32x4d"), listing);
  EXPECT_NE(first(*se, FusionPath::NormConv, gpu).find("SE gate"), std::string::npos);
  EXPECT_EQ(first(*se, FusionPath::Bn, gpu), "");

  auto c = gpu;
  c.mode = FusionMode::Bn;
  EXPECT_EQ(first(*resnet50, FusionPath::NormConv, c), "--fusion bn");
  c.mode = FusionMode::None;
  EXPECT_EQ(first(*resnet50, FusionPath::Bn, c), "--fusion none");
  EXPECT_EQ(first(*resnet50, FusionPath::NormConv, c), "--fusion none");
  EXPECT_EQ(first(*resnet50, FusionPath::Unfused, c), "");
  c = gpu, c.dtype = torch::kFloat;
  EXPECT_NE(first(*resnet50, FusionPath::BnFold, c).find("fp32 activations"), std::string::npos);
  c.dtype = torch::kBFloat16;
  EXPECT_EQ(first(*resnet50, FusionPath::NormConv, c), "bfloat16 (cuDNN's fused convolution engines take fp16)");
  EXPECT_EQ(first(*resnet50, FusionPath::Bn, c), "");
  // Part 2's probe is not part 3's: a cuDNN that refused the fused BN kernels may still run the graphs.
  c = gpu, c.cudnn_refusal = "cuDNN 91900 refused bfloat16: CUDNN_STATUS_NOT_SUPPORTED";
  EXPECT_EQ(first(*resnet50, FusionPath::Bn, c), c.cudnn_refusal);
  EXPECT_EQ(able(*resnet50, FusionPath::NormConv, c), 16);

  // Before timing: auto takes the verified fused path (NormConv's numerics are not), a forced mode its own.
  EXPECT_NE(models::unverified(FusionPath::NormConv, torch::kHalf), "");
  EXPECT_EQ(models::set_default_paths(*resnet50, gpu), 16);
  EXPECT_EQ(models::describe_block_paths(*resnet50, gpu), "16 of 16 residual blocks fused: 16 bn");
  c = gpu, c.mode = FusionMode::NormConv;
  EXPECT_EQ(models::set_default_paths(*resnet50, c), 16);
  EXPECT_EQ(models::describe_block_paths(*resnet50, c), "16 of 16 residual blocks fused: 16 normconv");
  c.mode = FusionMode::None;
  EXPECT_EQ(models::set_default_paths(*resnet50, c), 0);
  EXPECT_EQ(models::describe_block_paths(*resnet50, c),
            "0 of 16 residual blocks fused; unfused: 16 for --fusion none (layer1.0, ...)");
  c = gpu, c.cuda = false;
  EXPECT_EQ(models::set_default_paths(*resnext, c), 0);
  EXPECT_EQ(models::describe_block_paths(*resnext, c),
            "0 of 16 residual blocks fused; unfused: 16 for not on CUDA (layer1.0, ...)");
  c = gpu, c.mode = FusionMode::NormConv;
  EXPECT_EQ(models::set_default_paths(*resnext, c), 0) << "NormConv forced where it cannot run: unfused, not Bn";
  EXPECT_EQ(models::describe_block_paths(*build_model(find_architecture("gpunet-0"), listing), gpu), "");

  // The ranks of a data-parallel run agree through this tensor.
  models::set_default_paths(*resnet50, gpu);
  auto paths = models::block_paths(*resnet50);
  paths[3] = static_cast<std::int64_t>(FusionPath::BnFold);
  models::set_block_paths(*resnet50, paths);
  EXPECT_EQ(models::tunable_blocks(*resnet50)[3].second->path(), FusionPath::BnFold);
  EXPECT_TRUE(torch::equal(models::block_paths(*resnet50), paths));
  EXPECT_THROW(models::set_block_paths(*resnet50, paths.narrow(0, 0, 15)), Error);
  paths[0] = 9;
  EXPECT_THROW(models::set_block_paths(*resnet50, paths), Error);
  EXPECT_THROW(models::parse_fusion_mode("fast"), Error);
  EXPECT_EQ(models::parse_fusion_mode("normconv"), FusionMode::NormConv);
}

// A stand-in for the cuDNN backend: says no to every conv (so conv_bn_act computes the ops) or yes with a sentinel
// output, counting what it was asked.
class FakeConvBackend : public models::FusedConvBackend {
 public:
  explicit FakeConvBackend(bool accept) : accept_(accept) {}
  std::string refusal(const models::Conv2dImpl&, const at::Tensor&, models::Activation act,
                      const at::Tensor& residual) const override {
    ++asked;
    last_act = act, last_residual = residual.defined();
    return accept_ ? "" : "the fake backend says no";
  }
  at::Tensor forward(const models::Conv2dImpl&, const at::Tensor& x, models::Activation, const at::Tensor&) const override {
    return torch::full({1}, 42.0, x.options());
  }
  mutable int asked = 0;
  mutable models::Activation last_act = models::Activation::None;
  mutable bool last_residual = false;

 private:
  bool accept_;
};

// Removes an installed backend at the end of a test, whatever it asserted.
struct ConvBackendScope {
  explicit ConvBackendScope(const models::FusedConvBackend* b) { models::install_fused_conv_backend(b); }
  ~ConvBackendScope() { models::install_fused_conv_backend(nullptr); }
};

// conv_bn_act is act(bn(conv(x)) [+ residual]) on every path that is not cuDNN's, and asks its backend only where
// the fused graph applies: in inference, with the BN folded and the conv's fused path switched on.
TEST(Models, ConvBnActIsTheOpsItNames) {
  using models::Activation;
  torch::manual_seed(7);
  models::Conv2d conv(torch::nn::Conv2dOptions(8, 16, 3).padding(1).bias(false));
  models::BatchNorm2d bn(16);
  {
    torch::NoGradGuard no_grad;
    bn->running_mean.uniform_(-1, 1), bn->running_var.uniform_(0.5, 2), bn->weight.uniform_(0.5, 1.5);
    bn->bias.uniform_(-1, 1);
  }
  conv->eval(), bn->eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, 8, 6, 6}), r = torch::randn({2, 16, 6, 6});
  for (const auto act : {Activation::None, Activation::ReLU, Activation::SiLU}) {
    for (const bool res : {false, true}) {
      auto want = bn(conv(x));
      if (res) want = want + r;
      want = act == Activation::ReLU ? torch::relu(want) : act == Activation::SiLU ? torch::silu(want) : want;
      EXPECT_TRUE(torch::allclose(models::conv_bn_act(*conv, *bn, x, act, res ? r : torch::Tensor()), want, 1e-5, 1e-5))
          << static_cast<int>(act) << " " << res;
    }
  }
  const auto unfolded = models::conv_bn_act(*conv, *bn, x, Activation::SiLU, r);
  auto [w, b] = fold_conv_bn(*conv, *bn);
  conv->weight.copy_(w);
  conv->set_bias(b);
  bn->set_folded();
  FakeConvBackend no(false), yes(true);
  {
    ConvBackendScope scope(&yes);
    EXPECT_TRUE(torch::allclose(models::conv_bn_act(*conv, *bn, x, Activation::SiLU, r), unfolded, 1e-4, 1e-4));
    EXPECT_EQ(yes.asked, 0) << "fused inference is off until the engine turns it on";
    models::set_fused_inference(*conv, true);
    conv->train();
    models::conv_bn_act(*conv, *bn, x, Activation::SiLU, r);
    EXPECT_EQ(yes.asked, 0) << "not in training";
    conv->eval();
    EXPECT_EQ(models::conv_bn_act(*conv, *bn, x, Activation::SiLU, r).item<double>(), 42.0);
    EXPECT_EQ(yes.asked, 1);
    EXPECT_EQ(yes.last_act, Activation::SiLU);
    EXPECT_TRUE(yes.last_residual);
    EXPECT_TRUE(conv->fused_ran);
    EXPECT_EQ(models::describe_fused_convs(*conv), "");  // a module's own self is not among its named children
  }
  {
    ConvBackendScope scope(&no);
    models::set_fused_inference(*conv, true);
    EXPECT_TRUE(torch::allclose(models::conv_bn_act(*conv, *bn, x, Activation::SiLU, r), unfolded, 1e-4, 1e-4));
    models::conv_bn_act(*conv, *bn, x, Activation::SiLU, r);
    EXPECT_EQ(no.asked, 1) << "a refusal is asked once per conv";
    EXPECT_EQ(conv->fused_failure, "the fake backend says no");
  }
}

// What a conv's options allow of the fused graph, before cuDNN is asked; and the graph it would be.
TEST(Models, FusedConvShapeRefusalNamesWhatItCannotFuse) {
  using models::Activation;
  using torch::nn::Conv2dOptions;
  models::norm_conv::ConvAct c;
  auto refusal = [&](const models::Conv2dImpl& conv, at::ScalarType t = at::kHalf) {
    return models::fused_conv_shape_refusal(conv, {4, 32, 28, 28}, t, Activation::ReLU, true, c);
  };
  models::Conv2d plain(Conv2dOptions(32, 64, 3).stride(2).padding(1).bias(false));
  ASSERT_EQ(refusal(*plain), "");
  EXPECT_EQ(c.g.str(), "3x3/2 32->64 at 28x28, batch 4, fp16");
  EXPECT_EQ(c.g.pad, 1);
  EXPECT_EQ(c.act, Activation::ReLU);
  EXPECT_TRUE(c.residual);
  EXPECT_EQ(refusal(*plain, at::kBFloat16), "");
  EXPECT_NE(refusal(*plain, at::kFloat).find("fp32 activations"), std::string::npos) << refusal(*plain, at::kFloat);
  EXPECT_NE(refusal(*models::Conv2d(Conv2dOptions(32, 32, 3).groups(32))).find("grouped"), std::string::npos);
  EXPECT_NE(refusal(*models::Conv2d(Conv2dOptions(32, 32, 3).dilation(2))).find("dilated"), std::string::npos);
  EXPECT_NE(refusal(*models::Conv2d(Conv2dOptions(32, 32, {1, 3}))).find("not square"), std::string::npos);
  EXPECT_NE(refusal(*models::Conv2d(Conv2dOptions(32, 32, 3).padding({1, 0}))).find("symmetric"), std::string::npos);
  EXPECT_NE(refusal(*models::Conv2d(Conv2dOptions(32, 32, 3).padding(1).padding_mode(torch::kReflect))).find("zeros"),
            std::string::npos);
  EXPECT_NE(refusal(*models::Conv2dSame(Conv2dOptions(32, 32, 3).stride(2))).find("SAME"), std::string::npos);
  EXPECT_EQ(refusal(*models::Conv2dSame(Conv2dOptions(32, 32, 3))), "") << "stride 1: a fixed padding of 1";
  EXPECT_NE(refusal(*models::Conv2d(Conv2dOptions(16, 32, 3))).find("32 input channels for a conv of 16"), std::string::npos);
}

// Every conv+BN of ResNet-50 and GPUNet-0 reaches conv_bn_act with its epilogue, and cuDNN (the wheels' 9.24)
// plans the fused graph of each one its options allow for an H100 at batch 1 in fp16, without one; the others are
// named. Whether the engines run is the GPU's to say (Gpu.InferenceFusedConv*).
TEST(Models, FusedConvPlansBuildForAnH100) {
  using models::Activation;
  struct Site {
    std::string refusal;  // the options' refusal, else cuDNN's deviceless planning's ("" when it plans)
    Activation act;
    bool residual;
  };
  class Planner : public models::FusedConvBackend {
   public:
    std::string refusal(const models::Conv2dImpl& conv, const at::Tensor& x, Activation act,
                        const at::Tensor& residual) const override {
      models::norm_conv::ConvAct c;
      auto why = models::fused_conv_shape_refusal(conv, x.sizes(), at::kHalf, act, residual.defined(), c);
      if (why.empty()) why = models::norm_conv::check_conv_act_plans(c, test::kH100, 90);
      sites[&conv] = {why, act, residual.defined()};
      return "planned";  // the ops compute the pass
    }
    at::Tensor forward(const models::Conv2dImpl&, const at::Tensor&, Activation, const at::Tensor&) const override {
      throw std::logic_error("the planner runs nothing");
    }
    mutable std::map<const models::Conv2dImpl*, Site> sites;
  };
  for (const std::string arch : {"resnet50", "gpunet-0"}) {
    ModelOptions listing;
    listing.initialize = false;
    auto model = [&] {
      models::ShapesOnly shapes_only;
      return build_model(find_architecture(arch), listing);
    }();
    model->eval();
    const int pairs = fold_batchnorm(*model);
    models::set_fused_inference(*model, true);
    Planner planner;
    ConvBackendScope scope(&planner);
    const int side = find_architecture(arch).preprocessing.input_size;
    torch::NoGradGuard no_grad;
    model->forward(torch::zeros({1, 3, side, side}));
    ASSERT_EQ(static_cast<int>(planner.sites.size()), pairs) << arch << ": every folded conv+BN went through conv_bn_act";
    int planned = 0, relu = 0, silu = 0, residual = 0, grouped = 0, silu_runtime = 0, stem = 0;
    for (const auto& item : model->named_modules()) {
      const auto* conv = dynamic_cast<const models::Conv2dImpl*>(item.value().get());
      if (!conv || !planner.sites.count(conv)) continue;
      const auto& site = planner.sites.at(conv);
      EXPECT_EQ(conv->fused_failure, "planned") << item.key();
      relu += site.act == Activation::ReLU, silu += site.act == Activation::SiLU, residual += site.residual;
      if (site.refusal.empty()) {
        ++planned;
      } else if (conv->options.groups() > 1) {
        ++grouped;
        EXPECT_NE(site.refusal.find("a grouped convolution"), std::string::npos) << item.key() << ": " << site.refusal;
      } else if (conv->options.in_channels() == 3) {
        // The stem reads the image's 3 channels, 6 bytes of fp16 a pixel: cuDNN's fused engines need channels in
        // whole 4- or 16-byte words, so it runs unfused (as on the H100 of 2026-11-27: "the head's" input). The
        // cuDNN of LibTorch 2.14 says it in words; the GPU machine's (LibTorch 2.11) names its own check.
        ++stem;
        EXPECT_TRUE(site.refusal.find("input channel count must be") != std::string::npos ||
                    site.refusal.find("!is_input_channel_count_128bit_aligned") != std::string::npos)
            << item.key() << ": " << site.refusal;
      } else if (site.act == Activation::SiLU) {
        // SiLU's engines are compiled at run time (NVRTC needs the driver), so only the GPU builds them: here cuDNN
        // must offer them and refuse them for that alone, not for the graph's shape or pattern.
        ++silu_runtime;
        EXPECT_NE(site.refusal.find("RUNTIME_PREREQUISITE_MISSING"), std::string::npos)
            << arch << " " << item.key() << ": no sm90 engine offered: " << site.refusal;
        EXPECT_EQ(test::graph_refusals(site.refusal), std::vector<std::string>{}) << arch << " " << item.key();
      } else {
        // cuDNN's precompiled conv+bias(+add)+ReLU engines plan here.
        ADD_FAILURE() << arch << " " << item.key() << ": " << site.refusal;
      }
    }
    std::cout << arch << ": " << planned << " of " << pairs << " planned deviceless, " << grouped << " grouped, "
              << silu << " with SiLU\n";
    if (arch == "resnet50") {
      EXPECT_EQ(pairs, 53);
      EXPECT_EQ(relu, 49) << "the stem and each block's three; the downsamples have none";
      EXPECT_EQ(residual, 16) << "each block's last conv takes the shortcut";
      EXPECT_EQ(planned, 53);
      EXPECT_EQ(models::describe_fused_convs(*model), "cuDNN conv+bias+act: 0 of 53 convs; unfused: conv1 and 52 more (planned)");
    } else {
      EXPECT_EQ(grouped, 5) << "GPUNet-0's five inverted residuals' depthwise convs";
      EXPECT_GT(silu, 0);
      EXPECT_GT(residual, 0);
      EXPECT_EQ(stem, 1);
      EXPECT_EQ(planned + silu_runtime + stem, pairs - grouped)
          << "every ungrouped conv past the stem planned, or only the driver missing";
    }
  }
}

TEST(Models, ShapesOnlyBuildsTheSameNetworkWithZeros) {
  for (const char* name : {"resnext50_32x4d", "se_resnext101_32x4d", "gpunet-0", "tf_efficientnet_b2"}) {
    const auto& arch = find_architecture(name);
    ModelOptions listing;  // as describe_architectures builds them: no initialisation of convnets' own
    listing.initialize = false;
    auto normal = build_model(arch, listing);
    auto zeros = [&] {
      models::ShapesOnly shapes_only;
      return build_model(arch, listing);
    }();
    const auto a = normal->named_parameters(), b = zeros->named_parameters();
    ASSERT_EQ(a.size(), b.size()) << name;
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].key(), b[i].key()) << name;
      EXPECT_EQ(a[i].value().sizes(), b[i].value().sizes()) << name << " " << a[i].key();
    }
    const auto ma = normal->modules(), mb = zeros->modules();
    ASSERT_EQ(ma.size(), mb.size()) << name;
    int convs = 0;
    for (std::size_t i = 0; i < ma.size(); ++i) {
      auto ca = std::dynamic_pointer_cast<torch::nn::Conv2dImpl>(ma[i]);
      auto cb = std::dynamic_pointer_cast<torch::nn::Conv2dImpl>(mb[i]);
      ASSERT_EQ(ca == nullptr, cb == nullptr) << name << " module " << i;
      if (!ca) continue;
      ++convs;
      const auto &oa = ca->options, &ob = cb->options;
      EXPECT_EQ(std::make_tuple(oa.in_channels(), oa.out_channels(), oa.groups(), *oa.kernel_size(), *oa.stride(),
                                *oa.dilation(), oa.bias()),
                std::make_tuple(ob.in_channels(), ob.out_channels(), ob.groups(), *ob.kernel_size(), *ob.stride(),
                                *ob.dilation(), ob.bias()))
          << name << " conv " << i;
      EXPECT_EQ(cb->weight.abs().sum().item<double>(), 0.0) << name << " conv " << i;
      EXPECT_GT(ca->weight.abs().sum().item<double>(), 0.0) << name << " conv " << i;
    }
    EXPECT_GT(convs, 10) << name;
    const int size = arch.preprocessing.input_size;
    EXPECT_EQ(count_macs(*zeros, size), count_macs(*normal, size)) << name;
  }
  auto after = build_model(find_architecture("resnet18"), {});
  EXPECT_GT(after->named_parameters()["conv1.weight"].abs().sum().item<double>(), 0.0) << "ShapesOnly outlived its scope";
}

TEST(Models, NumClassesSetsTheClassifier) {
  auto net = build_model(find_architecture("resnet18"), classes(7));
  const auto sd = state_dict(*net);
  EXPECT_EQ(sd.back().first, "fc.bias");
  EXPECT_EQ(sd.back().second.sizes().vec(), std::vector<int64_t>{7});
  torch::NoGradGuard no_grad;
  net->eval();
  EXPECT_EQ(net->forward(torch::randn({3, 3, 64, 64})).sizes().vec(), (std::vector<int64_t>{3, 7}));
}

TEST(Models, ZeroInitResidualZeroesTheLastBnOfEveryBlockOnly) {
  for (const char* name : {"resnet18", "resnet50"}) {
    const std::string last = std::string(name) == "resnet18" ? ".bn2.weight" : ".bn3.weight";
    ModelOptions o;
    o.zero_init_residual = true;
    auto net = build_model(find_architecture(name), o);
    int zeroed = 0;
    for (const auto& [key, t] : state_dict(*net)) {
      const bool is_last = key.size() > last.size() && key.compare(key.size() - last.size(), last.size(), last) == 0;
      if (key.find(".bn") == std::string::npos && key.find("downsample.1.weight") == std::string::npos) continue;
      if (key.find("weight") == std::string::npos) continue;
      if (is_last) {
        EXPECT_EQ(t.abs().sum().item<double>(), 0.0) << key;
        ++zeroed;
      } else {
        EXPECT_TRUE(t.eq(1).all().item<bool>()) << key;
      }
    }
    EXPECT_EQ(zeroed, std::string(name) == "resnet18" ? 8 : 16) << name;
  }
}

// kaiming_normal_ with relu gain: std = sqrt(2 / fan); fan_in = C_in*k*k, fan_out = C_out*k*k.
TEST(Models, ConvInitFollowsTheChosenFanMode) {
  for (auto mode : {ConvInit::FanIn, ConvInit::FanOut}) {
    torch::manual_seed(0);
    ModelOptions o;
    o.conv_init = mode;
    auto net = build_model(find_architecture("resnet50"), o);
    // layer4.0.conv1.weight is [512, 1024, 1, 1]: fan_in 1024, fan_out 512.
    for (const auto& [key, t] : state_dict(*net)) {
      if (key != "layer4.0.conv1.weight") continue;
      const double fan = mode == ConvInit::FanIn ? 1024 : 512;
      EXPECT_NEAR(t.std().item<double>(), std::sqrt(2.0 / fan), 0.02 * std::sqrt(2.0 / fan));
    }
  }
}

TEST(Models, UnknownArchListsTheValidOnes) {
  try {
    find_architecture("resnet5O");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("resnet5O"), std::string::npos);
    for (const auto& name : architecture_names()) EXPECT_NE(e.hint().find(name), std::string::npos) << name;
  }
}

TEST(Models, NonPositiveNumClassesIsRejected) {
  for (int64_t n : {0, -3}) {
    try {
      build_model(find_architecture("resnet18"), classes(n));
      FAIL() << "expected an error for " << n;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--num-classes"), std::string::npos) << e.what();
    }
  }
}

TEST(Models, EveryArchRunsForwardAndBackward) {
  for (const auto& arch : architectures()) {
    if (arch.name != "resnet18" && arch.name != "se_resnext101_32x4d") continue;  // one basic, one SE bottleneck
    auto net = build_model(arch, classes(5));
    net->train();
    auto y = net->forward(torch::randn({2, 3, 64, 64}));
    y.sum().backward();
    for (const auto& p : net->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << arch.name << ": no gradient for " << p.key();
    }
  }
}

// He et al. 2015 sec. 4.2: 6n+1 3x3 convs and one fc, stages at 32, 16 and 8 px
// of 16, 32 and 64 channels for a 32 px input, no max-pool.
TEST(SmallInputResNet, LayoutFollowsHeEtAlSection42) {
  for (int n : {1, 3, 9}) {
    const auto& arch = find_architecture("resnet" + std::to_string(6 * n + 2));
    EXPECT_EQ(arch.preprocessing.input_size, 32);
    auto net = build_model(arch, classes(10));
    int convs3x3 = 0;
    for (const auto& p : net->named_parameters()) {
      if (p.value().dim() == 4 && p.value().size(2) == 3) ++convs3x3;
    }
    EXPECT_EQ(convs3x3, 6 * n + 1) << arch.name;
    torch::NoGradGuard no_grad;
    net->eval();
    EXPECT_EQ(net->forward(torch::randn({2, 3, 32, 32})).sizes().vec(), (std::vector<int64_t>{2, 10}));
    EXPECT_EQ(net->forward(torch::randn({1, 3, 28, 28})).sizes().vec(), (std::vector<int64_t>{1, 10}));
    // The last stage sees 8x8 at 32 px: its weight is [64, 64, 3, 3].
    EXPECT_EQ(net->named_parameters()["layer3." + std::to_string(n - 1) + ".conv2.weight"].sizes().vec(),
              (std::vector<int64_t>{64, 64, 3, 3}));
  }
}

// ResNet-10s: the stem alone at full resolution (layer1 is empty), then four
// stride-2 stages of one BasicBlock at 32..256 channels: 1 + 4 x 2 3x3 convs.
TEST(SmallInputResNet, ResNet10sKeepsOnlyTheStemAtFullResolution) {
  const auto& arch = find_architecture("resnet10s");
  auto net = build_model(arch, classes(10));
  int convs3x3 = 0;
  std::int64_t params = 0;
  for (const auto& p : net->named_parameters()) {
    EXPECT_NE(p.key().rfind("layer1.", 0), 0u) << p.key();
    if (p.value().dim() == 4 && p.value().size(2) == 3) ++convs3x3;
    params += p.value().numel();
  }
  EXPECT_EQ(convs3x3, 9);
  EXPECT_EQ(params, 1224474);  // 10 classes (torchvision BasicBlocks, 1x1 projections)
  EXPECT_EQ(net->named_parameters()["layer2.0.conv1.weight"].sizes().vec(), (std::vector<int64_t>{32, 16, 3, 3}));
  EXPECT_EQ(net->named_parameters()["layer5.0.conv2.weight"].sizes().vec(), (std::vector<int64_t>{256, 256, 3, 3}));
  net->train();
  auto y = net->forward(torch::randn({2, 3, 28, 28}));
  EXPECT_EQ(y.sizes().vec(), (std::vector<int64_t>{2, 10}));
  y.sum().backward();
  for (const auto& p : net->named_parameters()) ASSERT_TRUE(p.value().grad().defined()) << p.key();
}

}  // namespace
}  // namespace convnets

namespace convnets {
namespace {

// A network with a layer the exporter has no op for: the error names it and nothing is written.
class UnexportableNet : public NetworkImpl {
 public:
  UnexportableNet() {
    seq = register_module("net", torch::nn::Sequential(models::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)),
                                                       torch::nn::Tanh()));
  }
  torch::Tensor forward(torch::Tensor x) override { return seq->forward(x); }
  std::string emit(GraphEmitter& g, const std::string& input) override {
    return emit_sequential(g, *seq, input, "head.net");
  }
  torch::nn::Sequential seq{nullptr};
};

TEST(Export, ALayerTheGraphCannotExpressIsNamedAndNothingIsWritten) {
  if (!onnx_export_available()) GTEST_SKIP() << "this build has no ONNX (libonnx-dev)";
  UnexportableNet net;
  const auto path = (std::filesystem::temp_directory_path() / "convnets_unexportable.onnx").string();
  std::filesystem::remove(path);
  try {
    export_onnx(net, OnnxOptions{}, path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer head.net.1 (torch::nn::TanhImpl) cannot be expressed"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace convnets

namespace convnets {
namespace {

// fold_batchnorm: every BN of these archs follows a conv; the folded network
// computes the same logits (to fp32 rounding) and refuses to train.
TEST(Export, FoldingBatchNormKeepsTheLogits) {
  for (const char* name : {"resnet50", "resnet10s", "gpunet-0", "gpunet-d1"}) {
    torch::manual_seed(21);
    auto net = build_model(find_architecture(name), {});
    int bns = 0;
    {
      torch::NoGradGuard no_grad;
      for (auto& m : net->modules(false)) {
        if (auto* bn = m->as<models::BatchNorm2dImpl>()) {
          const auto var = torch::rand_like(bn->running_var) + 0.5;
          bn->running_var.copy_(var);
          bn->running_mean.normal_(0, 0.2);
          bn->bias.normal_(0, 0.1);
          bn->weight.copy_(var.sqrt() * (0.7 + 0.2 * torch::rand_like(var)));
          ++bns;
        }
      }
    }
    net->eval();
    torch::NoGradGuard no_grad;
    const auto x = torch::randn({2, 3, 64, 64});
    const auto before = net->forward(x);
    EXPECT_EQ(fold_batchnorm(*net), bns) << name;
    const auto after = net->forward(x);
    EXPECT_LT(test::max_relative_error(after, before), 1e-5) << name;
    EXPECT_GT(test::max_relative_error(before, torch::zeros_like(before)), 0.0);
    net->train();
    EXPECT_THROW(net->forward(x), c10::Error) << name;
  }
}

}  // namespace
}  // namespace convnets
