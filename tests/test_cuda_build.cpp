// The CUDA build on a machine without a GPU: what it links, how it picks the device, and what it refuses, naming the flag.
#include "core/compat.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "deploy/graph_engine.h"
#include "distributed/env.h"
#include "distributed/group.h"
#include "kernels/normalize.h"
#include "models/registry.h"
#include "runtime/runtime.h"
#include "train/graph_step.h"
#include "train/sgd.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <regex>

namespace convnets {
namespace {

#define SKIP_WITH_CUDA() \
  if (torch::cuda::is_available()) GTEST_SKIP() << "a GPU is visible: this checks the behaviour without one"

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Which CUDA graph serves a batch (deploy::choose_graph): replay a captured size, capture a new one while the
// memory allows, pad up to a captured size once it does not, run eagerly past the declared sizes or when nothing fits.
TEST(CudaBuild, GraphPolicyReplaysCapturesPadsOrRunsEagerly) {
  using How = deploy::GraphChoice::How;
  deploy::GraphPolicy each;  // no declared sizes: each new size captured on first use
  each.memory_mb = 100;
  auto c = deploy::choose_graph(each, {}, 5);
  EXPECT_EQ(c.how, How::Capture);
  EXPECT_EQ(c.size, 5);
  c = deploy::choose_graph(each, {{5, 40.0}}, 5);
  EXPECT_EQ(c.how, How::Replay);
  EXPECT_EQ(c.size, 5);
  c = deploy::choose_graph(each, {{5, 40.0}}, 3);
  EXPECT_EQ(c.how, How::Capture) << "a new capture while memory allows: padding would cost every call";
  EXPECT_EQ(c.size, 3);
  c = deploy::choose_graph(each, {{5, 40.0}, {8, 70.0}}, 3);
  EXPECT_EQ(c.how, How::Replay) << "110 of 100 MiB: padded up to the smallest captured size that holds 3";
  EXPECT_EQ(c.size, 5);
  c = deploy::choose_graph(each, {{5, 40.0}, {8, 70.0}}, 9);
  EXPECT_EQ(c.how, How::Eager);
  EXPECT_EQ(c.why, "the graphs hold 110 MiB of --graph-memory-mb 100");

  deploy::GraphPolicy declared{{1, 8, 32}, 100};
  c = deploy::choose_graph(declared, {}, 5);
  EXPECT_EQ(c.how, How::Capture);
  EXPECT_EQ(c.size, 8) << "padded up to the smallest declared size that holds it";
  c = deploy::choose_graph(declared, {{8, 10.0}}, 8);
  EXPECT_EQ(c.how, How::Replay);
  EXPECT_EQ(c.size, 8);
  c = deploy::choose_graph(declared, {{8, 10.0}}, 1);
  EXPECT_EQ(c.how, How::Capture);
  EXPECT_EQ(c.size, 1);
  c = deploy::choose_graph(declared, {{1, 5.0}, {32, 120.0}}, 8);
  EXPECT_EQ(c.how, How::Replay) << "no room for 8's graph: 32's holds 8 rows";
  EXPECT_EQ(c.size, 32);
  c = deploy::choose_graph(declared, {}, 33);
  EXPECT_EQ(c.how, How::Eager);
  EXPECT_EQ(c.why, "33 rows: more than the largest of --graph-batch-sizes (32)");

  EXPECT_EQ(deploy::parse_graph_sizes("1,8,256"), (std::vector<std::int64_t>{1, 8, 256}));
  for (const char* bad : {"8,4", "1,1", "0,2", "1,,2", "1,x", ""}) {
    EXPECT_NE(error_of([&] { deploy::parse_graph_sizes(bad); }).find("--graph-batch-sizes"), std::string::npos) << bad;
  }
  EXPECT_NE(error_of([] { deploy::check_graph_policy({{4, 2}, 10}); }).find("--graph-batch-sizes"), std::string::npos);
  EXPECT_NE(error_of([] { deploy::check_graph_policy({{}, 0}); }).find("--graph-memory-mb must be positive"),
            std::string::npos);
}

TEST(CudaBuild, LibTorchCudaIsLinkedAndNamesItsVersions) {
  // The CUDA hooks are registered by libtorch_cuda when it loads; without it
  // they are the CPU-only stub, which has no CUDA runtime.
  EXPECT_TRUE(at::detail::getCUDAHooks().hasCUDART());
  const std::string v = compat::engine_versions();
  EXPECT_TRUE(std::regex_match(v, std::regex(R"(LibTorch 2\.\d+\.\d+[^,]*, CUDA \d+\.\d+, cuDNN \d+\.\d+\.\d+)"))) << v;
  EXPECT_NE(v.find(TORCH_VERSION), std::string::npos) << v;
}

TEST(CudaBuild, OurKernelsReachTheCudaRuntimeAndReportItsError) {
  SKIP_WITH_CUDA();
  // A launch with no device fails inside the CUDA runtime, which says why;
  // the loader turns that code into its error message.
  kernels::NormalizeArgs a;
  a.n = a.h = a.w = 1;
  const int rc = kernels::launch_normalize(a, nullptr);
  EXPECT_NE(rc, 0);
  const std::string name = kernels::cuda_error_name(rc);
  EXPECT_FALSE(name.empty());
  EXPECT_EQ(name.find("unrecognized"), std::string::npos) << name;
}

TEST(CudaBuild, DeviceSelectionFallsBackToTheCpuAndRefusesWhatNeedsAGpu) {
  SKIP_WITH_CUDA();
  EXPECT_FALSE(at::globalContext().hasCUDA());
  const auto rt = runtime::resolve_runtime("auto", "fp32", "nhwc");
  EXPECT_TRUE(rt.device.is_cpu());
  EXPECT_EQ(rt.autocast, c10::kFloat);
  const auto cuda = error_of([] { runtime::resolve_runtime("cuda", "fp32", "nhwc"); });
  EXPECT_NE(cuda.find("--device cuda: no CUDA device is available"), std::string::npos) << cuda;
  for (const std::string p : {"amp", "tf32"}) {
    const auto e = error_of([&] { runtime::resolve_runtime("auto", p, "nhwc"); });
    EXPECT_NE(e.find("--precision " + p + " needs a CUDA GPU"), std::string::npos) << e;
  }
  // bf16 is LibTorch's CPU autocast where the CPU has native bf16, refused (naming the instructions) elsewhere.
  if (cpu_has_native_bf16()) {
    EXPECT_EQ(runtime::resolve_runtime("auto", "bf16", "nhwc").autocast, c10::kBFloat16);
  } else {
    const auto e = error_of([] { runtime::resolve_runtime("auto", "bf16", "nhwc"); });
    EXPECT_NE(e.find("AVX512_BF16 or AMX-BF16"), std::string::npos) << e;
  }
}

TEST(CudaBuild, NcclNeedsACudaDeviceAndAutoPicksTheBackendByDevice) {
  const c10::Device cpu(c10::kCPU), gpu(c10::kCUDA, 0);
  EXPECT_EQ(distributed::resolve_backend("auto", cpu), "gloo");
  EXPECT_EQ(distributed::resolve_backend("auto", gpu), "nccl");
  EXPECT_EQ(distributed::resolve_backend("gloo", gpu), "gloo");
  EXPECT_EQ(distributed::resolve_backend("nccl", gpu), "nccl");
  const auto nccl = error_of([&] { distributed::resolve_backend("nccl", cpu); });
  EXPECT_NE(nccl.find("--dist-backend nccl: no CUDA device"), std::string::npos) << nccl;
  const auto other = error_of([&] { distributed::resolve_backend("mpi", cpu); });
  EXPECT_NE(other.find("--dist-backend mpi: expected auto, gloo or nccl"), std::string::npos) << other;
}

TEST(CudaBuild, AGroupAskedForNcclOnTheCpuFailsBeforeTheRendezvous) {
  distributed::WorkerEnv e;
  e.rank = 0;
  e.world_size = 2;  // rank 1 never comes: a rendezvous would wait out the timeout
  e.master_addr = "127.0.0.1";
  e.master_port = 1;
  e.timeout = std::chrono::milliseconds(60000);
  const auto start = std::chrono::steady_clock::now();
  const auto err = error_of([&] { distributed::Group g(e, c10::Device(c10::kCPU), "nccl"); });
  EXPECT_NE(err.find("--dist-backend nccl: no CUDA device"), std::string::npos) << err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(CudaBuild, TheStepIsGraphedOnlyOnCudaWhenAskedAndCapturable) {
  torch::manual_seed(0);
  ModelOptions mo;
  mo.num_classes = 10;
  auto model = build_model(find_architecture("resnet8"), mo);
  train::Sgd sgd(*model, train::SgdOptions{0.9, false, 0.0, false});
  const c10::Device cpu(c10::kCPU), gpu(c10::kCUDA, 0);
  train::StepOptions plain, mixup, dropout;
  mixup.mix.mixup = 0.2;
  dropout.random_layers = true;
  // Deciding touches no CUDA state, so it is checked here for a CUDA device too.
  EXPECT_TRUE(train::StepRunner(*model, sgd, nullptr, nullptr, plain, gpu, true).graphed());
  EXPECT_FALSE(train::StepRunner(*model, sgd, nullptr, nullptr, plain, gpu, false).graphed());  // --no-cuda-graph
  EXPECT_FALSE(train::StepRunner(*model, sgd, nullptr, nullptr, plain, cpu, true).graphed());
  EXPECT_FALSE(train::StepRunner(*model, sgd, nullptr, nullptr, mixup, gpu, true).graphed());
  EXPECT_FALSE(train::StepRunner(*model, sgd, nullptr, nullptr, dropout, gpu, true).graphed());
  EXPECT_NE(train::GraphedStep::unsupported_reason(dropout).find("dropout"), std::string::npos);
}

}  // namespace
}  // namespace convnets
