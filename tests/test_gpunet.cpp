// GPUNet: the JSON format against DLE's published files, the network's rules (padding, widths, drop-path), bad input.
#include "core/error.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "io/state_dict.h"
#include "models/gpunet.h"
#include "models/layers.h"
#include "models/mobile_blocks.h"
#include "models/registry.h"
#include "test_util.h"
#include "train/ema.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

namespace convnets {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(haystack, needle)                                          \
  do {                                                                             \
    const std::string h_ = (haystack);                                             \
    EXPECT_NE(h_.find(needle), std::string::npos) << "'" << needle << "' not in: " << h_; \
  } while (0)

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  return nlohmann::json::parse(in);
}

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("convnets_gpunet_" + std::to_string(::getpid()) + "_" + name)).string();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// The smallest config with each non-distill block kind at 32 px.
nlohmann::json tiny_config() {
  return nlohmann::json::parse(R"([
    {"layer_type": "data", "img_resolution": 32, "distill": false},
    {"layer_type": "head", "num_in_channels": 3, "num_out_channels": 8},
    {"layer_type": "conv", "num_in_channels": 8, "num_out_channels": 8, "stride": 1, "kernel_size": 3, "act": "relu", "stage": 1},
    {"layer_type": "fused_irb", "num_in_channels": 8, "num_out_channels": 8, "stride": 2, "expansion": 2, "kernel_size": 3, "act": "relu", "use_se": false, "stage": 2},
    {"layer_type": "irb", "num_in_channels": 8, "num_out_channels": 8, "stride": 1, "expansion": 3, "kernel_size": 5, "act": "swish", "use_se": true, "stage": 3},
    {"layer_type": "tail", "num_in_channels": 8, "num_out_channels": 16, "num_classes": 10}
  ])");
}

std::string error_of(const nlohmann::json& config) {
  try {
    parse_gpunet(config, "model.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class PublishedGpunet : public ::testing::TestWithParam<std::string> {};

// The bar: DLE's original JSON file, read by our parser, is the built-in
// definition, and builds the same state_dict (the keys/shapes/params of the
// built-in against the reference are checked by ReferenceLayout).
TEST_P(PublishedGpunet, OriginalJsonFileEqualsTheBuiltInDefinition) {
  CONVNETS_REQUIRE_SHARED(shared);
  const GpunetVariant* v = nullptr;
  for (const auto& x : gpunet_variants()) {
    if (x.name == GetParam()) v = &x;
  }
  ASSERT_NE(v, nullptr);
  const std::string file = shared + "/reference/gpunet/" + v->reference_file;
  const auto parsed = load_gpunet_file(file);
  ASSERT_EQ(parsed.layers.size(), v->definition.layers.size());
  for (size_t i = 0; i < parsed.layers.size(); ++i) {
    EXPECT_TRUE(parsed.layers[i] == v->definition.layers[i]) << file << " layer " << i + 1;
  }
  EXPECT_TRUE(parsed == v->definition);
  EXPECT_EQ(parse_gpunet(to_json(parsed), "round trip"), parsed);

  const auto& from_file = find_architecture(file);
  const auto& builtin = find_architecture(v->name);
  EXPECT_EQ(from_file.preprocessing.input_size, builtin.preprocessing.input_size);
  const auto a = state_dict(*build_model(from_file, {}));
  const auto b = state_dict(*build_model(builtin, {}));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.sizes(), b[i].second.sizes()) << a[i].first;
  }
  // The keys file's shapes come from DLE's models: their input resolution is the data entry's.
  const auto keys = read_json(shared + "/reference/models/" + v->name + ".keys.json");
  EXPECT_EQ(keys.at("params").get<int64_t>(), count_parameters(*build_model(from_file, {})));
}

INSTANTIATE_TEST_SUITE_P(AllSeven, PublishedGpunet,
                         ::testing::Values("gpunet-0", "gpunet-1", "gpunet-2", "gpunet-p0", "gpunet-p1", "gpunet-d1",
                                           "gpunet-d2"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& c : s) c = c == '-' ? '_' : c;
                           return s;
                         });

TEST(Gpunet, ParameterCountsFromTheIssue) {
  EXPECT_EQ(count_parameters(*build_model(find_architecture("gpunet-0"), {})), 11'885'432);
  EXPECT_EQ(count_parameters(*build_model(find_architecture("gpunet-2"), {})), 25'798'704);
  EXPECT_EQ(count_parameters(*build_model(find_architecture("gpunet-d2"), {})), 19'036'728);
}

// GPUNET_SPEC.md 2.4's worked examples, and the mid widths of its block tables.
TEST(Gpunet, MakeDivisibleMatchesTheReferenceRounding) {
  EXPECT_EQ(gpunet_make_divisible(96 * 7.67), 736);
  EXPECT_EQ(gpunet_make_divisible(704 * 3.82), 2688);
  EXPECT_EQ(gpunet_make_divisible(704 * 7.95), 5600);
  EXPECT_EQ(gpunet_make_divisible(64 * 5.0), 320);
  EXPECT_EQ(gpunet_make_divisible(3.0), 8);   // the minimum
  EXPECT_EQ(gpunet_make_divisible(12.0), 16); // ties go up
  EXPECT_EQ(gpunet_make_divisible(9.0), 16);  // 8 < 0.9 * 9.5? no: 8 < 8.1 -> +8
}

// Spatial sizes follow the padding rules, seen through the MAC count: head
// 32 -> 16 (3x3 s2 p1), conv keeps 16, the stride-2 fused_irb conv is
// unpadded: floor((16 - 3) / 2) + 1 = 7, not 8; irb keeps 7.
TEST(Gpunet, PaddingRulesGiveTheReferenceSpatialSizes) {
  ModelOptions o;
  o.num_classes = 10;
  auto net = make_gpunet(parse_gpunet(tiny_config(), "tiny"), o);
  const int64_t head = 16 * 16 * 8 * 3 * 9, conv = 16 * 16 * 8 * 8 * 9;
  const int64_t fused = 7 * 7 * 16 * 8 * 9 + 7 * 7 * 8 * 16;  // mid = make_divisible(16) = 16
  // irb: mid 24, SE width round(24 * 0.25 / 3) = 2
  const int64_t irb = 7 * 7 * 24 * 8 + 7 * 7 * 24 * 25 + (24 * 2 + 2 * 24) + 7 * 7 * 8 * 24;
  const int64_t tail = 7 * 7 * 16 * 8 + 16 * 10;
  EXPECT_EQ(count_macs(*net, 32), head + conv + fused + irb + tail);
  const auto sd = state_dict(*net);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [k, t] : sd) shapes[k] = t.sizes().vec();
  EXPECT_EQ(shapes.at("network.stage: 3 layer5.se.conv_reduce.weight"), (std::vector<int64_t>{2, 24, 1, 1}));
  EXPECT_EQ(shapes.at("network.stage: 2 layer4.conv_exp.weight"), (std::vector<int64_t>{16, 8, 3, 3}));
  EXPECT_EQ(shapes.at("network. layer6.net.6.weight"), (std::vector<int64_t>{10, 16}));
  net->eval();
  torch::NoGradGuard no_grad;
  EXPECT_EQ(net->forward(torch::randn({2, 3, 32, 32})).sizes().vec(), (std::vector<int64_t>{2, 10}));
}

// GPUNET_SPEC.md 2.2: eps 1e-3 in the non-distill builder, 1e-5 in the distill one.
TEST(Gpunet, BatchNormEpsilonPerBuilder) {
  for (const char* name : {"gpunet-0", "gpunet-d1"}) {
    auto net = build_model(find_architecture(name), {});
    const double expected = std::string(name) == "gpunet-0" ? 1e-3 : 1e-5;
    int seen = 0;
    for (const auto& m : net->modules(false)) {
      if (auto* bn = m->as<models::BatchNorm2d>()) {
        EXPECT_EQ(bn->options.eps(), expected) << name;
        ++seen;
      }
    }
    EXPECT_GT(seen, 10) << name;
  }
}

TEST(Gpunet, SafetensorsRoundTripGivesIdenticalLogits) {
  for (const char* name : {"gpunet-0", "gpunet-d1"}) {
    const auto& arch = find_architecture(name);
    torch::manual_seed(1);
    auto a = build_model(arch, {});
    a->train();
    {
      // A few training-mode passes so the running statistics are not the init's 0/1.
      torch::NoGradGuard no_grad;
      for (int i = 0; i < 2; ++i) a->forward(torch::randn({2, 3, 96, 96}));
    }
    const std::string path = temp_path(std::string(name) + ".safetensors");
    save_safetensors(path, state_dict(*a), {{"arch", name}});
    torch::manual_seed(2);
    auto b = build_model(arch, {});
    load_state_dict(*b, load_safetensors(path), path);
    fs::remove(path);
    a->eval();
    b->eval();
    torch::NoGradGuard no_grad;
    const auto x = torch::randn({2, 3, 96, 96});
    const auto la = a->forward(x), lb = b->forward(x);
    EXPECT_TRUE(torch::equal(la, lb)) << name;
    EXPECT_GT(la.abs().sum().item<double>(), 0.0);
  }
}

TEST(Gpunet, TrainModeForwardIsDeterministicWithoutDropPathAndDropout) {
  ModelOptions o;
  o.drop_path = 0;
  o.dropout = 0;
  auto net = build_model(find_architecture("gpunet-0"), o);
  net->train();
  const auto x = torch::randn({4, 3, 64, 64});
  torch::NoGradGuard no_grad;
  const auto y1 = net->forward(x), y2 = net->forward(x);
  EXPECT_TRUE(torch::equal(y1, y2));

  // The same network with its default drop-path (0.2) draws masks: outputs differ
  // in training and not in eval, where drop-path and dropout are identities.
  torch::manual_seed(3);
  auto stochastic = build_model(find_architecture("gpunet-0"), {});
  stochastic->train();
  EXPECT_FALSE(torch::equal(stochastic->forward(x), stochastic->forward(x)));
  stochastic->eval();
  EXPECT_TRUE(torch::equal(stochastic->forward(x), stochastic->forward(x)));
}

// GPUNET_SPEC.md section 7's drop_path column for GPUNet-0 (0.2 * j / 14).
TEST(Gpunet, DropPathRatesFollowTheReferenceRule) {
  const auto& d = *find_architecture("gpunet-0").gpunet;
  const auto rates = gpunet_drop_path_rates(d, 0.2);
  ASSERT_EQ(rates.size(), 14u);
  EXPECT_NEAR(rates[1], 0.0286, 5e-5);   // stage: 1 layer3
  EXPECT_NEAR(rates[4], 0.0714, 5e-5);   // stage: 2 layer6
  EXPECT_NEAR(rates[12], 0.1857, 5e-5);  // stage: 6 layer14
  for (double r : gpunet_drop_path_rates(*find_architecture("gpunet-d1").gpunet, 0.2)) EXPECT_EQ(r, 0.0);
}

// timm's drop_path: whole samples kept with probability 1 - p, scaled by 1 / (1 - p).
TEST(Gpunet, DropPathDropsWholeSamplesAndKeepsTheExpectation) {
  torch::manual_seed(4);
  const auto x = torch::ones({20000, 3, 2, 2});
  const auto y = models::drop_path(x, 0.25, /*training=*/true);
  const auto per_sample = y.flatten(1);
  const auto first = per_sample.select(1, 0);
  EXPECT_TRUE(torch::equal(per_sample, first.unsqueeze(1).expand_as(per_sample))) << "a sample is kept or dropped whole";
  const auto kept = first.gt(0);
  EXPECT_TRUE(torch::allclose(first.masked_select(kept), torch::full({1}, 1 / 0.75)));
  EXPECT_NEAR(kept.to(torch::kDouble).mean().item<double>(), 0.75, 0.01);
  EXPECT_NEAR(y.mean().item<double>(), 1.0, 0.015);
  EXPECT_TRUE(torch::equal(models::drop_path(x, 0.25, /*training=*/false), x));
  EXPECT_TRUE(torch::equal(models::drop_path(x, 0.0, /*training=*/true), x));
}

TEST(Gpunet, EmaAveragesGpunetWeightsAndBatchNormStatistics) {
  const auto& arch = find_architecture("gpunet-p0");
  auto model = build_model(arch, {});
  auto shadow = build_model(arch, {});
  train::Ema ema(shadow, *model, 0.9);
  std::vector<torch::Tensor> before;  // state_dict() shares storage with the model: copy
  for (const auto& e : state_dict(*ema.model())) before.push_back(e.second.clone());
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.add_(1.0);
    model->train();
    model->forward(torch::randn({2, 3, 64, 64}));  // moves running stats, counts a batch
  }
  ema.update(*model);
  const auto after = state_dict(*ema.model());
  const auto current = state_dict(*model);
  for (size_t i = 0; i < after.size(); ++i) {
    const auto& key = after[i].first;
    if (after[i].second.is_floating_point()) {
      const auto expected = before[i] * 0.9 + current[i].second * 0.1;
      EXPECT_TRUE(torch::allclose(after[i].second, expected, 1e-6, 1e-6)) << key;
    } else {
      EXPECT_TRUE(torch::equal(after[i].second, current[i].second)) << key;
    }
  }
}

TEST(Gpunet, UserJsonFileBuildsAndCheckpointsCarryItsDefinition) {
  const std::string path = temp_path("tiny.json");
  write_text(path, tiny_config().dump(2));
  const auto& arch = find_architecture(path);
  EXPECT_TRUE(arch.from_file);
  EXPECT_EQ(arch.preprocessing.input_size, 32);
  const auto meta = architecture_meta(arch);
  ASSERT_TRUE(meta.contains("arch_definition"));
  fs::remove(path);  // a checkpoint must rebuild without the file
  const auto& again = architecture_of_checkpoint(meta, "ckpt");
  EXPECT_TRUE(*again.gpunet == *arch.gpunet);
  EXPECT_TRUE(same_architecture(arch, meta));
  EXPECT_FALSE(same_architecture(find_architecture("gpunet-0"), meta));
  // A built-in GPUNet is recorded by name alone; its definition file matches it.
  EXPECT_FALSE(architecture_meta(find_architecture("gpunet-0")).contains("arch_definition"));
}

TEST(Gpunet, BadDefinitionsNameTheLayerTheFieldAndWhatWasExpected) {
  EXPECT_CONTAINS(error_of(nlohmann::json::object({{"layer_type", "data"}})), ("top level is an object; expected a list"));
  auto c = tiny_config();
  c[3]["layer_type"] = "mbconv";
  EXPECT_CONTAINS(error_of(c), ("layer 3: unknown layer_type \"mbconv\""));
  EXPECT_CONTAINS(error_of(c), ("head, conv, irb, fused_irb, tail"));

  c = tiny_config();
  c[4].erase("kernel_size");
  EXPECT_CONTAINS(error_of(c), ("layer 4 (irb): field 'kernel_size' is missing"));

  c = tiny_config();
  c[4]["num_in_channels"] = 16;
  EXPECT_CONTAINS(error_of(c), ("layer 4 (irb): field 'num_in_channels' is 16; expected 8, the num_out_channels of layer 3"));

  c = tiny_config();
  c[1]["num_in_channels"] = 1;
  EXPECT_CONTAINS(error_of(c), ("layer 1 (head): field 'num_in_channels' is 1; expected 3"));

  c = tiny_config();
  c[2]["act"] = "gelu";
  EXPECT_CONTAINS(error_of(c), ("layer 2 (conv): field 'act' is the string \"gelu\"; expected \"relu\" or \"swish\""));

  c = tiny_config();
  c[2]["stride"] = 1.5;
  EXPECT_CONTAINS(error_of(c), ("layer 2 (conv): field 'stride' is the number 1.5; expected an integer in 1 .. 64"));

  c = tiny_config();
  c[0].erase("distill");
  EXPECT_CONTAINS(error_of(c), ("layer 0 (data): field 'distill' is missing"));

  c = tiny_config();
  c.erase(5);
  EXPECT_CONTAINS(error_of(c), ("expected the list to end with a tail"));

  c = tiny_config();
  c[2] = "conv";
  EXPECT_CONTAINS(error_of(c), ("layer 2 is the string \"conv\"; expected a layer object"));

  c = tiny_config();
  c[0]["distill"] = true;  // the distill builder has no conv
  EXPECT_CONTAINS(error_of(c), ("layer 2: unknown layer_type \"conv\"; the distill=true builder"));

  const std::string bad = temp_path("bad.json");
  write_text(bad, "[{\"layer_type\": \"data\",");
  try {
    find_architecture(bad);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), (bad + ": not valid JSON"));
  }
  fs::remove(bad);
}

// Hostile definitions (issue 21): refused by the validator, naming the file
// and the limit, before LibTorch is asked for any memory.
TEST(Gpunet, HostileDefinitionsAreRefusedWithTheLimit) {
  auto c = tiny_config();
  c[2]["num_out_channels"] = 1000000000000LL;
  EXPECT_CONTAINS(error_of(c), ("layer 2 (conv): field 'num_out_channels' is the integer 1000000000000; expected an "
                                "integer in 1 .. 65536"));
  c = tiny_config();
  c[2]["kernel_size"] = 101;
  EXPECT_CONTAINS(error_of(c), ("field 'kernel_size' is the integer 101; expected an integer in 1 .. 31"));
  c = tiny_config();
  c[0]["img_resolution"] = 100000;
  EXPECT_CONTAINS(error_of(c), ("field 'img_resolution' is the integer 100000; expected an integer in 1 .. 8192"));

  // Strided layers shrink 4 px to 2 before an unpadded 3x3 (found by fuzz_gpunet_build).
  c = tiny_config();
  c[0]["img_resolution"] = 4;
  EXPECT_CONTAINS(error_of(c), ("layer 3 (fused_irb): its 3x3 conv (stride 2, padding 0) needs at least 3 px; the "
                                "image is 2 px here at img_resolution 4"));

  // A squeeze-excite of round(8 x 0.25 / 5) = 0 channels (found by fuzz_gpunet_build).
  c = tiny_config();
  c[1]["num_out_channels"] = 1;
  c[2]["num_in_channels"] = 1;
  c[2]["num_out_channels"] = 1;
  c[3]["num_in_channels"] = 1;
  c[3]["expansion"] = 5;
  c[3]["use_se"] = true;
  EXPECT_CONTAINS(error_of(c), ("layer 3 (fused_irb): field 'use_se' is true; expected false for 1 input channels "
                                "(its squeeze-excite would have round(8 x 0.25 / expansion) = 0 channels)"));

  // Each field within bounds, the whole too large: 65536 x 65536 x 31 x 31 weights.
  c = tiny_config();
  c[2]["num_out_channels"] = 65536;
  c[2]["kernel_size"] = 31;
  c[3]["num_in_channels"] = 65536;
  c[3]["num_out_channels"] = 65536;
  c[3]["kernel_size"] = 31;
  c[3]["stride"] = 1;  // padded: the image stays large enough for the kernel
  EXPECT_CONTAINS(error_of(c), ("million weights; the limit is 2000 million (8 GB in fp32)"));

  const std::string deep = temp_path("deep.json");
  write_text(deep, std::string(100000, '[') + std::string(100000, ']'));
  try {
    find_architecture(deep);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), (deep + ": JSON nested deeper than 64 levels"));
  }
  fs::remove(deep);
}

TEST(Json, NonUtf8BytesAreEscapedNotAnError) {
  const std::string name = std::string("caf\xc3\xa9/\xff\xfe-\xe9.jpg");
  EXPECT_EQ(utf8_escaped(name), "caf\xc3\xa9/\\xff\\xfe-\\xe9.jpg");
  // Overlong forms and UTF-16 surrogates are not UTF-8 either (RFC 3629).
  EXPECT_EQ(utf8_escaped("\xc0\xaf\xed\xa0\x80"), "\\xc0\\xaf\\xed\\xa0\\x80");
  nlohmann::ordered_json j{{"path", name}, {std::string("k\x80"), {1, std::string("\xff")}}};
  const std::string text = dump_json(j);
  EXPECT_EQ(text, "{\"path\":\"caf\xc3\xa9/\\\\xff\\\\xfe-\\\\xe9.jpg\",\"k\\\\x80\":[1,\"\\\\xff\"]}");
  EXPECT_EQ(parse_json(text, "test")["path"], "caf\xc3\xa9/\\xff\\xfe-\\xe9.jpg");
  // 64 levels are accepted, 65 are not.
  EXPECT_NO_THROW(parse_json(std::string(64, '[') + std::string(64, ']'), "test"));
  EXPECT_THROW(parse_json(std::string(65, '[') + std::string(65, ']'), "test"), Error);
}

TEST(Gpunet, DropPathOnArchsWithoutItIsAnError) {
  ModelOptions o;
  o.drop_path = 0.1;
  EXPECT_THROW(build_model(find_architecture("gpunet-d1"), o), Error);
  EXPECT_THROW(build_model(find_architecture("resnet50"), o), Error);
  EXPECT_NO_THROW(build_model(find_architecture("gpunet-0"), o));
}

}  // namespace
}  // namespace convnets
