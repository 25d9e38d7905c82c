// Telling weights formats apart by validation: every safetensors header length, the pre-1.6 pickle by its magic, the rest by what it is not.
#include "core/error.h"
#include "io/safetensors.h"
#include "io/weights_format.h"
#include "runtime/checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

namespace convnets {
namespace {

namespace fs = std::filesystem;

const std::string kEntry = R"("w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]})";

// A safetensors file in memory whose header is `len` bytes, padded with spaces as the reference writer pads it: a
// two-byte tensor where its entry fits, an empty file where only "{}" does, and a header that is not JSON below that.
std::string safetensors_of_header_length(std::uint64_t len) {
  const bool tensor = len >= kEntry.size() + 2;
  std::string header = tensor ? "{" + kEntry + "}" : "{}";
  header.resize(len, ' ');
  std::string file(8, '\0');
  std::memcpy(file.data(), &len, 8);
  return file + header + (tensor ? "\x01\x02" : "");
}

std::string message_of(const std::string& bytes, const std::string& name = "in memory") {
  try {
    weights_format(bytes.data(), bytes.size(), name);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(WeightsFormat, EveryHeaderLengthIsSafetensorsWhateverItsFirstBytesLookLike) {
  // Lengths 0 to 2^17 in steps of 8 (the reference pads to 8) put every pair of first bytes a padded header can
  // start with in front of the detection, 0x80 0x02 (a pickle's PROTO 2) and "PK"-like ones among them.
  int checked = 0;
  for (std::uint64_t len = 0; len <= (std::uint64_t{1} << 17); len += 8) {
    const std::string file = safetensors_of_header_length(len);
    if (len < 2) {
      EXPECT_NE(message_of(file).find("not valid JSON"), std::string::npos) << message_of(file);
      continue;
    }
    ASSERT_EQ(weights_format(file.data(), file.size(), "len " + std::to_string(len)), WeightsFormat::Safetensors)
        << "header length " << len << " (first bytes 0x" << std::hex << (len & 0xff) << " 0x" << ((len >> 8) & 0xff)
        << ")";
    ++checked;
  }
  EXPECT_EQ(checked, (1 << 14));
  EXPECT_EQ(safetensors_of_header_length(640).substr(0, 2), std::string("\x80\x02", 2));
}

TEST(WeightsFormat, ThePre16PickleIsRefusedByItsMagicNumberAndAnythingElseByWhatItIsNot) {
  // torch.save(..., _use_new_zipfile_serialization=False) begins with its magic number pickled, PROTO 2 ...
  const std::string magic("\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 12);
  const std::string legacy2 = std::string("\x80\x02", 2) + magic + ".";
  // ... or, with pickle_protocol=4, PROTO 4 and a FRAME first.
  const std::string legacy4 = std::string("\x80\x04\x95\x0d\x00\x00\x00\x00\x00\x00\x00", 11) + magic + ".";
  for (const auto& file : {legacy2, legacy4}) {
    EXPECT_NE(message_of(file, "old.pth").find("old.pth: a torch.save file in the legacy format"), std::string::npos)
        << message_of(file, "old.pth");
  }
  // Two bytes that look like a pickle and nothing else: neither format, and said so.
  std::string pickle_like = std::string("\x80\x02", 2) + std::string(100, 'x');
  const std::string not_either = message_of(pickle_like, "odd.bin");
  EXPECT_NE(not_either.find("safetensors file 'odd.bin': header length"), std::string::npos) << not_either;
  EXPECT_NE(not_either.find("nor is it a torch.save archive (a zip holding data.pkl) or a pre-1.6 torch.save pickle"),
            std::string::npos)
      << not_either;
  // A zip's signature and no archive behind it: the zip reader's reason first.
  const std::string zip_like = std::string("PK\x03\x04", 4) + std::string(60, '\0');
  const std::string not_zip = message_of(zip_like, "cut.pth");
  EXPECT_NE(not_zip.find("cut.pth: not a readable torch.save archive"), std::string::npos) << not_zip;
  EXPECT_NE(not_zip.find("; nor is it a safetensors file"), std::string::npos) << not_zip;
  EXPECT_EQ(not_zip.find('\n'), std::string::npos) << "one line: " << not_zip;
}

class WeightsFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("convnets_wf_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(WeightsFiles, PyTorchsArchivesAreTorchSaveAndHeadersOfPickleLikeLengthsLoadAsSafetensors) {
  // torch.save's own zip archives (fuzz/make_seeds.py wrote them with torch.save).
  const auto corpus = fs::path(__FILE__).parent_path().parent_path() / "fuzz/corpus/torch_save";
  for (const char* name : {"state_dict.pth", "checkpoint.pth.tar"}) {
    EXPECT_EQ(weights_format((corpus / name).string()), WeightsFormat::TorchSave) << name;
    EXPECT_NE(runtime::load_checkpoint((corpus / name).string()).torch_save, nullptr) << name;
  }
  // Headers whose lengths begin 0x80 0..5 (a pickle's PROTO) and one above 65,536: files the two-byte guess took for
  // pickles, read by the commands' loader as what they are.
  for (const std::uint64_t len : {128, 384, 640, 896, 1152, 1408, 65536 + 640}) {
    const auto file = path("h" + std::to_string(len) + ".safetensors");
    std::ofstream(file, std::ios::binary) << safetensors_of_header_length(len);
    const auto ckpt = runtime::load_checkpoint(file);
    EXPECT_EQ(ckpt.torch_save, nullptr) << len;
    ASSERT_EQ(ckpt.file.tensors.size(), 1u) << len;
    EXPECT_TRUE(torch::equal(ckpt.file.tensors[0].second, torch::tensor({1, 2}, torch::kUInt8))) << len;
  }
  // A missing path and a folder are named as such.
  try {
    weights_format(path("absent.pth"));
    ADD_FAILURE() << "a missing file was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotFound);
    EXPECT_NE(std::string(e.what()).find("absent.pth"), std::string::npos) << e.what();
  }
  EXPECT_THROW(weights_format(dir_.string()), Error);
}

}  // namespace
}  // namespace convnets
