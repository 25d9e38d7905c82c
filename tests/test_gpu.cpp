// The CUDA training path against the CPU: fp32 step equality, amp/bf16 loss curves, the normalisation kernel, graph replay. Each skips without a GPU.
#include "data/loader.h"
#include "models/registry.h"
#include "runtime/runtime.h"
#include "train/graph_step.h"
#include "train/loss_scale.h"
#include "train/sgd.h"
#include "train/step.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <vector>

namespace convnets::train {
namespace {

using runtime::Runtime;
using runtime::network_input;
using runtime::prepare_model;
using runtime::resolve_runtime;

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: this check runs on the GPU machine (scripts/gpu.sh)"

double max_relative(const at::Tensor& a, const at::Tensor& b) {
  const auto x = a.to(torch::kCPU, torch::kDouble), y = b.to(torch::kCPU, torch::kDouble);
  return ((x - y).abs() / y.abs().clamp_min(1e-3)).max().item<double>();
}

struct Run {
  Network model;
  std::unique_ptr<Sgd> sgd;
  std::unique_ptr<LossScaler> scaler;
  Runtime rt;
};

Run make_run(const std::string& device, const std::string& precision, const std::string& arch = "resnet18") {
  Run r;
  torch::manual_seed(11);
  ModelOptions mo;
  mo.num_classes = 10;
  r.model = build_model(find_architecture(arch), mo);
  r.rt = resolve_runtime(device, precision, "nhwc");
  prepare_model(*r.model, r.rt);
  r.sgd = std::make_unique<Sgd>(*r.model, SgdOptions{0.875, false, 3.0517578125e-05, false});
  if (r.rt.loss_scaling) r.scaler = std::make_unique<LossScaler>(r.rt.device);
  return r;
}

// A learnable synthetic task: 4 fixed batches of random images with labels.
std::vector<std::pair<at::Tensor, at::Tensor>> task(int size, int batch) {
  torch::manual_seed(12);
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  for (int i = 0; i < 4; ++i) {
    out.emplace_back(torch::randint(0, 256, {batch, size, size, 3}, torch::kByte),
                     torch::randint(0, 10, {batch}, torch::kLong));
  }
  return out;
}

Preprocessing pre(int size) {
  Preprocessing p;
  p.input_size = size;
  return p;
}

// Where two copies of a network differ most (max_relative's measure), for a failure's message.
std::string worst_parameter(Network& a, Network& b) {
  double worst = -1;
  std::string where;
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& p : pa) {
    const auto x = p.value().detach().to(torch::kCPU, torch::kDouble).contiguous().flatten();
    const auto y = pb[p.key()].detach().to(torch::kCPU, torch::kDouble).contiguous().flatten();
    const auto rel = (x - y).abs() / y.abs().clamp_min(1e-3);
    const auto i = rel.argmax().item<std::int64_t>();
    if (rel[i].item<double>() > worst) {
      worst = rel[i].item<double>();
      where = p.key() + "[" + std::to_string(i) + "]: " + std::to_string(x[i].item<double>()) + " vs " +
              std::to_string(y[i].item<double>()) + " (relative " + std::to_string(worst) + ")";
    }
  }
  return where;
}

TEST(Gpu, Fp32StepEqualsTheCpuStep) {
  SKIP_WITHOUT_CUDA();
  const auto data = task(64, 16);
  StepOptions o;
  o.label_smoothing = 0.1;
  auto cpu = make_run("cpu", "fp32");
  std::vector<at::Tensor> cpu_losses;
  for (int step = 0; step < 3; ++step) {
    const auto& [images, labels] = data[static_cast<size_t>(step)];
    cpu_losses.push_back(train_step(*cpu.model, *cpu.sgd, nullptr, nullptr,
                                    {{network_input(images, pre(64), cpu.rt), labels}}, 0.1, step, o).loss);
  }
  // Three CUDA steps from the same start (resolve_runtime turns TF32 off for fp32), with cuDNN's algorithms
  // autotuned as training runs them, or chosen deterministically.
  auto cuda_run = [&](bool autotuned) {
    auto gpu = make_run("cuda", "fp32");
    at::globalContext().setBenchmarkCuDNN(autotuned);
    at::globalContext().setDeterministicCuDNN(!autotuned);
    for (int step = 0; step < 3; ++step) {
      const auto& [images, labels] = data[static_cast<size_t>(step)];
      auto lg = train_step(*gpu.model, *gpu.sgd, nullptr, nullptr,
                           {{network_input(images, pre(64), gpu.rt), labels.cuda()}}, 0.1, step, o).loss;
      EXPECT_LE(max_relative(lg, cpu_losses[static_cast<size_t>(step)]), 1e-4)
          << "loss, step " << step << (autotuned ? ", autotuned" : "");
    }
    at::globalContext().setDeterministicCuDNN(false);
    at::globalContext().setBenchmarkCuDNN(true);
    return gpu;
  };
  // The claim is the step's arithmetic: with deterministic algorithms as close as PyTorch's own CPU and CUDA fp32
  // ResNet-18 steps are (5.8e-5 by this measure, H200, 2026-11-26). The first GPU run, autotuned, was 0.36 apart
  // with the same losses; whether autotuning's algorithms (FFT, Winograd) explain that, the autotuned line below
  // tells on the next GPU run.
  auto exact = cuda_run(false);
  EXPECT_LE(max_relative(exact.sgd->flat().values(), cpu.sgd->flat().values()), 1e-4)
      << "worst parameter, cuda vs cpu: " << worst_parameter(exact.model, cpu.model);
  auto tuned = cuda_run(true);
  std::cout << "fp32, 3 steps, cuda vs cpu: deterministic cuDNN "
            << max_relative(exact.sgd->flat().values(), cpu.sgd->flat().values()) << ", autotuned "
            << max_relative(tuned.sgd->flat().values(), cpu.sgd->flat().values()) << " (worst: "
            << worst_parameter(tuned.model, cpu.model) << ")\n";
}

// Mixed precision must follow fp32 training: the mean loss of every window of
// 20 steps within 5% (relative) of fp32's over 200 steps, and the same
// decrease. A stated tolerance, not a calibrated one: it is the first GPU run
// that records how close they are (docs/PERFORMANCE.md).
TEST(Gpu, AmpAndBf16LossCurvesTrackFp32) {
  SKIP_WITHOUT_CUDA();
  const auto data = task(32, 64);
  auto curve = [&](const std::string& precision) {
    auto r = make_run("cuda", precision, "resnet8");
    StepOptions o;
    o.label_smoothing = 0.1;
    o.autocast = r.rt.autocast;
    std::vector<double> losses;
    for (int step = 0; step < 200; ++step) {
      const auto& [images, labels] = data[static_cast<size_t>(step % 4)];
      losses.push_back(train_step(*r.model, *r.sgd, r.scaler.get(), nullptr,
                                  {{network_input(images, pre(32), r.rt), labels.cuda()}}, 0.05, step, o)
                           .loss.item<double>());
    }
    return losses;
  };
  const auto fp32 = curve("fp32");
  EXPECT_LT(fp32.back(), 0.5 * fp32.front()) << "the task is learnable in fp32";
  for (const std::string precision : {"amp", "bf16"}) {
    const auto mixed = curve(precision);
    for (size_t w = 0; w < 200; w += 20) {
      double a = 0, b = 0;
      for (size_t i = w; i < w + 20; ++i) a += mixed[i], b += fp32[i];
      EXPECT_LE(std::abs(a - b) / b, 0.05) << precision << ", steps " << w << "-" << w + 19;
    }
  }
}

TEST(Gpu, NormalizeKernelMatchesTheCpuPath) {
  SKIP_WITHOUT_CUDA();
  const std::array<double, 3> mean{0.485, 0.456, 0.406}, std{0.229, 0.224, 0.225};
  auto images = torch::randint(0, 256, {3, 17, 9, 3}, torch::kByte);
  for (auto channels : {3, 1}) {
    const auto in = images.narrow(3, 0, channels).contiguous();
    for (auto format : {at::MemoryFormat::ChannelsLast, at::MemoryFormat::Contiguous}) {
      const auto ref = data::normalize_batch(in, mean, std, torch::kCPU, torch::kFloat, format);
      for (auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
        const auto x = data::normalize_batch(in, mean, std, torch::Device(torch::kCUDA, 0), dtype, format);
        EXPECT_EQ(x.scalar_type(), dtype);
        EXPECT_TRUE(x.is_contiguous(format));
        const double tol = dtype == torch::kFloat ? 1e-6 : dtype == torch::kHalf ? 2e-3 : 1e-2;
        EXPECT_LE(max_relative(x.to(torch::kFloat), ref), tol) << channels << " channels, " << dtype;
      }
    }
  }
}

TEST(Gpu, GraphReplayEqualsTheEagerStep) {
  SKIP_WITHOUT_CUDA();
  const auto data = task(32, 32);
  for (const std::string precision : {"fp32", "amp"}) {
    auto eager = make_run("cuda", precision, "resnet8"), graphed = make_run("cuda", precision, "resnet8");
    StepOptions o;
    o.label_smoothing = 0.1;
    o.autocast = eager.rt.autocast;
    std::unique_ptr<GraphedStep> g;
    for (int step = 0; step < 8; ++step) {
      const auto& [images, labels] = data[static_cast<size_t>(step % 4)];
      std::vector<MicroBatch> micro{{network_input(images, pre(32), eager.rt), labels.cuda()}};
      const double lr = 0.01 * (step + 1);
      const auto le = train_step(*eager.model, *eager.sgd, eager.scaler.get(), nullptr, micro, torch::tensor(lr).cuda(),
                                 step, o).loss.item<double>();
      if (!g) g = std::make_unique<GraphedStep>(*graphed.model, *graphed.sgd, graphed.scaler.get(), nullptr, micro, o);
      const auto lg = g->run(micro, lr).item<double>();
      EXPECT_NEAR(lg, le, 1e-4 * std::abs(le)) << precision << ", step " << step;
    }
    EXPECT_TRUE(g->captured());
    EXPECT_LE(max_relative(graphed.sgd->flat().values(), eager.sgd->flat().values()), 1e-4) << precision;
  }
}

}  // namespace
}  // namespace convnets::train
