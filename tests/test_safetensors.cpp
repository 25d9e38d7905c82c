// safetensors reader/writer: bit-exact round trips and a clear error for every malformed file.
#include "core/error.h"
#include "io/safetensors.h"
#include "test_util.h"

#include <torch/torch.h>

#include <filesystem>
#include <fstream>

namespace convnets {
namespace {

namespace fs = std::filesystem;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("convnets_st_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A file with a hand-written header, to build the malformed cases.
  std::string raw(const std::string& name, const std::string& header, size_t data_bytes,
                  uint64_t claimed_len = UINT64_MAX) {
    const auto p = path(name);
    std::ofstream out(p, std::ios::binary);
    const uint64_t len = claimed_len == UINT64_MAX ? header.size() : claimed_len;
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << header << std::string(data_bytes, '\x01');
    return p;
  }

  // The error message must contain every fragment.
  void expect_error(const std::string& file, std::initializer_list<const char*> fragments) {
    try {
      load_safetensors(file);
      ADD_FAILURE() << "loading " << file << " should fail";
    } catch (const Error& e) {
      const std::string msg = std::string(e.what()) + " " + e.hint();
      for (const char* f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
    }
  }

  fs::path dir_;
};

TEST_F(Safetensors, RoundTripIsBitExactForEveryDtypeWithMetadata) {
  torch::manual_seed(3);
  NamedTensors tensors = {
      {"z.f32", torch::randn({3, 5})},
      {"a.f16", torch::randn({4}).to(torch::kFloat16)},
      {"m.bf16", torch::randn({2, 3}).to(torch::kBFloat16)},
      {"f64", torch::randn({2}, torch::kFloat64)},
      {"num_batches_tracked", torch::tensor(int64_t{42})},
      {"i32", torch::arange(6, torch::kInt32).reshape({2, 3})},
      {"i16", torch::arange(3, torch::kInt16)},
      {"i8", torch::tensor({-1, 2}, torch::kInt8)},
      {"u8", torch::tensor({0, 255}, torch::kUInt8)},
      {"mask", torch::tensor({true, false})},
      {"empty", torch::empty({0, 4})},
      {"strided", torch::randn({4, 6}).t()},  // non-contiguous input is written in logical order
  };
  const std::map<std::string, std::string> meta = {{"arch", "resnet50"}, {"format", "pt"}};
  save_safetensors(path("w.safetensors"), tensors, meta);
  const auto back = load_safetensors(path("w.safetensors"));
  EXPECT_EQ(back.metadata, meta);
  ASSERT_EQ(back.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(back.tensors[i].first, tensors[i].first) << "file order must be write order";
    const auto& a = tensors[i].second;
    const auto& b = back.tensors[i].second;
    EXPECT_EQ(a.scalar_type(), b.scalar_type()) << tensors[i].first;
    EXPECT_EQ(a.sizes(), b.sizes()) << tensors[i].first;
    EXPECT_TRUE(torch::equal(a.contiguous(), b)) << tensors[i].first;
  }
  ASSERT_NE(back.find("mask"), nullptr);
  EXPECT_EQ(back.find("nope"), nullptr);
  // Header padded so tensor data starts 8-byte aligned.
  std::ifstream in(path("w.safetensors"), std::ios::binary);
  uint64_t len = 0;
  in.read(reinterpret_cast<char*>(&len), 8);
  EXPECT_EQ(len % 8, 0u);
}

TEST_F(Safetensors, ReadsHeadersWrittenByOtherTools) {
  // Keys out of data order, no metadata, compact JSON: what the Rust writer emits.
  const std::string header =
      R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},"a":{"dtype":"U8","shape":[2,2],"data_offsets":[0,4]}})";
  const auto f = load_safetensors(raw("other.safetensors", header, 6));
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].first, "a");
  EXPECT_EQ(f.tensors[1].first, "b");
  EXPECT_TRUE(f.metadata.empty());
}

TEST_F(Safetensors, TruncatedFileIsAClearError) {
  save_safetensors(path("full.safetensors"), {{"w", torch::randn({64, 64})}});
  const auto size = fs::file_size(path("full.safetensors"));
  fs::copy_file(path("full.safetensors"), path("cut.safetensors"));
  fs::resize_file(path("cut.safetensors"), size - 100);
  expect_error(path("cut.safetensors"), {"cut.safetensors", "'w'", "outside"});
  fs::resize_file(path("cut.safetensors"), 20);  // inside the header
  expect_error(path("cut.safetensors"), {"cut.safetensors", "header length"});
  fs::resize_file(path("cut.safetensors"), 5);
  expect_error(path("cut.safetensors"), {"cut.safetensors", "too short"});
  fs::resize_file(path("cut.safetensors"), 0);
  expect_error(path("cut.safetensors"), {"cut.safetensors", "0 bytes"});
}

TEST_F(Safetensors, HeaderThatLiesAboutSizesIsAClearError) {
  // Shape says 4 floats (16 bytes), offsets span 8.
  expect_error(raw("short.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}})", 8),
               {"'w'", "16 bytes", "span 8"});
  // Offsets beyond the data section.
  expect_error(raw("beyond.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
               {"'w'", "outside the 8-byte data section"});
  // Two tensors over the same bytes.
  expect_error(raw("overlap.safetensors",
                   R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                   6),
               {"'b'", "overlap or hole"});
  // Bytes nobody owns at the end.
  expect_error(raw("hole.safetensors", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 10),
               {"cover 4 of 10"});
  // Header length larger than the file.
  expect_error(raw("len.safetensors", R"({})", 0, 1ull << 40), {"header length", "exceeds the file"});
  // begin > end
  expect_error(raw("rev.safetensors", R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4), {"'w'"});
  // Negative dimension.
  expect_error(raw("neg.safetensors", R"({"w":{"dtype":"U8","shape":[-4],"data_offsets":[0,4]}})", 4),
               {"'w'", "non-negative"});
}

TEST_F(Safetensors, UnknownDtypeNamesTheTensorAndTheSupportedOnes) {
  expect_error(raw("dt.safetensors", R"({"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", 4),
               {"'w'", "unknown dtype \"F8_E4M3\"", "BF16"});
}

TEST_F(Safetensors, NotSafetensorsAtAll) {
  expect_error(raw("json.safetensors", "{not json", 0), {"not valid JSON"});
  expect_error(raw("array.safetensors", "[1,2]", 0), {"JSON object"});
  expect_error(raw("fields.safetensors", R"({"w":{"dtype":"F32"}})", 0), {"'w'", "data_offsets"});
  expect_error(raw("meta.safetensors", R"({"__metadata__":{"k":1}})", 0), {"__metadata__", "'k'"});
  expect_error(path("does-not-exist.safetensors"), {"cannot open", "does-not-exist.safetensors"});
}

TEST_F(Safetensors, FailedSaveLeavesTheExistingFileUntouched) {
  const auto target = path("keep.safetensors");
  save_safetensors(target, {{"w", torch::ones({3})}});
  const auto before = fs::file_size(target);
  // Complex numbers have no safetensors dtype: the save must fail before touching the file.
  EXPECT_THROW(save_safetensors(target, {{"c", torch::randn({2}, torch::kComplexFloat)}}), Error);
  EXPECT_THROW(save_safetensors(target, {{"a", torch::ones({1})}, {"a", torch::ones({1})}}), Error);
  EXPECT_THROW(save_safetensors(path("no/such/dir/x.safetensors"), {{"w", torch::ones({3})}}), Error);
  EXPECT_EQ(fs::file_size(target), before);
  EXPECT_TRUE(torch::equal(load_safetensors(target).tensors.at(0).second, torch::ones({3})));
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << "leftover " << e.path();
  }
}

}  // namespace
}  // namespace convnets
