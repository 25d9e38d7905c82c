// The training step's fusion paths on the CPU: the folded input gradient against autograd's sum, the step tuner's choices from injected timings, its cache, the block timer's numerics check, the dgrad+add graphs planned for an H100, and --fusion's configuration.
#include "core/error.h"
#include "cudnn_devices.h"
#include "models/cudnn_graphs.h"
#include "models/fusion.h"
#include "models/grad_fold.h"
#include "models/registry.h"
#include "runtime/block_timer.h"
#include "runtime/runtime.h"
#include "runtime/tuner.h"
#include "train/config.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace convnets {
namespace {

using models::FusionMode;
using models::FusionPath;

Network resnet(const std::string& arch) {
  torch::manual_seed(7);
  ModelOptions o;
  o.num_classes = 10;
  auto m = build_model(find_architecture(arch), o);
  for (auto& p : m->parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
  }
  return m;
}

// A training step's forward and backward: the output, the input's gradient and every parameter's.
std::vector<at::Tensor> step_of(NetworkImpl& model, const at::Tensor& input) {
  model.train();
  model.zero_grad();
  auto x = input.detach().clone().requires_grad_(true);
  auto y = model.forward(x);
  const auto w = torch::linspace(-1, 1, y.numel()).view(y.sizes());
  (y * w).sum().backward();
  std::vector<at::Tensor> out{y.detach(), x.grad()};
  for (const auto& p : model.parameters()) out.push_back(p.grad());
  for (const auto& b : model.buffers()) out.push_back(b.clone());
  return out;
}

// BnFold is the block's function with the two gradients at its input handed over through a slot: on the CPU (ATen's
// dgrad, then the add) the same arithmetic as autograd's sum, so every output, gradient and running statistic equals
// the unfolded network's bit for bit, and each block's sum was made in the convolution's backward.
TEST(Fusion, FoldedBlocksComputeTheUnfoldedFunctionBitForBit) {
  for (const std::string arch : {"resnet50", "resnet18"}) {
    auto plain = resnet(arch), folded = resnet(arch);
    const auto blocks = models::tunable_blocks(*folded).size();
    models::set_block_paths(*plain, models::block_paths(*plain).fill_(static_cast<std::int64_t>(FusionPath::Unfused)));
    models::set_block_paths(*folded, models::block_paths(*folded).fill_(static_cast<std::int64_t>(FusionPath::BnFold)));
    const auto x = torch::randn({2, 3, 32, 32}).contiguous(at::MemoryFormat::ChannelsLast);
    models::reset_fold_counts();
    const auto want = step_of(*plain, x);
    EXPECT_EQ(models::fold_counts().dgrad_then_add, 0) << arch << ": the unfolded network hands nothing over";
    const auto got = step_of(*folded, x);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].defined() && want[i].defined()) << arch << " tensor " << i;
      EXPECT_TRUE(torch::equal(got[i], want[i])) << arch << " tensor " << i << " differs by "
                                                 << (got[i] - want[i]).abs().max().item<double>();
    }
    // Autograd runs the later-made node first: the shortcut's gradient waits, conv1's dgrad comes second.
    const auto counts = models::fold_counts();
    EXPECT_EQ(counts.dgrad_then_add, static_cast<std::int64_t>(blocks)) << arch;
    EXPECT_EQ(counts.at_tap + counts.epilogue, 0) << arch;
  }
}

// Whichever of the two consumers autograd reaches first, the input's gradient is the sum, made where the second one
// arrives: at the tap (an add after all) or in the convolution's dgrad.
TEST(Fusion, EitherOrderOfTheTwoGradientsGivesTheirSum) {
  torch::manual_seed(3);
  models::Conv2d conv(torch::nn::Conv2dOptions(4, 4, 1).bias(false));
  const auto x0 = torch::randn({2, 4, 5, 5});
  auto reference = [&] {
    auto x = x0.clone().requires_grad_(true);
    ((x * 2).sum() + conv->forward(x).square().sum()).backward();
    return x.grad();
  }();
  for (const bool tap_first : {true, false}) {
    conv->zero_grad();
    models::reset_fold_counts();
    auto x = x0.clone().requires_grad_(true);
    const auto slot = models::make_grad_slot();
    at::Tensor a, b;
    // The node made later runs first in backward.
    if (tap_first) {
      b = models::fold_conv(*conv, x, slot);
      a = models::fold_tap(x, slot);
    } else {
      a = models::fold_tap(x, slot);
      b = models::fold_conv(*conv, x, slot);
    }
    ((a * 2).sum() + b.square().sum()).backward();
    EXPECT_TRUE(torch::allclose(x.grad(), reference, 1e-6, 1e-6)) << "tap first: " << tap_first;
    const auto counts = models::fold_counts();
    EXPECT_EQ(counts.dgrad_then_add, tap_first ? 1 : 0);
    EXPECT_EQ(counts.at_tap, tap_first ? 0 : 1);
  }
}

// A stand-in residual block for the tuner: its signature, input and refusals are what the test says.
class FakeBlockImpl : public torch::nn::Module, public models::FusionTunable, public models::TunableModule {
 public:
  FakeBlockImpl(std::string signature, std::vector<std::int64_t> input) : signature_(std::move(signature)),
                                                                          input_(std::move(input)) {
    w = register_parameter("w", torch::ones({1}));
  }
  std::string path_refusal(FusionPath p, const models::FusedBnContext& c) const override {
    if (auto it = refusals.find(p); it != refusals.end()) return it->second;
    if (p != FusionPath::Unfused && !c.cuda) return "not on CUDA";
    return "";
  }
  void set_path(FusionPath p) override { path_ = p; }
  FusionPath path() const override { return path_; }
  std::string signature() const override { return signature_; }
  std::vector<std::int64_t> last_input_sizes() const override { return input_; }
  at::Tensor train_forward(const at::Tensor& x) override { return x * w; }
  torch::nn::Module& module() override { return *this; }
  models::FusionTunable& tunable() override { return *this; }
  at::Tensor forward(const at::Tensor& x) { return train_forward(x); }
  std::map<FusionPath, std::string> refusals;
  torch::Tensor w;

 private:
  std::string signature_;
  std::vector<std::int64_t> input_;
  FusionPath path_ = FusionPath::Bn;
};
TORCH_MODULE(FakeBlock);

// layer1.0 (its own shape), layer1.1 and layer1.2 (one shape), layer2.0 (another).
struct FakeNet : torch::nn::Module {
  FakeNet() {
    torch::nn::Sequential l1, l2;
    l1->push_back(FakeBlock("down 64", std::vector<std::int64_t>{8, 64, 56, 56}));
    l1->push_back(FakeBlock("identity 256", std::vector<std::int64_t>{8, 256, 56, 56}));
    l1->push_back(FakeBlock("identity 256", std::vector<std::int64_t>{8, 256, 56, 56}));
    l2->push_back(FakeBlock("down 256", std::vector<std::int64_t>{8, 256, 56, 56}));
    register_module("layer1", l1);
    register_module("layer2", l2);
  }
};

// Timings injected per signature and path; what it was asked is kept.
class FakeTimer : public runtime::BlockTimer {
 public:
  std::map<std::string, std::map<FusionPath, double>> ms;
  std::map<std::string, std::map<FusionPath, bool>> bad_numerics;
  std::vector<std::pair<std::string, std::vector<FusionPath>>> asked;
  std::vector<runtime::Candidate> time(torch::nn::Module&, models::FusionTunable& t,
                                      const std::vector<FusionPath>& paths, const std::vector<std::int64_t>&,
                                      at::ScalarType) override {
    asked.emplace_back(t.signature(), paths);
    std::vector<runtime::Candidate> out;
    for (const auto p : paths) {
      runtime::Candidate c;
      c.path = p;
      c.ms = ms[t.signature()].count(p) ? ms[t.signature()][p] : 1.0;
      c.numerics_ok = !bad_numerics[t.signature()][p];
      c.numerics = c.numerics_ok ? "0.0e+00" : "5.0e-02 of the input's gradient";
      out.push_back(c);
    }
    return out;
  }
};

models::FusedBnContext gpu_context(FusionMode mode = FusionMode::Auto) {
  models::FusedBnContext c;
  c.mode = mode;
  c.cuda = true;
  c.dtype = at::kHalf;
  return c;
}

std::map<std::string, FusionPath> paths_of(torch::nn::Module& m) {
  std::map<std::string, FusionPath> out;
  for (const auto& [name, b] : models::tunable_blocks(m)) out[name] = b->path();
  return out;
}

TEST(Fusion, TunerKeepsTheFastestVerifiedPath) {
  auto holder = std::make_shared<FakeNet>();  // named_modules asks a module for its own shared_ptr
  auto& net = *holder;
  FakeTimer timer;
  timer.ms["down 64"] = {{FusionPath::Unfused, 1.0}, {FusionPath::Bn, 0.9}, {FusionPath::BnFold, 0.8}};
  timer.ms["identity 256"] = {{FusionPath::Unfused, 1.0}, {FusionPath::Bn, 0.995}, {FusionPath::BnFold, 0.999}};
  timer.ms["down 256"] = {{FusionPath::Unfused, 2.0}, {FusionPath::Bn, 1.5}, {FusionPath::BnFold, 1.2}};
  timer.bad_numerics["down 256"][FusionPath::BnFold] = true;
  auto report = runtime::tune(net, gpu_context(), timer, nullptr);
  // Once per shape, NormConv left out (unverified): three shapes, three paths each.
  ASSERT_EQ(timer.asked.size(), 3u);
  for (const auto& [sig, paths] : timer.asked) {
    EXPECT_EQ(paths, (std::vector<FusionPath>{FusionPath::Unfused, FusionPath::Bn, FusionPath::BnFold})) << sig;
  }
  const auto chosen = paths_of(net);
  EXPECT_EQ(chosen.at("layer1.0"), FusionPath::BnFold) << "the fastest";
  EXPECT_EQ(chosen.at("layer1.1"), FusionPath::Unfused) << "within 1 %: the simplest";
  EXPECT_EQ(chosen.at("layer1.2"), FusionPath::Unfused) << "the same shape, the same choice";
  EXPECT_EQ(chosen.at("layer2.0"), FusionPath::Bn) << "the fastest failed its numerics check";
  EXPECT_EQ(report.timed, 3);
  EXPECT_EQ(report.cached, 0);
  const auto text = report.describe();
  EXPECT_NE(text.find("layer1.1-2: none"), std::string::npos) << text;
  EXPECT_NE(text.find("layer2.0: bn (ms a forward+backward: none 2.000, bn 1.500, bn+fold 1.200 (numerics: "),
            std::string::npos) << text;
  EXPECT_NE(text.find("not candidates: normconv: unverified: its 200-step run"), std::string::npos) << text;

  // A forced family: its paths only, and one path is set without timing.
  timer.asked.clear();
  runtime::tune(net, gpu_context(FusionMode::Bn), timer, nullptr);
  ASSERT_EQ(timer.asked.size(), 3u);
  EXPECT_EQ(timer.asked[0].second, (std::vector<FusionPath>{FusionPath::Bn, FusionPath::BnFold}));
  EXPECT_EQ(paths_of(net).at("layer1.0"), FusionPath::BnFold);
  EXPECT_EQ(paths_of(net).at("layer2.0"), FusionPath::Bn) << "a failed check still loses to a passed one";
  timer.asked.clear();
  report = runtime::tune(net, gpu_context(FusionMode::NormConv), timer, nullptr);
  EXPECT_TRUE(timer.asked.empty());
  EXPECT_EQ(paths_of(net).at("layer1.0"), FusionPath::NormConv) << "forced: unverified is said, not refused";
  EXPECT_NE(report.describe().find("nothing to time"), std::string::npos) << report.describe();
  report = runtime::tune(net, gpu_context(FusionMode::None), timer, nullptr);
  EXPECT_TRUE(timer.asked.empty());
  EXPECT_EQ(paths_of(net).at("layer2.0"), FusionPath::Unfused);

  // A forced family whose every path fails the check: the fastest runs, and the start line says so.
  timer.bad_numerics["down 64"][FusionPath::Bn] = timer.bad_numerics["down 64"][FusionPath::BnFold] = true;
  report = runtime::tune(net, gpu_context(FusionMode::Bn), timer, nullptr);
  EXPECT_EQ(paths_of(net).at("layer1.0"), FusionPath::BnFold);
  EXPECT_NE(report.describe().find("bn+fold is forced by --fusion bn though its numerics differ"), std::string::npos)
      << report.describe();
  // In auto the same blocks run unfused.
  runtime::tune(net, gpu_context(), timer, nullptr);
  EXPECT_EQ(paths_of(net).at("layer1.0"), FusionPath::Unfused);

  // Where nothing fuses (the CPU), nothing is timed.
  timer.asked.clear();
  auto cpu = gpu_context();
  cpu.cuda = false;
  runtime::tune(net, cpu, timer, nullptr);
  EXPECT_TRUE(timer.asked.empty());
  EXPECT_EQ(paths_of(net).at("layer1.0"), FusionPath::Unfused);
  // A block whose input was never seen cannot be tuned, and the error names it.
  torch::nn::Sequential unseen(FakeBlock("x", std::vector<std::int64_t>{}));
  EXPECT_THROW(runtime::tune(*unseen, gpu_context(), timer, nullptr), Error);
}

class TempDir {
 public:
  TempDir() : path_(std::filesystem::temp_directory_path() / ("convnets-tuning-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

runtime::TuningDevice device(const std::string& gpu, long cudnn = 91900) { return {gpu, 132, cudnn, "0.1.0"}; }

// The cache: written after timing, read by the next run (which times nothing and chooses the same), ignored and
// named for another GPU or cuDNN (whose entries it keeps), never overwritten when it cannot be read.
TEST(Fusion, TuningCacheIsReadWrittenAndKeyedByDevice) {
  TempDir dir;
  const auto path = dir.file("nested/tuning.json");
  auto holder = std::make_shared<FakeNet>();
  auto& net = *holder;
  FakeTimer timer;
  timer.ms["down 64"] = {{FusionPath::Bn, 0.5}};
  timer.ms["identity 256"] = {{FusionPath::BnFold, 0.5}};
  {
    runtime::TuningCache cache(path, device("NVIDIA H100 80GB HBM3"));
    const auto report = runtime::tune(net, gpu_context(), timer, &cache);
    EXPECT_EQ(report.timed, 3);
    ASSERT_TRUE(cache.save()) << cache.note();
  }
  const auto first = paths_of(net);
  EXPECT_EQ(first.at("layer1.0"), FusionPath::Bn);
  EXPECT_EQ(first.at("layer1.1"), FusionPath::BnFold);
  const auto j = nlohmann::json::parse(std::ifstream(path));
  EXPECT_EQ(j.at("format"), "convnets tuning cache 1");
  ASSERT_EQ(j.at("devices").size(), 1u);
  EXPECT_EQ(j["devices"][0]["device"]["gpu"], "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(j["devices"][0]["shapes"].size(), 3u);

  // The same device again: nothing timed, the same choices, from a network that starts elsewhere.
  models::set_block_paths(net, models::block_paths(net).fill_(0));
  timer.asked.clear();
  {
    runtime::TuningCache cache(path, device("NVIDIA H100 80GB HBM3"));
    EXPECT_EQ(cache.note(), "");
    const auto report = runtime::tune(net, gpu_context(), timer, &cache);
    EXPECT_TRUE(timer.asked.empty());
    EXPECT_EQ(report.timed, 0);
    EXPECT_EQ(report.cached, 3);
    EXPECT_NE(report.describe().find("(timed nothing)"), std::string::npos) << report.describe();
    EXPECT_EQ(paths_of(net), first);
    // A cached choice the mode does not admit is not taken: --fusion none runs none.
    runtime::tune(net, gpu_context(FusionMode::None), timer, &cache);
    EXPECT_EQ(paths_of(net).at("layer1.0"), FusionPath::Unfused);
  }
  // Another cuDNN: stale, named, timed again; both devices' entries kept.
  timer.asked.clear();
  {
    runtime::TuningCache cache(path, device("NVIDIA H100 80GB HBM3", 91000));
    const auto report = runtime::tune(net, gpu_context(), timer, &cache);
    EXPECT_EQ(timer.asked.size(), 3u);
    EXPECT_NE(report.cache_note.find("3 shapes measured on NVIDIA H100 80GB HBM3 (132 SMs), cuDNN 91900"),
              std::string::npos) << report.cache_note;
    EXPECT_NE(report.cache_note.find("ignored"), std::string::npos);
    ASSERT_TRUE(cache.save());
  }
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(path)).at("devices").size(), 2u);
  // An unreadable file is neither used nor overwritten.
  const auto broken = dir.file("broken.json");
  std::ofstream(broken) << "{\"format\": \"convnets tuning cache 1\", \"devices\": [";
  {
    runtime::TuningCache cache(broken, device("NVIDIA H100 80GB HBM3"));
    EXPECT_NE(cache.note().find("unreadable"), std::string::npos) << cache.note();
    runtime::tune(net, gpu_context(), timer, &cache);
    EXPECT_FALSE(cache.save());
  }
  std::ifstream in(broken);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "{\"format\": \"convnets tuning cache 1\", \"devices\": [");

  // Where the default lives.
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved = xdg ? xdg : "";
  ::setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
  EXPECT_EQ(runtime::default_tuning_cache(), "/tmp/xdg/convnets/tuning.json");
  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", "/home/u", 1);
  EXPECT_EQ(runtime::default_tuning_cache(), "/home/u/.cache/convnets/tuning.json");
  if (xdg) ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
}

// The block timer on the CPU: every path of a real ResNet block computes the unfused path's numbers (the fused BN
// falls back to the same ops here), each is timed, and the block is left as it was found: its running statistics,
// its path, its parameters' gradients untouched. A path that computes something else fails the check.
TEST(Fusion, BlockTimerChecksEachPathAgainstTheUnfusedOne) {
  auto net = resnet("resnet18");
  runtime::Runtime rt;
  runtime::record_block_inputs(*net, rt, {2, 3, 32, 32});
  auto [name, block] = models::tunable_blocks(*net).front();
  ASSERT_EQ(name, "layer1.0");
  EXPECT_EQ(block->last_input_sizes(), (std::vector<std::int64_t>{2, 64, 8, 8}));
  auto& module = block->module();
  std::vector<at::Tensor> before;
  for (const auto& b : module.buffers()) before.push_back(b.clone());
  block->set_path(FusionPath::Bn);
  runtime::DeviceBlockTimer timer(true, 1, 1);
  const auto got = timer.time(module, *block, {FusionPath::Unfused, FusionPath::Bn, FusionPath::BnFold},
                              block->last_input_sizes(), at::kFloat);
  ASSERT_EQ(got.size(), 3u);
  for (const auto& c : got) {
    EXPECT_EQ(c.refusal, "") << models::path_name(c.path);
    EXPECT_TRUE(c.numerics_ok) << c.numerics;
    EXPECT_EQ(c.numerics.rfind("0.0e+00 ", 0), 0u) << c.numerics;
    EXPECT_GT(c.ms, 0) << models::path_name(c.path);
  }
  EXPECT_EQ(block->path(), FusionPath::Bn);
  const auto after = module.buffers();
  for (std::size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(before[i], after[i])) << i;
  for (const auto& p : module.parameters()) EXPECT_FALSE(p.grad().defined());

  // The check against a path that is 1 % off.
  struct Off : public FakeBlockImpl {
    using FakeBlockImpl::FakeBlockImpl;
    at::Tensor train_forward(const at::Tensor& x) override {
      return path() == FusionPath::BnFold ? x * w * 1.01 : x * w;
    }
  };
  auto off = std::make_shared<Off>("scaled", std::vector<std::int64_t>{4, 8});
  const auto checked = timer.time(*off, *off, {FusionPath::Bn, FusionPath::BnFold}, {4, 8}, at::kFloat);
  EXPECT_TRUE(checked[0].numerics_ok) << checked[0].numerics;
  EXPECT_FALSE(checked[1].numerics_ok) << checked[1].numerics;
  EXPECT_EQ(checked[1].numerics.rfind("1.0e-02 of ", 0), 0u) << checked[1].numerics;
  EXPECT_EQ(runtime::worst_distance({torch::ones({3})}, {torch::ones({3}) * 2}).first, 0.5);
}

// The dgrad+add graph of every block's first convolution of a ResNet-50 step at batch 256 in fp16, asked of cuDNN for
// an H100 without one: the shapes whose input gradient BnFold sums in the epilogue. Its engines for sm90 are
// runtime-compiled (NVRTC), which only a GPU's driver builds, so deviceless the question is whether cuDNN offers
// engines and refuses them for nothing but the missing driver; the GPU builds them (Gpu.FusedFold*). A strided
// dgrad, whose shape cuDNN refuses on sm90 in half precision, keeps ATen's dgrad and the add.
TEST(Fusion, DgradAddGraphsHaveSm90EnginesForAResNet50Step) {
  struct Case {
    std::int64_t c, hw, k;
  };
  // conv1 of layer1.0, layer1.x, layer2.0, layer2.x, layer3.0, layer3.x, layer4.0, layer4.x: 1x1, stride 1.
  const std::vector<Case> cases{{64, 56, 64},   {256, 56, 64},   {256, 56, 128},  {512, 28, 128},
                                {512, 28, 256}, {1024, 14, 256}, {1024, 14, 512}, {2048, 7, 512}};
  for (const auto& c : cases) {
    models::norm_conv::ConvGeometry g;
    g.n = 256, g.c = c.c, g.h = c.hw, g.w = c.hw, g.k = c.k, g.r = 1, g.s = 1, g.stride = 1, g.pad = 0;
    g.dtype = at::kHalf;
    const auto why = models::norm_conv::check_dgrad_add_plans(g, test::kH100, 90);
    if (why.empty()) continue;  // planned outright (a cuDNN with a precompiled engine for it)
    EXPECT_NE(why.find("RUNTIME_PREREQUISITE_MISSING"), std::string::npos) << g.str() << ": no sm90 engine offered";
    EXPECT_EQ(test::graph_refusals(why), std::vector<std::string>{}) << g.str();
  }
  models::norm_conv::ConvGeometry strided;
  strided.n = 256, strided.c = 256, strided.h = 56, strided.w = 56, strided.k = 512, strided.r = 1, strided.s = 1;
  strided.stride = 2, strided.pad = 0, strided.dtype = at::kHalf;
  const auto refused = test::graph_refusals(models::norm_conv::check_dgrad_add_plans(strided, test::kH100, 90));
  ASSERT_FALSE(refused.empty());
  EXPECT_NE(refused.front().find("NOT_SUPPORTED_SHAPE"), std::string::npos) << refused.front();
}

// --fusion in recipes and checkpoints, and the switches it replaced, as checkpoints of older runs carry them.
TEST(Fusion, FusionIsAConfigFieldAndTheOldSwitchesMapOntoIt) {
  train::TrainConfig c;
  EXPECT_EQ(c.fusion, "auto");
  train::apply_json(c, {{"fused_bn", false}, {"norm_conv", false}}, "a checkpoint");
  EXPECT_EQ(c.fusion, "none");
  c = {};
  train::apply_json(c, {{"fused_bn", true}, {"norm_conv", true}}, "a checkpoint");
  EXPECT_EQ(c.fusion, "normconv");
  c = {};
  train::apply_json(c, {{"fused_bn", false}, {"fusion", "bn"}}, "a checkpoint");
  EXPECT_EQ(c.fusion, "bn");
  c = {};
  c.data = "synthetic";
  c.fusion = "fastest";
  try {
    train::validate(c);
    ADD_FAILURE() << "--fusion fastest was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--fusion fastest: expected auto, none, bn or normconv"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace convnets
