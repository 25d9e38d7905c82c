// Numerical equivalence with torchvision: same weights and input give the same logits and BN statistics.
#include "io/safetensors.h"
#include "io/state_dict.h"
#include "models/registry.h"
#include "test_util.h"

#include <torch/torch.h>

#include <filesystem>

namespace convnets {
namespace {

constexpr double kTolerance = 1e-4;  // max relative error, fp32 (the bar)

class TorchvisionEquivalence : public ::testing::TestWithParam<std::string> {
 protected:
  std::string file(const std::string& what) const {
    const char* dir = std::getenv("CONVNETS_TV_REFERENCE_DIR");
    // The CTest fixture writes this data; running the binary by hand needs the variable.
    if (!dir) throw std::runtime_error("CONVNETS_TV_REFERENCE_DIR is not set (run through ctest)");
    return std::string(dir) + "/" + GetParam() + "." + what + ".safetensors";
  }
};

TEST_P(TorchvisionEquivalence, EvalAndTrainModeForwardMatch) {
  const auto& arch = find_architecture(GetParam());
  auto net = build_model(arch, ModelOptions{});
  const auto weights = load_safetensors(file("weights"));
  load_state_dict(*net, weights, file("weights"));
  const auto io = load_safetensors(file("io"));
  const auto& x = *io.find("input");

  torch::NoGradGuard no_grad;
  net->eval();
  const auto eval_logits = net->forward(x);
  const double eval_err = test::max_relative_error(eval_logits, *io.find("eval_logits"));
  EXPECT_LE(eval_err, kTolerance) << "eval-mode logits";

  net->train();
  const auto train_logits = net->forward(x);
  const double train_err = test::max_relative_error(train_logits, *io.find("train_logits"));
  EXPECT_LE(train_err, kTolerance) << "train-mode logits (batch statistics)";
  // The same forward must differ between modes, or the check above proves nothing about BN.
  EXPECT_GT(test::max_relative_error(train_logits, eval_logits), 1e-2);

  // Running statistics after one train-mode step (momentum 0.1, unbiased variance).
  const auto after = load_safetensors(file("after_train"));
  double buffer_err = 0;
  for (const auto& [name, t] : state_dict(*net)) {
    const auto* ref = after.find(name);
    ASSERT_NE(ref, nullptr) << name;
    if (name.size() > 19 && name.compare(name.size() - 19, 19, "num_batches_tracked") == 0) {
      EXPECT_EQ(t.item<int64_t>(), 8) << name << ": the reference started at 7";
      EXPECT_EQ(t.item<int64_t>(), ref->item<int64_t>()) << name;
    } else {
      buffer_err = std::max(buffer_err, test::max_relative_error(t, *ref));
    }
  }
  EXPECT_LE(buffer_err, kTolerance) << "BN running statistics after the train-mode forward";
  std::cout << "[ measured ] " << GetParam() << ": eval " << eval_err << ", train " << train_err << ", buffers "
            << buffer_err << " (max relative error)\n";
}

INSTANTIATE_TEST_SUITE_P(Torchvision, TorchvisionEquivalence,
                         ::testing::Values("resnet18", "resnet50", "resnext50_32x4d"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace convnets
