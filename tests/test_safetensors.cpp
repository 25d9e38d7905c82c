// safetensors reader/writer: bit-exact round trips, a clear error for every malformed file, and the background writer.
#include "core/error.h"
#include "core/crc32c.h"
#include "io/safetensors.h"
#include "runtime/background_save.h"
#include "runtime/checkpoint.h"  // kCheckpointFormat
#include "test_util.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>

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

  // XORs the byte at `at` (from the file's end when negative) with `mask`.
  static void flip(const std::string& file, std::streamoff at, char mask) {
    std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
    f.seekg(at, at < 0 ? std::ios::end : std::ios::beg);
    const auto where = f.tellg();
    const char c = static_cast<char>(f.get() ^ mask);
    f.seekp(where);
    f.put(c);
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

TEST(Crc32c, MatchesRfc3720sCheckValues) {
  const std::string digits = "123456789";
  unsigned char zeros[32] = {}, ones[32], up[32];
  for (int i = 0; i < 32; ++i) ones[i] = 0xff, up[i] = static_cast<unsigned char>(i);
  for (auto crc : {&crc32c, &crc32c_portable}) {
    EXPECT_EQ(crc(digits.data(), digits.size(), 0), 0xE3069283u);
    EXPECT_EQ(crc(zeros, 32, 0), 0x8A9136AAu);
    EXPECT_EQ(crc(ones, 32, 0), 0x62A8AB43u);
    EXPECT_EQ(crc(up, 32, 0), 0x46DD794Eu);
  }
}

// Each implementation a case of its own, so that one this CPU lacks is reported skipped, not passed.
class Crc32cPaths : public ::testing::TestWithParam<Crc32cPath> {};

TEST_P(Crc32cPaths, MatchTheTableOnEveryLengthAndCopyWhatTheySum) {
  const Crc32cPath path = GetParam();
  if (!crc32c_available(path)) GTEST_SKIP() << "this CPU lacks the instructions of this path";
  // Around each path's rounds (16-byte folds, 64- and 256-byte rounds, three 4-KiB lanes), at unaligned starts, and
  // continued from any split: one value, the table's.
  const std::string digits = "123456789";
  std::vector<unsigned char> bytes(40000);
  std::mt19937 rng(7);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  EXPECT_EQ(crc32c_on(path, digits.data(), digits.size()), 0xE3069283u);
  for (std::size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 79, 80, 127, 128, 255, 256, 257, 271, 511, 512, 767,
                        1000, 12287, 12288, 12289, 36865}) {
    for (std::size_t offset : {0, 1, 5}) {
      const unsigned char* p = bytes.data() + offset;
      const auto whole = crc32c_on(path, p, n);
      EXPECT_EQ(whole, crc32c_portable(p, n)) << n << " bytes at +" << offset;
      EXPECT_EQ(crc32c_on(path, p + n / 3, n - n / 3, crc32c_on(path, p, n / 3)), whole)
          << n << " bytes split at " << n / 3;
      EXPECT_EQ(crc32c(p, n), whole);
      // The copy that checksums what it copies: the same value, every byte where it belongs and none past them,
      // the destination misaligned differently from the source.
      const std::size_t to = 7 - offset;
      std::vector<unsigned char> copy(n + 9, 0xa5);
      EXPECT_EQ(crc32c_copy_on(path, copy.data() + to, p, n), whole) << n << " bytes copied to +" << to;
      EXPECT_TRUE(std::equal(p, p + n, copy.data() + to)) << n << " bytes copied to +" << to;
      EXPECT_EQ(std::count(copy.begin(), copy.begin() + to, 0xa5) + std::count(copy.begin() + to + n, copy.end(), 0xa5),
                static_cast<long>(copy.size() - n))
          << n << " bytes copied to +" << to << ": bytes outside the destination written";
      EXPECT_EQ(crc32c_copy(copy.data(), p, n), whole);
    }
  }
}

std::string path_name(const ::testing::TestParamInfo<Crc32cPath>& info) {
  static const char* const names[] = {"Vpclmul512", "Pclmul", "Sse42", "Table"};
  return names[static_cast<int>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(Crc32c, Crc32cPaths,
                         ::testing::Values(Crc32cPath::Vpclmul512, Crc32cPath::Pclmul, Crc32cPath::Sse42,
                                           Crc32cPath::Table),
                         path_name);

std::string header_of(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  uint64_t len = 0;
  in.read(reinterpret_cast<char*>(&len), 8);
  std::string h(len, '\0');
  in.read(h.data(), static_cast<std::streamsize>(len));
  return h;
}

TEST_F(Safetensors, EveryTensorCarriesItsChecksumAndAChangedByteIsNamed) {
  const auto a = torch::arange(16, torch::kFloat32), b = torch::ones({8}, torch::kFloat16);
  const auto file = path("c.safetensors");
  save_safetensors(file, {{"a", a}, {"b", b}}, {{"k", "v"}});
  // What any reader sees: __metadata__'s key holds each tensor's CRC-32C as 8 hex digits.
  const auto meta = nlohmann::json::parse(header_of(file)).at("__metadata__");
  const auto sums = nlohmann::json::parse(meta.at(kChecksumKey).get<std::string>());
  char expected[9];
  std::snprintf(expected, sizeof expected, "%08x", crc32c(a.data_ptr(), 64));
  EXPECT_EQ(sums.at("a"), expected);
  std::snprintf(expected, sizeof expected, "%08x", crc32c(b.data_ptr(), 16));
  EXPECT_EQ(sums.at("b"), expected);
  const auto back = load_safetensors(file);
  EXPECT_EQ(back.metadata, (std::map<std::string, std::string>{{"k", "v"}})) << "the checksums are the reader's";
  // Re-saving what was loaded, changed, writes the new bytes' checksums, not the old ones.
  auto changed = back.tensors;
  changed[0].second.add_(1);
  save_safetensors(path("resaved.safetensors"), changed, back.metadata);
  EXPECT_TRUE(torch::equal(load_safetensors(path("resaved.safetensors")).tensors[0].second, a + 1));

  // A save without checksums handed metadata with stale ones (a tool that copies a loaded file's metadata
  // whole): they are not written, so the file loads with the bytes it holds.
  auto stale = back.metadata;
  stale[kChecksumKey] = R"({"a":"00000000","b":"00000000"})";
  stale[kHeaderChecksumKey] = R"({"a":"00000000","b":"00000000"})";
  save_safetensors(path("unsummed.safetensors"), changed, stale, FileChecksums::None);
  const auto unsummed = load_safetensors(path("unsummed.safetensors"));
  EXPECT_EQ(unsummed.verified, TensorFile::Verified::Nothing);
  EXPECT_TRUE(torch::equal(unsummed.tensors[0].second, a + 1));
  EXPECT_EQ(unsummed.metadata, back.metadata);

  // One byte of b's data (the file's last) flipped: b is named, with what was written and what was read.
  flip(file, -1, 0x10);
  expect_error(file, {"c.safetensors", "tensor 'b'", "CRC-32C", "another copy"});

  // A file of more chunks than the loader reads ahead (12 MiB): the same sums, and a byte changed in the middle tensor
  // named.
  const NamedTensors large = {{"x", torch::randn({1 << 20})}, {"y", torch::randn({1 << 20})}, {"z", torch::randn({1 << 20})}};
  const auto big = path("big.safetensors");
  save_safetensors(big, large);
  const auto big_sums = nlohmann::json::parse(
      nlohmann::json::parse(header_of(big)).at("__metadata__").at(kChecksumKey).get<std::string>());
  std::snprintf(expected, sizeof expected, "%08x", crc32c(large[1].second.data_ptr(), 4u << 20));
  EXPECT_EQ(big_sums.at("y"), expected);
  EXPECT_EQ(load_safetensors(big).tensors.size(), 3u);
  flip(big, 8 + static_cast<std::streamoff>(header_of(big).size()) + (4 << 20) + 12345, 0x5a);
  expect_error(big, {"big.safetensors", "tensor 'y'", "CRC-32C"});
}

// The file with its header replaced by `edit(header)`'s, padded to 8 bytes, and its data section as it was.
void rewrite_header(const std::string& file, const std::function<void(nlohmann::ordered_json&)>& edit) {
  std::ifstream in(file, std::ios::binary);
  uint64_t len = 0;
  in.read(reinterpret_cast<char*>(&len), 8);
  std::string header(len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(len));
  const std::string data{std::istreambuf_iterator<char>(in), {}};
  in.close();
  auto j = nlohmann::ordered_json::parse(header);
  edit(j);
  header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  len = header.size();
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << header << data;
}

// A __metadata__ checksum map of the header, as JSON, for edits.
nlohmann::ordered_json sums_in(const nlohmann::ordered_json& header, const char* key) {
  return nlohmann::ordered_json::parse(header.at("__metadata__").at(key).get<std::string>());
}

TEST_F(Safetensors, EveryHeaderEntryIsCheckedAsItsBytesAre) {
  // Two tensors of the same byte count, so that a relabelled dtype, a reshaped shape or swapped offsets leave the
  // bytes' checksums and the offsets' consistency intact: only the header entries' checksums can tell.
  const NamedTensors tensors = {{"a", torch::arange(16, torch::kFloat32).reshape({4, 4})},
                                {"b", torch::arange(16, torch::kFloat32).flip(0).reshape({4, 4})},
                                {"steps", torch::tensor(int64_t{7})}};
  const auto original = path("orig.safetensors");
  save_safetensors(original, tensors, {{"k", "v"}});
  EXPECT_EQ(load_safetensors(original).verified, TensorFile::Verified::BytesAndHeader);
  int case_number = 0;
  auto edited = [&](const std::function<void(nlohmann::ordered_json&)>& edit) {
    const auto file = path("edit" + std::to_string(++case_number) + ".safetensors");
    fs::copy_file(original, file);
    rewrite_header(file, edit);
    return file;
  };
  const char* edited_hint = "the file was edited after it was written";
  // Each field of an entry changed: the tensor is named, with what its entry says now.
  expect_error(edited([](auto& h) { h["a"]["dtype"] = "I32"; }),
               {"tensor 'a'", "its header entry (dtype I32", "does not match the CRC-32C", edited_hint});
  expect_error(edited([](auto& h) { h["b"]["shape"] = {16}; }), {"tensor 'b'", "shape [16]", "CRC-32C"});
  expect_error(edited([](auto& h) { std::swap(h["a"]["data_offsets"], h["b"]["data_offsets"]); }),
               {"tensor 'a'", "data_offsets [64, 128]", "CRC-32C"});
  // A renamed tensor has no entry in either map, and the maps name one the file lacks.
  expect_error(edited([](auto& h) {
                 h["c"] = h["b"];
                 h.erase("b");
               }),
               {"names tensor 'b', which the file does not hold"});
  // One tensor's entry removed from either map, or the bytes' map removed whole: refused, the tensor named.
  for (const char* key : {kChecksumKey, kHeaderChecksumKey}) {
    expect_error(edited([&](auto& h) {
                   auto sums = sums_in(h, key);
                   sums.erase("b");
                   h["__metadata__"][key] = sums.dump();
                 }),
                 {"tensor 'b'", "no checksum in __metadata__", key, edited_hint});
  }
  expect_error(edited([](auto& h) { h["__metadata__"].erase(kChecksumKey); }),
               {"holds convnets.crc32c.header but not convnets.crc32c"});
  // Without the header's map a file reads as convnets wrote files before it (their bytes checked), and a
  // checkpoint's record, which says what was summed, refuses that (runtime/checkpoint.cpp).
  const auto bytes_only = edited([](auto& h) { h["__metadata__"].erase(kHeaderChecksumKey); });
  EXPECT_EQ(load_safetensors(bytes_only).verified, TensorFile::Verified::Bytes);
  const auto none = edited([](auto& h) {
    h["__metadata__"].erase(kHeaderChecksumKey);
    h["__metadata__"].erase(kChecksumKey);
  });
  EXPECT_EQ(load_safetensors(none).verified, TensorFile::Verified::Nothing);
  // The entry's checksum is of its fields, not of the JSON's spelling: spaces and key order may change.
  const auto respelled = edited([](auto& h) {
    nlohmann::ordered_json a = nlohmann::ordered_json::object();
    a["data_offsets"] = h["a"]["data_offsets"];
    a["shape"] = h["a"]["shape"];
    a["dtype"] = h["a"]["dtype"];
    h["a"] = a;
  });
  EXPECT_EQ(load_safetensors(respelled).tensors.size(), 3u);
}

TEST_F(Safetensors, ACheckpointWhoseRecordSaysItWasSummedLoadsOnlyWithItsChecksums) {
  const auto file = path("last.safetensors");
  const nlohmann::json meta = {{"format", runtime::kCheckpointFormat}, {"arch", "resnet18"}, {"num_classes", 10},
                               {"epoch", 1}, {"step", 2}, {"config", nlohmann::json::object()},
                               {"preprocessing", nlohmann::json::object()}};
  runtime::save_checkpoint(file, {{"model.w", torch::ones({3})}}, meta);
  EXPECT_EQ(runtime::load_checkpoint(file).meta.at("checksums"), runtime::kCheckpointChecksums);
  rewrite_header(file, [](auto& h) {
    h["__metadata__"].erase(kChecksumKey);
    h["__metadata__"].erase(kHeaderChecksumKey);
  });
  try {
    runtime::load_checkpoint(file);
    ADD_FAILURE() << "a checkpoint whose checksums were removed loaded";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(file + ": its metadata says every tensor's bytes and header entry were summed"), std::string::npos)
        << what;
  }
}

TEST_F(Safetensors, LargeFilesComeBackBitExactThroughTheReadAhead) {
  // Tensors whose bytes cross the loader's 1 MiB chunks at odd offsets, an empty one among them, over more chunks
  // than it reads ahead (about 19 MiB): every byte back where it was, with checksums and without.
  torch::manual_seed(3);
  const NamedTensors large = {{"odd", torch::randint(0, 256, {(3 << 20) + 77}, torch::kUInt8)},
                              {"empty", torch::empty({0})},
                              {"w", torch::randn({(2 << 20) + 3})},
                              {"h", torch::randn({1000003}, torch::kFloat64)}};
  for (const auto checksums : {FileChecksums::Crc32c, FileChecksums::None}) {
    const auto file = path(checksums == FileChecksums::None ? "plain.safetensors" : "summed.safetensors");
    save_safetensors(file, large, {}, checksums);
    const auto back = load_safetensors(file);
    ASSERT_EQ(back.tensors.size(), large.size()) << file;
    for (std::size_t i = 0; i < large.size(); ++i) {
      EXPECT_EQ(back.tensors[i].first, large[i].first) << file;
      EXPECT_TRUE(torch::equal(back.tensors[i].second, large[i].second)) << file << ", tensor " << large[i].first;
    }
  }
  // A byte of the first tensor changed: the load stops there, while the chunks after it are still being read ahead.
  const auto summed = path("summed.safetensors");
  flip(summed, 8 + static_cast<std::streamoff>(header_of(summed).size()) + (1 << 20) + 5, 0x01);
  expect_error(summed, {"summed.safetensors", "tensor 'odd'", "CRC-32C"});
}

TEST_F(Safetensors, ChecksumEntriesThatCannotBeTrustedAreRefused) {
  const std::string tensor = R"("a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]})";
  auto with = [&](const std::string& name, const std::string& value) {
    return raw(name, R"({"__metadata__":{"convnets.crc32c":)" + nlohmann::json(value).dump() + "}," + tensor + "}", 2);
  };
  expect_error(with("hex.safetensors", R"({"a":"12345xyz"})"), {"hex.safetensors", "'a'", "8 lower-case hex digits"});
  expect_error(with("short.safetensors", R"({"a":"1234"})"), {"'a'", "8 lower-case hex digits"});
  expect_error(with("array.safetensors", "[1]"), {"convnets.crc32c", "JSON object"});
  expect_error(with("json.safetensors", "{"), {"convnets.crc32c", "not valid JSON"});
  expect_error(with("other.safetensors", R"({"z":"00000000"})"), {"names tensor 'z'", "does not hold"});
  // Checksums Python computed from the polynomial alone (fuzz/make_seeds.py), as any other reader would: they hold.
  const auto seed = fs::path(__FILE__).parent_path().parent_path() / "fuzz/corpus/safetensors/checksummed.safetensors";
  EXPECT_EQ(load_safetensors(seed.string()).tensors.size(), 6u);
  // The right value loads (two bytes of 0x01).
  char sum[9];
  const unsigned char data[2] = {1, 1};
  std::snprintf(sum, sizeof sum, "%08x", crc32c(data, 2));
  EXPECT_EQ(load_safetensors(with("ok.safetensors", std::string(R"({"a":")") + sum + "\"}")).tensors.size(), 1u);
}


// The step changes its state as soon as save() returns: each file holds the state as it was at its own save(),
// including the first while the second waits for it to finish.
TEST_F(Safetensors, BackgroundSaveWritesTheStateAsItWasAtItsSnapshot) {
  auto a = torch::randn({4 << 20});  // 16 MiB: a write long enough for the changes below to race it
  auto b = torch::arange(1000, torch::kLong);
  const auto a0 = a.clone(), b0 = b.clone();
  const nlohmann::json meta = {{"format", runtime::kCheckpointFormat}, {"step", 1}};
  runtime::BackgroundSaver saver;
  saver.save(path("first.safetensors"), {{"a", a}, {"b", b}}, meta);
  a.add_(1);
  b.zero_();
  // The first write (16 MiB, fsynced) is still in flight: the second save holds its caller until it is done.
  const auto second = saver.save(path("second.safetensors"), {{"a", a}, {"b", b}}, meta);
  EXPECT_TRUE(second.waited()) << "the second save did not wait for the first write";
  a.add_(1);
  b.fill_(7);
  saver.wait();
  EXPECT_FALSE(saver.writing());
  EXPECT_GT(saver.last_write_s(), 0);
  const auto one = load_safetensors(path("first.safetensors"));
  const auto two = load_safetensors(path("second.safetensors"));
  EXPECT_TRUE(torch::equal(*one.find("a"), a0));
  EXPECT_TRUE(torch::equal(*one.find("b"), b0));
  EXPECT_TRUE(torch::equal(*two.find("a"), a0 + 1));
  EXPECT_TRUE(torch::equal(*two.find("b"), torch::zeros_like(b0)));
  EXPECT_EQ(nlohmann::json::parse(one.metadata.at("convnets")).value("step", 0), 1);
}

// On CUDA: the snapshot waits for the kernels queued before it (the step's, on whatever stream), copies through
// pinned host buffers, and holds what the device held then, whatever the kernels queued after it do.
TEST(Gpu, BackgroundSaveSnapshotsDeviceStateAfterTheQueuedKernels) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: this check runs on the GPU machine (scripts/gpu.sh)";
  const auto dir = fs::temp_directory_path() / ("convnets_gpu_save_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto path = (dir / "last.safetensors").string();
  auto weights = torch::randn({8 << 20}, torch::kCUDA);  // 32 MiB
  const auto before = weights.cpu();
  {
    // Queued on a side stream, as a CUDA graph's step runs: the default stream's order alone would not hold the
    // snapshot's copies back behind it.
    torch::cuda::synchronize();  // the randn and the copy before it
    const c10::cuda::CUDAStreamGuard on_side(c10::cuda::getStreamFromPool(false, weights.device().index()));
    for (int i = 0; i < 20; ++i) weights.mul_(1.0001f);  // long enough to be in flight when the snapshot starts
    weights.mul_(2);
  }
  const auto expected = (before * std::pow(1.0001f, 20)) * 2;
  runtime::BackgroundSaver saver;
  saver.save(path, {{"w", weights}}, nlohmann::json{{"format", runtime::kCheckpointFormat}});
  weights.add_(1);  // after the snapshot: not in the file
  saver.wait();
  const auto file = load_safetensors(path);
  EXPECT_TRUE(torch::allclose(*file.find("w"), expected, 1e-5, 0));
  EXPECT_FALSE(file.find("w")->is_cuda());
  fs::remove_all(dir);
}

// A write that fails on its thread is not lost: the next wait() (or save()) throws it, naming the file.
TEST_F(Safetensors, BackgroundSaveFailureReachesTheNextWait) {
  runtime::BackgroundSaver saver;
  const auto missing = path("no-such-folder") + "/last.safetensors";
  saver.save(missing, {{"a", torch::ones({3})}}, nlohmann::json{{"format", runtime::kCheckpointFormat}});
  try {
    saver.wait();
    ADD_FAILURE() << "the failed write was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  saver.wait();  // reported once
}

}  // namespace
}  // namespace convnets
