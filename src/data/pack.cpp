#include "data/pack.h"

#include "codec/png.h"
#include "core/error.h"
#include "data/shards.h"
#include "data/tar.h"
#include "io/atomic_file.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>

namespace fs = std::filesystem;

namespace convnets::data {

namespace {

class ShardWriter {
 public:
  ShardWriter(const PackOptions& o, const std::string& split, PackSummary& summary)
      : o_(o), split_(split), summary_(summary) {}

  // Starts a new shard first when this sample would take the current one past the size.
  void add(const std::string& key, std::int64_t label, const std::vector<std::uint8_t>& image, const char* ext) {
    const std::string cls = std::to_string(label);
    const std::uint64_t bytes = 2 * tar::kBlock + cls.size() + tar::padding(cls.size()) + image.size() +
                                tar::padding(image.size());
    if (file_ && written_ + bytes > o_.shard_size) finish();
    if (!file_) start();
    std::vector<tar::Member> sample;
    sample.push_back(member(key + ".cls", cls.data(), cls.size()));
    sample.push_back(member(key + "." + ext, image.data(), image.size()));
    index_.push_back(std::move(sample));
  }

  void finish() {
    if (!file_) return;
    // End of archive: two zero blocks, then zeros to a whole 10,240-byte
    // record, as tar(1) and Python's tarfile write it.
    std::uint64_t end = written_ + 2 * tar::kBlock;
    end = (end + 10239) / 10240 * 10240;
    const std::vector<std::uint8_t> zeros(static_cast<std::size_t>(end - written_), 0);
    file_->write(zeros.data(), zeros.size());
    file_->commit();
    file_.reset();
    write_file_atomically(index_path_, dali_index_text(index_));
    summary_.bytes += end;
    if (o_.progress)
      o_.progress(path_ + ": " + std::to_string(index_.size()) + " samples, " + std::to_string(end) + " bytes");
    index_.clear();
  }

 private:
  void start() {
    char name[64];
    std::snprintf(name, sizeof name, "%s-%06zu", split_.c_str(), summary_.shards.size());
    path_ = (fs::path(o_.output) / (std::string(name) + ".tar")).string();
    index_path_ = (fs::path(o_.output) / (std::string(name) + ".idx")).string();
    file_ = std::make_unique<AtomicFile>(path_);
    summary_.shards.push_back(path_);
    written_ = 0;
  }

  tar::Member member(const std::string& name, const void* data, std::size_t size) {
    std::uint8_t header[tar::kBlock];
    tar::ustar_header(name, size, header);
    const tar::Member m{name, written_, written_ + tar::kBlock, size};
    file_->write(header, tar::kBlock);
    file_->write(data, size);
    static const std::uint8_t zeros[tar::kBlock] = {};
    file_->write(zeros, tar::padding(size));
    written_ += tar::kBlock + size + tar::padding(size);
    return m;
  }

  const PackOptions& o_;
  std::string split_, path_, index_path_;
  PackSummary& summary_;
  std::unique_ptr<AtomicFile> file_;
  std::uint64_t written_ = 0;
  std::vector<std::vector<tar::Member>> index_;
};

}  // namespace

PackSummary pack_split(const Dataset& dataset, const std::string& split, const PackOptions& o) {
  if (o.shard_size < 4096) throw Error("--shard-size " + std::to_string(o.shard_size) + ": expected at least 4096 bytes");
  std::error_code ec;
  fs::create_directories(o.output, ec);
  if (ec) throw Error(o.output + ": cannot create the output folder: " + ec.message());
  remove_stale_temporaries(o.output);
  PackSummary summary;
  summary.split = split;
  ShardOptions order;
  order.shuffle = o.shuffle;
  order.seed = o.seed;
  const auto indices = shard_indices(dataset.size(), order, 0);
  ShardWriter writer(o, split, summary);
  SampleData sample;
  std::vector<std::uint8_t> png;
  char key[32];
  for (const std::int64_t i : indices) {
    try {
      dataset.load(static_cast<std::size_t>(i), sample);
    } catch (const codec::DecodeError& e) {
      summary.skipped.push_back(e.what());
      continue;
    }
    const std::vector<std::uint8_t>* bytes = &sample.bytes;
    const char* ext = nullptr;
    if (!sample.encoded) {
      const std::string encoded = codec::encode_png(sample.pixels.pixels.data(), sample.pixels.width,
                                                    sample.pixels.height, sample.pixels.channels);
      png.assign(encoded.begin(), encoded.end());
      bytes = &png, ext = "png";
    } else {
      const auto format = codec::sniff_format(sample.bytes.data(), sample.bytes.size());
      ext = format == codec::ImageFormat::Jpeg ? "jpg" : format == codec::ImageFormat::Png ? "png" : nullptr;
      if (!ext) {
        summary.skipped.push_back(sample.name + ": neither a JPEG nor a PNG file (by its first bytes)");
        continue;
      }
      if (bytes->size() > tar::kMaxMemberBytes) {
        summary.skipped.push_back(sample.name + ": " + std::to_string(bytes->size()) + " bytes, above the " +
                                  std::to_string(tar::kMaxMemberBytes >> 20) + " MiB a shard member may have");
        continue;
      }
    }
    std::snprintf(key, sizeof key, "%09zu", summary.samples);
    writer.add(key, sample.label, *bytes, ext);
    ++summary.samples;
  }
  writer.finish();
  if (summary.samples == 0) throw Error(dataset.description() + ": no sample could be packed", join(summary.skipped));
  return summary;
}

void write_class_names(const std::vector<std::string>& classes, const std::string& output) {
  std::string text;
  for (const auto& c : classes) {
    if (c.find('\n') != std::string::npos) throw Error("class name '" + c + "' holds a line break; " + kClassesFile + " cannot list it");
    text += c + "\n";
  }
  write_file_atomically((fs::path(output) / kClassesFile).string(), text);
}

}  // namespace convnets::data
