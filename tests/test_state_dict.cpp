// Loading weights: PyTorch state_dict order, DLE/DataParallel key names, and the mismatch report.
#include "core/error.h"
#include "io/state_dict.h"
#include "models/registry.h"
#include "models/resnet.h"
#include "runtime/checkpoint.h"
#include "test_util.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fstream>

namespace convnets {
namespace {

Network make(const std::string& arch, int64_t classes = 1000) {
  ModelOptions o;
  o.num_classes = classes;
  return build_model(find_architecture(arch), o);
}

std::string load_error(Network& net, const TensorFile& file, const std::string& arch) {
  try {
    load_state_dict(*net, file, "file.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(StateDict, DleKeymapOfTheReferenceMapsOntoOurOrder) {
  CONVNETS_REQUIRE_SHARED(shared);
  std::ifstream in(shared + "/reference/dle_resnet50_tv_keymap.json");
  ASSERT_TRUE(in);
  const auto pairs = nlohmann::json::parse(in).at("dle_to_torchvision");
  const auto ours = state_dict(*make("resnet50"));
  ASSERT_EQ(pairs.size(), ours.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    const auto dle = pairs[i][0].get<std::string>();
    const auto tv = pairs[i][1].get<std::string>();
    EXPECT_EQ(ours[i].first, tv);
    EXPECT_EQ(resnet_key_from_dle(dle), tv);
  }
}

TEST(StateDict, DleAndDataParallelNamesLoadIntoTheSameTensors) {
  torch::manual_seed(1);
  auto src = make("se_resnext101_32x4d", 10);
  auto dst = make("se_resnext101_32x4d", 10);
  TensorFile dle;
  for (const auto& [k, t] : state_dict(*src)) {
    std::string key = k;
    if (key.rfind("layer", 0) == 0 && key[5] >= '1' && key[5] <= '4') {
      key = "layers." + std::to_string(key[5] - '1') + key.substr(6);
    }
    dle.tensors.emplace_back("module." + key, t.clone());
  }
  ASSERT_EQ(dle.tensors[6].first.rfind("module.layers.0.0.", 0), 0u) << dle.tensors[6].first;
  const auto report =
      load_state_dict(*dst, dle, "dle.safetensors", find_key_layout(find_architecture("se_resnext101_32x4d"), "dle")->map);
  EXPECT_TRUE(report.ok()) << report.describe();
  const auto a = state_dict(*src), b = state_dict(*dst);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
}

// --key-layout: auto picks the arch's layout most of a file's tensors fit; a forced one is used as named; a
// layout the arch lacks, and a file no layout fits, are errors that say what was tried.
TEST(StateDict, KeyLayoutIsDetectedForcedOrRefusedByName) {
  torch::manual_seed(3);
  auto src = make("resnet18", 10);
  runtime::Checkpoint dle;
  dle.path = "dle.pth";
  for (const auto& [k, t] : state_dict(*src)) {
    const std::string key = k.rfind("layer", 0) == 0 ? "layers." + std::to_string(k[5] - '1') + k.substr(6) : k;
    dle.file.tensors.emplace_back("module." + key, t.clone());
  }
  const auto& arch = find_architecture("resnet18");
  auto dst = make("resnet18", 10);
  runtime::load_weights(*dst, dle, "model.", arch);  // auto: DLE's names
  const auto a = state_dict(*src), b = state_dict(*dst);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;

  const auto error = [&](runtime::Checkpoint c, const std::string& layout) {
    c.key_layout = layout;
    auto net = make("resnet18", 10);
    try {
      runtime::load_weights(*net, c, "model.", arch);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error(dle, "dle"), "");
  const auto forced = error(dle, "torchvision");  // as named, it does not fit: the first missing key first
  EXPECT_NE(forced.find("dle.pth' does not fit the model: tensor 'layer1.0.conv1.weight' is missing"), std::string::npos)
      << forced;
  EXPECT_EQ(forced.find("key layouts of"), std::string::npos) << forced;
  EXPECT_EQ(error(dle, "gpunet"), "--key-layout gpunet: resnet18's weights files come as torchvision | timm | dle (or auto)");

  runtime::Checkpoint odd = dle;  // names of neither layout
  for (auto& [k, t] : odd.file.tensors) k = "backbone." + k;
  const auto none = error(odd, "auto");
  const auto total = std::to_string(a.size());
  for (const std::string& line : std::vector<std::string>{"key layouts of resnet18 (--key-layout auto took the first best):",
                                 "  torchvision | timm: 0 of the file's " + total + " tensors are the model's",
                                 "  dle: 0 of the file's " + total + " tensors are the model's",
                                 "tensor 'conv1.weight' is missing from the file"}) {
    EXPECT_NE(none.find(line), std::string::npos) << line << "\n" << none;
  }
}

TEST(StateDict, HalfPrecisionWeightsAreConvertedOnLoad) {
  auto src = make("resnet18");
  TensorFile half;
  for (const auto& [k, t] : state_dict(*src)) {
    half.tensors.emplace_back(k, t.is_floating_point() ? t.to(torch::kFloat16) : t.clone());
  }
  auto dst = make("resnet18");
  load_state_dict(*dst, half, "half.safetensors");
  const auto w = state_dict(*dst).front().second;
  EXPECT_EQ(w.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(w, half.tensors.front().second.to(torch::kFloat32)));
}

TEST(StateDict, ADtypeOfAnotherClassIsRefusedNamingTheTensorAndBothDtypes) {
  // A header relabelled F32 -> I32 reads a float's bits as an integer: converted silently, the weights would be
  // numbers of 1e9. Integer or bool into float, float into integer or bool: each refused, the model untouched.
  const auto reference = state_dict(*make("resnet18"));
  for (const auto dtype : {torch::kInt32, torch::kInt64, torch::kBool}) {
    TensorFile file;
    for (const auto& [k, t] : reference) file.tensors.emplace_back(k, t.clone());
    file.tensors[0].second = file.tensors[0].second.to(dtype);
    auto net = make("resnet18");
    const auto before = state_dict(*net).front().second.clone();
    const auto msg = load_error(net, file, "resnet18");
    EXPECT_NE(msg.find("weights file 'file.safetensors': tensor 'conv1.weight' is " +
                       std::string(c10::toString(dtype)) + " in the file but Float in the model"),
              std::string::npos)
        << msg;
    EXPECT_TRUE(torch::equal(state_dict(*net).front().second, before)) << "the model was changed";
  }
  // num_batches_tracked (int64 in the model) from a float: refused the other way round.
  TensorFile floats;
  for (const auto& [k, t] : reference) floats.tensors.emplace_back(k, t.to(torch::kFloat32));
  auto net = make("resnet18");
  EXPECT_NE(load_error(net, floats, "resnet18").find("is Float in the file but Long in the model"), std::string::npos)
      << load_error(net, floats, "resnet18");
}

TEST(StateDict, WrongClassCountNamesTheTensorAndBothShapes) {
  TensorFile file;
  file.tensors = state_dict(*make("resnet50", 10));
  auto net = make("resnet50", 1000);
  const auto msg = load_error(net, file, "resnet50");
  EXPECT_NE(msg.find("file.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'fc.weight' has shape [1000, 2048] in the model but [10, 2048] in the file"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("fc.bias"), std::string::npos) << "every mismatch is listed: " << msg;
}

TEST(StateDict, WeightsOfAnotherArchAreRejectedWithEveryDifference) {
  TensorFile file;
  file.tensors = state_dict(*make("resnet18"));
  auto net = make("resnet50");
  // conv1.weight has the same shape in both archs: a half-done load would overwrite it.
  const auto before = state_dict(*net)[0].second.clone();
  ASSERT_FALSE(torch::equal(before, file.tensors[0].second));
  const auto msg = load_error(net, file, "resnet50");
  EXPECT_TRUE(torch::equal(state_dict(*net)[0].second, before)) << "a failed strict load leaves the model untouched";
  // The first tensor whose shape differs (conv1/bn1 agree; layer1.0.conv1 is 1x1 vs 3x3).
  EXPECT_NE(msg.find("'layer1.0.conv1.weight' has shape [64, 64, 1, 1] in the model but [64, 64, 3, 3] in the file"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("missing from file: layer1.0.conv3.weight"), std::string::npos) << msg;

  auto net34 = make("resnet34");
  const auto msg34 = load_error(net34, file, "resnet34");
  EXPECT_NE(msg34.find("'layer1.2.conv1.weight' is missing from the file"), std::string::npos) << msg34;
}

TEST(StateDict, NonStrictReportListsEverythingAndLoadsWhatFits) {
  auto src = make("resnet18", 10);
  TensorFile file;
  file.tensors = state_dict(*src);
  file.tensors.emplace_back("extra.weight", torch::zeros({1}));
  auto dst = make("resnet18", 1000);
  const auto report = load_state_dict(*dst, file, "f", {}, /*strict=*/false);
  ASSERT_EQ(report.mismatched.size(), 2u);
  EXPECT_EQ(report.mismatched[0].name, "fc.weight");
  EXPECT_EQ(report.unexpected, std::vector<std::string>{"extra.weight"});
  EXPECT_TRUE(report.missing.empty());
  EXPECT_TRUE(torch::equal(state_dict(*dst)[0].second, file.tensors[0].second));
}

}  // namespace
}  // namespace convnets
