// The CUDA training path against the CPU: fp32 step equality, amp/bf16 loss curves, the normalisation kernel, graph replay, the fused BN+ReLU and BN+add+ReLU against ATen's ops. Each skips without a GPU.
#include "data/loader.h"
#include "models/layers.h"
#include "models/registry.h"
#include "runtime/runtime.h"
#include "train/graph_step.h"
#include "train/loss_scale.h"
#include "train/sgd.h"
#include "train/step.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <sstream>
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

Run make_run(const std::string& device, const std::string& precision, const std::string& arch = "resnet18",
             bool fused_bn = false) {
  Run r;
  torch::manual_seed(11);
  ModelOptions mo;
  mo.num_classes = 10;
  r.model = build_model(find_architecture(arch), mo);
  r.rt = resolve_runtime(device, precision, "nhwc");
  prepare_model(*r.model, r.rt);
  if (fused_bn) std::cout << arch << " " << precision << ": " << runtime::set_fused_batchnorm(*r.model, r.rt, true) << "\n";
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

// ||a - b|| / ||b|| over every element: a whole network's distance. An element-wise relative measure cannot compare
// two fp32 implementations here (below).
double relative_l2(const at::Tensor& a, const at::Tensor& b) {
  const auto x = a.to(torch::kCPU, torch::kDouble), y = b.to(torch::kCPU, torch::kDouble);
  return ((x - y).norm() / y.norm()).item<double>();
}

// The claim is that the CUDA step computes the CPU step's function (the CPU step equals torch.optim.SGD's,
// test_train_reference), in IEEE fp32: TF32 off, as resolve_runtime sets it for fp32.
//
// What any two fp32 implementations of this step can agree to, measured in PyTorch itself (torchvision's
// ResNet-18, the same batches, sizes and SGD; fp32 against fp64 on the CPU, 2026-11-26): the first loss to
// 6.4e-7; the parameters' change after one step to 2.9e-3 (relative L2), after two 0.10, after three 0.27, and
// element by element (relative, floor 1e-3) 0.25 after one step and 39 after three: fp32's rounding is amplified
// (in fp64 a 1e-6 change of the input moves the two-step change by 4e-10). The first two GPU runs' element-wise
// checks of three steps (0.36, then 11.7 with deterministic cuDNN) were that amplification, not a fault.
// So: the first loss tightly (TF32 would miss it by two orders), the one-step change within 7x of fp32's own
// spread (a wrong learning rate, momentum, decay or smoothing is off by order 1), the next losses loosely.
TEST(Gpu, Fp32StepEqualsTheCpuStep) {
  SKIP_WITHOUT_CUDA();
  const auto data = task(64, 16);
  StepOptions o;
  o.label_smoothing = 0.1;
  struct Trace {
    std::vector<double> losses;
    at::Tensor start, after_one;
  };
  auto steps = [&](struct Run& r, bool cuda) {  // `struct`: inside a test, plain `Run` is testing::Test::Run
    Trace t;
    t.start = r.sgd->flat().values().to(torch::kCPU, torch::kDouble).clone();
    for (int step = 0; step < 3; ++step) {
      const auto& [images, labels] = data[static_cast<size_t>(step)];
      t.losses.push_back(train_step(*r.model, *r.sgd, nullptr, nullptr,
                                    {{network_input(images, pre(64), r.rt), cuda ? labels.cuda() : labels}}, 0.1, step,
                                    o).loss.item<double>());
      if (step == 0) t.after_one = r.sgd->flat().values().to(torch::kCPU, torch::kDouble).clone();
    }
    return t;
  };
  auto cpu_run = make_run("cpu", "fp32");
  const Trace cpu = steps(cpu_run, false);
  // cuDNN's algorithms chosen deterministically, then autotuned as training runs them (FFT, Winograd: their own
  // rounding, so only the loose bounds there).
  for (const bool autotuned : {false, true}) {
    auto gpu_run = make_run("cuda", "fp32");
    at::globalContext().setBenchmarkCuDNN(autotuned);
    at::globalContext().setDeterministicCuDNN(!autotuned);
    const Trace gpu = steps(gpu_run, true);
    at::globalContext().setDeterministicCuDNN(false);
    at::globalContext().setBenchmarkCuDNN(true);
    const std::string how = autotuned ? "autotuned cuDNN" : "deterministic cuDNN";
    ASSERT_TRUE(torch::equal(gpu.start, cpu.start)) << "the same initial weights";
    const double first = std::abs(gpu.losses[0] - cpu.losses[0]) / cpu.losses[0];
    const double change = relative_l2(gpu.after_one - gpu.start, cpu.after_one - cpu.start);
    std::cout << "fp32, cuda vs cpu, " << how << ": first loss " << first << ", one step's change " << change
              << ", losses " << gpu.losses[1] << " / " << cpu.losses[1] << ", " << gpu.losses[2] << " / "
              << cpu.losses[2] << "\n";
    if (!autotuned) EXPECT_LE(first, 1e-5) << how << ": the forward pass is not IEEE fp32 (TF32?)";
    EXPECT_LE(change, 2e-2) << how << ": the first step's change of the parameters";
    for (size_t k = 1; k < 3; ++k) {
      EXPECT_LE(std::abs(gpu.losses[k] - cpu.losses[k]) / cpu.losses[k], 1e-2) << how << ", loss " << k;
    }
  }
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

// The replayed graph runs the eager step's kernels. Each copy autotuning cuDNN for itself may pick other
// algorithms, whose rounding eight steps amplify (the second GPU run: 0.0225 apart in fp32, losses still within
// 1e-4; Fp32StepEqualsTheCpuStep says why), so both choose deterministically here.
TEST(Gpu, GraphReplayEqualsTheEagerStep) {
  SKIP_WITHOUT_CUDA();
  const auto data = task(32, 32);
  for (const std::string precision : {"fp32", "amp"}) {
    auto eager = make_run("cuda", precision, "resnet8"), graphed = make_run("cuda", precision, "resnet8");
    at::globalContext().setBenchmarkCuDNN(false);
    at::globalContext().setDeterministicCuDNN(true);
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
    at::globalContext().setDeterministicCuDNN(false);
    at::globalContext().setBenchmarkCuDNN(true);
    EXPECT_TRUE(g->captured());
    EXPECT_LE(max_relative(graphed.sgd->flat().values(), eager.sgd->flat().values()), 1e-4) << precision;
  }
}

// ---- The fused BN+ReLU and BN+add+ReLU (layers::BatchNorm2dImpl::forward_fused) against ATen's own ops ----------

// One BN layer's outputs and gradients, on the CPU in fp64.
struct BnResult {
  at::Tensor y, dx, dz, dweight, dbias, running_mean, running_var;
};

// The layer in training mode on `x` (and `z`), backward from `dy`. `fused` switches the layer's fused path; off, it
// is ATen's batch_norm, add and relu (the path every other run takes), whose autograd gives the gradients.
BnResult run_bn(const at::Tensor& x, const at::Tensor& z, const at::Tensor& dy, bool fused) {
  layers::BatchNorm2d bn(x.size(1));
  bn->to(x.device());
  {
    torch::NoGradGuard no_grad;
    bn->weight.copy_(torch::linspace(0.5, 1.5, x.size(1)));
    bn->bias.copy_(torch::linspace(-0.2, 0.3, x.size(1)));
    bn->running_mean.fill_(0.1);
    bn->running_var.fill_(2.0);
  }
  bn->set_fusion(z.defined() ? layers::BnFusion::AddRelu : layers::BnFusion::Relu);
  bn->set_fused(fused);
  bn->train();
  auto xi = x.detach().clone().requires_grad_(true);
  auto zi = z.defined() ? z.detach().clone().requires_grad_(true) : at::Tensor();
  auto y = bn->forward_fused(xi, zi);
  y.backward(dy);
  auto cpu = [](const at::Tensor& t) { return t.defined() ? t.detach().to(torch::kCPU, torch::kDouble) : t; };
  return {cpu(y), cpu(xi.grad()), zi.defined() ? cpu(zi.grad()) : at::Tensor(), cpu(bn->weight.grad()),
          cpu(bn->bias.grad()), cpu(bn->running_mean), cpu(bn->running_var)};
}

// Half-precision tolerances, stated: outputs and input gradients are fp16/bf16 tensors, so element-wise they can
// differ by a few units in the last place (fp16: 2^-11 relative; bf16: 2^-8), and where a pre-activation sits
// within rounding of 0 the two paths may take the ReLU's other side; so these compare whole tensors by relative
// L2 distance. The parameters' gradients and the running statistics are fp32 sums over N*H*W.
TEST(Gpu, FusedBnReluMatchesAtenOps) {
  SKIP_WITHOUT_CUDA();
  for (const auto dtype : {torch::kHalf, torch::kBFloat16}) {
    const std::string refusal = layers::cudnn_fused_bn_refusal(dtype);
    std::cout << (dtype == torch::kHalf ? "fp16" : "bf16") << ": cuDNN's fused BN "
              << (refusal.empty() ? "runs" : "refused: " + refusal) << "\n";
    if (dtype == torch::kHalf) ASSERT_EQ(refusal, "") << "cuDNN 9 has the fp16 kernels";
    const double data_tol = dtype == torch::kHalf ? 3e-3 : 2e-2;
    for (const auto& shape : std::vector<std::vector<std::int64_t>>{{8, 64, 14, 14}, {4, 256, 7, 7}, {2, 12, 5, 3}}) {
      for (const bool residual : {false, true}) {
        torch::manual_seed(5);
        const auto o = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
        // Not centred: a mean and scale per channel, as a conv's output has.
        const auto x = (torch::randn(shape, o.dtype(torch::kFloat)) * 1.7 + 0.3).to(dtype).contiguous(at::MemoryFormat::ChannelsLast);
        const auto z = residual ? torch::randn(shape, o).contiguous(at::MemoryFormat::ChannelsLast) : at::Tensor();
        const auto dy = torch::randn(shape, o).contiguous(at::MemoryFormat::ChannelsLast);
        const auto fused = run_bn(x, z, dy, true), ref = run_bn(x, z, dy, false);
        std::ostringstream what;
        what << dtype << " " << at::IntArrayRef(shape) << (residual ? " BN+add+ReLU" : " BN+ReLU");
        EXPECT_LE(relative_l2(fused.y, ref.y), data_tol) << what.str() << ": y";
        EXPECT_LE(relative_l2(fused.dx, ref.dx), 5 * data_tol) << what.str() << ": dx";
        if (residual) EXPECT_LE(relative_l2(fused.dz, ref.dz), data_tol) << what.str() << ": d(residual)";
        EXPECT_LE(relative_l2(fused.dweight, ref.dweight), 5 * data_tol) << what.str() << ": d(weight)";
        EXPECT_LE(relative_l2(fused.dbias, ref.dbias), data_tol) << what.str() << ": d(bias)";
        // nn.BatchNorm2d's update: momentum 0.1, the unbiased batch variance.
        EXPECT_LE(max_relative(fused.running_mean, ref.running_mean), 1e-4) << what.str() << ": running mean";
        EXPECT_LE(max_relative(fused.running_var, ref.running_var), 1e-4) << what.str() << ": running variance";
        const double n = static_cast<double>(x.numel() / x.size(1));
        const auto xd = x.to(torch::kCPU, torch::kDouble);
        const auto unbiased = xd.var({0, 2, 3}, /*unbiased=*/true);
        EXPECT_LE(max_relative(fused.running_var, 0.9 * 2.0 + 0.1 * unbiased), 1e-4)
            << what.str() << ": the running variance is the unbiased estimate (n = " << n << ")";
      }
    }
  }
}

// A ResNet-50 step in amp with the blocks fused against the same step unfused, from the same weights and batch:
// the first loss within 1e-3 (relative), the parameters' change within Fp32StepEqualsTheCpuStep's envelope (2e-2
// relative L2: a dropped ReLU, residual or gradient term is off by order 1), the running statistics likewise.
TEST(Gpu, FusedResNet50StepMatchesTheUnfusedStep) {
  SKIP_WITHOUT_CUDA();
  const auto data = task(96, 32);
  StepOptions o;
  o.label_smoothing = 0.1;
  struct Trace {
    double loss = 0;
    at::Tensor start, change, buffers;
  };
  auto step = [&](bool fused) {
    auto r = make_run("cuda", "amp", "resnet50", fused);
    // A scale that cannot overflow a fresh network's first step: a skipped step would compare nothing.
    r.scaler = std::make_unique<LossScaler>(r.rt.device, 1024.0);
    o.autocast = r.rt.autocast;
    Trace t;
    t.start = r.sgd->flat().values().to(torch::kCPU, torch::kDouble).clone();
    const auto& [images, labels] = data[0];
    t.loss = train_step(*r.model, *r.sgd, r.scaler.get(), nullptr, {{network_input(images, pre(96), r.rt), labels.cuda()}},
                        0.1, 0, o).loss.item<double>();
    t.change = r.sgd->flat().values().to(torch::kCPU, torch::kDouble) - t.start;
    std::vector<at::Tensor> buffers;
    for (const auto& b : r.model->buffers()) {
      if (b.is_floating_point()) buffers.push_back(b.to(torch::kCPU, torch::kDouble).flatten());
    }
    t.buffers = torch::cat(buffers);
    return t;
  };
  const Trace unfused = step(false), fused = step(true);
  ASSERT_TRUE(torch::equal(fused.start, unfused.start)) << "the same initial weights";
  ASSERT_GT(unfused.change.abs().max().item<double>(), 0) << "the step was taken";
  const double first = std::abs(fused.loss - unfused.loss) / unfused.loss;
  const double change = relative_l2(fused.change, unfused.change);
  const double stats = relative_l2(fused.buffers, unfused.buffers);
  std::cout << "resnet50 amp, fused vs unfused: first loss " << first << ", one step's change " << change
            << ", running statistics " << stats << "\n";
  EXPECT_LE(first, 1e-3);
  EXPECT_LE(change, 2e-2);
  EXPECT_LE(stats, 1e-3);
}

// 200 steps of a small ResNet on a learnable task, each replayed as a CUDA graph (the fused calls inside the
// capture, as `train` runs them), fused and unfused: the same loss within 2 % over the last 20 steps. Fresh images
// every step, labels a function of them with 20 % of them replaced at random: a floor the network reaches but
// cannot memorise past (about 0.94 nats), so the comparison is of the learning, not of how fast it overfits.
TEST(Gpu, FusedSmallResNetLearnsAsTheUnfusedOne) {
  SKIP_WITHOUT_CUDA();
  auto batch = [](int step) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
    const auto cls = torch::randint(0, 10, {64}, gen, torch::kLong);
    // Class c: the image's c-th band of 3 columns brightened by 60 over uniform noise.
    const auto band = torch::arange(32, torch::kLong).div(3, "floor").view({1, 1, 32, 1});
    const auto lit = band.eq(cls.view({64, 1, 1, 1})).to(torch::kLong) * 60;
    const auto images = (torch::randint(0, 196, {64, 32, 32, 3}, gen, torch::kLong) + lit).clamp(0, 255).to(torch::kByte);
    const auto noise = torch::rand({64}, gen) < 0.2;
    const auto labels = torch::where(noise, torch::randint(0, 10, {64}, gen, torch::kLong), cls);
    return std::make_pair(images, labels);
  };
  auto curve = [&](bool fused) {
    auto r = make_run("cuda", "amp", "resnet18", fused);
    StepOptions o;
    o.label_smoothing = 0.0;
    o.autocast = r.rt.autocast;
    StepRunner runner(*r.model, *r.sgd, r.scaler.get(), nullptr, o, r.rt.device, /*cuda_graph=*/true);
    std::vector<double> losses;
    for (int step = 0; step < 200; ++step) {
      const auto [images, labels] = batch(step);
      losses.push_back(runner.run({{network_input(images, pre(32), r.rt), labels.cuda()}}, 0.05, step).item<double>());
    }
    EXPECT_TRUE(runner.graphed()) << (fused ? "fused" : "unfused");
    return losses;
  };
  const auto unfused = curve(false), fused = curve(true);
  double a = 0, b = 0;
  for (size_t i = 180; i < 200; ++i) a += fused[i], b += unfused[i];
  std::cout << "resnet18 amp, 200 graphed steps: last-20 mean loss fused " << a / 20 << ", unfused " << b / 20
            << " (first " << fused.front() << " / " << unfused.front() << ")\n";
  EXPECT_LT(b / 20, 0.7 * unfused.front()) << "the task is learnable";
  EXPECT_LE(std::abs(a - b) / b, 0.02);
}

}  // namespace
}  // namespace convnets::train
