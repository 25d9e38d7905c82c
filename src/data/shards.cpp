#include "data/shards.h"

#include "core/error.h"
#include "core/json.h"
#include "core/limits.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <list>
#include <map>
#include <memory>
#include <cctype>
#include <mutex>
#include <numeric>
#include <sstream>

namespace fs = std::filesystem;

namespace convnets::data {

namespace {

// The first {...} group of `s` at or after `from`: [open, close].
bool find_group(const std::string& s, std::size_t& open, std::size_t& close) {
  open = s.find('{');
  if (open == std::string::npos) return false;
  close = s.find('}', open);
  return true;
}

void expand_into(const std::string& pattern, const std::string& whole, std::vector<std::string>& out) {
  std::size_t open = 0, close = 0;
  if (!find_group(pattern, open, close)) {
    if (pattern.find('}') != std::string::npos)
      throw Error("shard pattern '" + whole + "': '}' without '{'");
    out.push_back(pattern);
    return;
  }
  if (close == std::string::npos) throw Error("shard pattern '" + whole + "': '{' without '}'");
  const std::string body = pattern.substr(open + 1, close - open - 1), head = pattern.substr(0, open),
                    tail = pattern.substr(close + 1);
  if (body.find('{') != std::string::npos) throw Error("shard pattern '" + whole + "': nested braces are not supported");
  std::vector<std::string> choices;
  if (const std::size_t dots = body.find(".."); dots != std::string::npos) {
    const std::string a = body.substr(0, dots), b = body.substr(dots + 2);
    std::uint64_t lo = 0, hi = 0;
    const auto pa = std::from_chars(a.data(), a.data() + a.size(), lo);
    const auto pb = std::from_chars(b.data(), b.data() + b.size(), hi);
    if (a.empty() || b.empty() || pa.ec != std::errc() || pb.ec != std::errc() || pa.ptr != a.data() + a.size() ||
        pb.ptr != b.data() + b.size())
      throw Error("shard pattern '" + whole + "': {" + body + "} is not a range of decimal numbers like {000000..000146}");
    if (hi < lo) throw Error("shard pattern '" + whole + "': the range {" + body + "} runs backwards");
    if (hi - lo >= kMaxShards)
      throw Error("shard pattern '" + whole + "': {" + body + "} names more than " + std::to_string(kMaxShards) + " shards");
    const std::size_t width = a.size();  // braceexpand pads to the first bound's width
    for (std::uint64_t v = lo; v <= hi; ++v) {
      std::string digits = std::to_string(v);
      if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
      choices.push_back(digits);
    }
  } else {
    std::stringstream ss(body);
    for (std::string item; std::getline(ss, item, ',');) choices.push_back(item);
    if (body.empty() || body.back() == ',') choices.push_back("");
    if (choices.size() < 2) throw Error("shard pattern '" + whole + "': {" + body + "} is neither a range (a..b) nor a list (a,b)");
  }
  for (const auto& c : choices) {
    if (out.size() >= kMaxShards)
      throw Error("shard pattern '" + whole + "' names more than " + std::to_string(kMaxShards) + " shards");
    expand_into(head + c + tail, whole, out);
  }
}

// An open shard file. Shared: a worker reading from it keeps it open while
// the cache may already have let it go.
struct ShardFile {
  int fd = -1;
  // Bytes from the start already asked of the kernel (posix_fadvise WILLNEED).
  std::atomic<std::uint64_t> advised{0};
  ~ShardFile() {
    if (fd >= 0) ::close(fd);
  }
};

// Read-ahead per shard: a rank streams through a shard front to back (within
// the shuffle buffer's reach), so the next window is asked for while the
// workers decode the current one, and reads become large sequential ones.
constexpr std::uint64_t kReadAhead = 16u << 20;
// Open shards kept; a rank is inside one or two at a time.
constexpr std::size_t kOpenShards = 32;

// An I/O error is the sample's problem (codec::DecodeError, like an
// unreadable image file) while loading, and stops a listing.
std::size_t pread_full(int fd, void* buf, std::size_t size, std::uint64_t offset, const std::string& name) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, static_cast<char*>(buf) + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw codec::DecodeError(name + ": read error at byte " + std::to_string(offset + done) + ": " + std::strerror(errno));
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

struct Sample {
  std::uint32_t shard = 0;
  std::uint8_t label_ext = 0;  // index into kLabelExts
  std::uint64_t image_offset = 0, label_offset = 0;
  std::uint32_t image_size = 0, label_size = 0;
  std::uint32_t key = 0;  // offset of its "key.ext" name in names_
};

const char* const kLabelExts[] = {"cls", "txt", "json"};
const char* const kImageExts[] = {"jpg", "jpeg", "png"};
// Image types a WebDataset may hold that convnets' decoders do not read.
const char* const kOtherImageExts[] = {"webp", "gif", "bmp", "tif", "tiff", "ppm", "pgm", "jxl", "avif", "heic"};

class ShardDataset : public Dataset {
 public:
  ShardDataset(const std::vector<std::string>& shards, const std::string& location) : paths_(shards) {
    if (shards.empty()) throw Error(location + ": names no .tar shards");
    files_.resize(shards.size());
    std::map<std::string, std::size_t> skipped;
    std::vector<std::string> examples;
    std::size_t indexed = 0;
    for (std::size_t s = 0; s < shards.size(); ++s) {
      const tar::Listing listing = list(s, indexed);
      for (const auto& why : listing.skipped) note(shards[s] + ": " + why, "not a sample file", skipped, examples);
      if (listing.truncated) note(shards[s] + ": ends inside a member (truncated)", "truncated shards", skipped, examples);
      group(s, listing.members, skipped, examples);
      shard_end_.push_back(samples_.size());
    }
    if (samples_.empty())
      throw Error(location + ": the " + std::to_string(shards.size()) + " shard(s) hold no sample with an image and a label",
                  "WebDataset samples are members KEY.jpg|jpeg|png and KEY.cls|txt|json next to each other");
    classes_from(location);
    std::size_t skipped_total = 0;
    std::vector<std::string> reasons;
    for (const auto& [why, n] : skipped) skipped_total += n, reasons.push_back(std::to_string(n) + " " + why);
    if (skipped_total) {
      std::cerr << "convnets: warning: " << location << ": skipped " << join(reasons) << ":\n";
      for (const auto& e : examples) std::cerr << "  " << utf8_escaped(e) << '\n';
      if (skipped_total > examples.size()) std::cerr << "  ... and " << skipped_total - examples.size() << " more\n";
    }
    description_ = "webdataset " + location + ": " + std::to_string(shards.size()) + " shard" +
                   (shards.size() == 1 ? "" : "s") + " (" + std::to_string(indexed) + " indexed), " +
                   std::to_string(samples_.size()) + " samples, " + std::to_string(classes_.size()) + " classes" +
                   (skipped_total ? " (skipped: " + join(reasons) + ")" : "");
  }

  std::size_t size() const override { return samples_.size(); }
  std::string name(std::size_t i) const override {
    const Sample& s = samples_[i];
    return paths_[s.shard] + ":" + std::string(names_.c_str() + s.key);
  }
  std::int64_t label(std::size_t i) const override {
    if (!labels_.empty()) return labels_[i];
    std::string text;
    return read_label(i, *open(samples_[i].shard), text);
  }
  void load(std::size_t i, SampleData& out) const override {
    const Sample& s = samples_[i];
    const auto file = open(s.shard);
    out.name = name(i);
    out.encoded = true;
    advise(*file, s.image_offset + s.image_size);
    out.bytes.resize(s.image_size);
    if (pread_full(file->fd, out.bytes.data(), out.bytes.size(), s.image_offset, out.name) != out.bytes.size())
      throw codec::DecodeError(out.name + ": the shard ends inside this member (was it truncated since it was listed?)");
    if (!labels_.empty()) {
      out.label = labels_[i];
    } else {
      out.label = read_label(i, *file, label_text_);
    }
  }

  std::vector<std::int64_t> epoch_order(const ShardOptions& o, std::int64_t epoch) const override {
    const std::size_t n = samples_.size(), mine = shard_size(n, o);  // validates o
    // The epoch's stream: shards in a seeded order, each one's samples in archive order.
    std::vector<std::size_t> order(paths_.size());
    std::iota(order.begin(), order.end(), 0);
    if (o.shuffle) {
      Rng rng(o.seed ^ 0x7368617264ULL /* "shard" */, epoch, -1);
      for (std::size_t k = order.size(); k > 1; --k) std::swap(order[k - 1], order[rng.integer(0, std::int64_t(k) - 1)]);
    }
    std::vector<std::int64_t> stream;
    stream.reserve(n);
    for (std::size_t s : order)
      for (std::size_t k = s ? shard_end_[s - 1] : 0; k < shard_end_[s]; ++k) stream.push_back(std::int64_t(k));
    // Each rank takes one contiguous stretch of it (its own shards, read front
    // to back), as long as DistributedSampler would give it; the padding of the
    // last stretch repeats the stream's start.
    std::size_t begin = 0;
    for (int r = 0; r < o.rank; ++r) {
      ShardOptions other = o;
      other.rank = r;
      begin += shard_size(n, other);
    }
    std::vector<std::int64_t> out;
    out.reserve(mine);
    for (std::size_t p = begin; p < begin + mine; ++p) out.push_back(stream[p % n]);
    if (!o.shuffle) return out;
    // A shuffle buffer over the stretch (WebDataset's shuffle(), DALI's
    // random_shuffle): each new sample takes the place of a random one, which
    // goes out. Seeded by (seed, epoch, rank) alone: the thread count never enters.
    Rng rng(o.seed ^ 0x6275666665ULL /* "buffe" */, epoch, o.rank);
    std::vector<std::int64_t> buffer, shuffled;
    buffer.reserve(std::min(kShuffleBuffer, out.size()));
    shuffled.reserve(out.size());
    for (std::int64_t id : out) {
      if (buffer.size() < kShuffleBuffer) {
        buffer.push_back(id);
        continue;
      }
      std::int64_t& slot = buffer[static_cast<std::size_t>(rng.integer(0, std::int64_t(kShuffleBuffer) - 1))];
      shuffled.push_back(slot);
      slot = id;
    }
    for (std::size_t k = buffer.size(); k > 1; --k) std::swap(buffer[k - 1], buffer[rng.integer(0, std::int64_t(k) - 1)]);
    shuffled.insert(shuffled.end(), buffer.begin(), buffer.end());
    return shuffled;
  }

 private:
  static void note(const std::string& what, const std::string& why, std::map<std::string, std::size_t>& skipped,
                   std::vector<std::string>& examples) {
    ++skipped[why];
    if (examples.size() < 10) examples.push_back(what);
  }

  tar::Listing list(std::size_t s, std::size_t& indexed) {
    const std::string& path = paths_[s];
    const auto file = open(static_cast<std::uint32_t>(s));
    struct stat st {};
    if (::fstat(file->fd, &st) != 0) throw SystemError("cannot stat the shard", path);
    if (!S_ISREG(st.st_mode)) throw Error(path + ": is not a regular file", "a shard is a .tar file");
    const auto size = static_cast<std::uint64_t>(st.st_size);
    const std::string idx = index_path(path);
    std::error_code ec;
    if (fs::is_regular_file(idx, ec)) {
      tar::Listing l;
      l.members = read_dali_index(read_file(idx, "DALI index"), idx, size);
      ++indexed;
      return l;
    }
    const int fd = file->fd;
    return tar::scan([&](std::uint64_t off, void* buf, std::size_t n) { return pread_full(fd, buf, n, off, path); }, size,
                     path);
  }

  void group(std::size_t s, const std::vector<tar::Member>& members, std::map<std::string, std::size_t>& skipped,
             std::vector<std::string>& examples) {
    std::size_t k = 0;
    std::string key, ext, next_key;
    while (k < members.size()) {
      split_member_name(members[k].name, key, ext);
      const tar::Member *image = nullptr, *label = nullptr;
      int image_rank = 99, label_rank = 99;
      std::string image_ext, label_ext;
      std::size_t j = k;
      for (; j < members.size(); ++j) {
        split_member_name(members[j].name, next_key, ext);
        if (next_key != key) break;
        for (int e = 0; e < 3; ++e)
          if (ext == kImageExts[e] && e < image_rank) image = &members[j], image_rank = e, image_ext = ext;
        for (int e = 0; e < 3; ++e)
          if (ext == kLabelExts[e] && e < label_rank) label = &members[j], label_rank = e, label_ext = ext;
        for (const char* other : kOtherImageExts)
          if (ext == other && !image)
            throw Error(paths_[s] + ": member " + utf8_escaped(members[j].name) + " is a ." + ext +
                            " image, which convnets does not decode",
                        "convnets reads JPEG and PNG: re-encode the images (e.g. with Pillow) and re-pack them");
      }
      k = j;
      if (!image || !label) {
        note(paths_[s] + ":" + key + (image ? ": no .cls/.txt/.json label" : ": no .jpg/.jpeg/.png image"),
             image ? "samples without a label" : "samples without an image", skipped, examples);
        continue;
      }
      if (label->size > 4096) {
        note(paths_[s] + ":" + label->name + ": a label of " + std::to_string(label->size) + " bytes", "bad labels",
             skipped, examples);
        continue;
      }
      Sample sample;
      sample.shard = static_cast<std::uint32_t>(s);
      sample.label_ext = static_cast<std::uint8_t>(label_rank);
      sample.image_offset = image->offset, sample.image_size = static_cast<std::uint32_t>(image->size);
      sample.label_offset = label->offset, sample.label_size = static_cast<std::uint32_t>(label->size);
      sample.key = static_cast<std::uint32_t>(names_.size());
      names_ += key + "." + image_ext;
      names_.push_back('\0');
      if (names_.size() > 0xffffffffu) throw Error(paths_[s] + ": too many samples for one dataset");
      samples_.push_back(sample);
    }
  }

  // Class names from classes.txt beside the first shard (labels read at load
  // time then); without it, every label is read now to count the classes.
  void classes_from(const std::string& location) {
    const fs::path file = fs::path(paths_.front()).parent_path() / kClassesFile;
    std::error_code ec;
    if (fs::is_regular_file(file, ec)) {
      std::ifstream in(file);
      std::string line;
      while (std::getline(in, line)) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (classes_.empty() && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // a UTF-8 byte-order mark
        if (!line.empty()) classes_.push_back(line);
      }
      if (classes_.empty()) throw Error(file.string() + ": no class names", "one class name per line, in label order");
      if (std::int64_t(classes_.size()) > kMaxClasses)
        throw Error(file.string() + ": more than " + std::to_string(kMaxClasses) + " classes");
      return;
    }
    labels_.resize(samples_.size());
    std::int64_t largest = -1;
    std::string text;
    std::vector<std::size_t> bad;
    for (std::size_t i = 0; i < samples_.size(); ++i) {
      try {
        labels_[i] = static_cast<std::int32_t>(read_label(i, *open(samples_[i].shard), text));
        largest = std::max<std::int64_t>(largest, labels_[i]);
      } catch (const codec::DecodeError& e) {
        bad.push_back(i);
        if (bad.size() <= 10) std::cerr << "convnets: warning: " << utf8_escaped(e.what()) << '\n';
      }
    }
    if (!bad.empty()) {
      std::cerr << "convnets: warning: " << location << ": skipped " << bad.size() << " samples with bad labels\n";
      std::vector<char> drop(samples_.size(), 0);
      for (auto i : bad) drop[i] = 1;
      std::vector<Sample> kept;
      std::vector<std::int32_t> kept_labels;
      std::vector<std::size_t> ends;
      for (std::size_t s = 0, i = 0; s < paths_.size(); ++s) {
        for (; i < shard_end_[s]; ++i)
          if (!drop[i]) kept.push_back(samples_[i]), kept_labels.push_back(labels_[i]);
        ends.push_back(kept.size());
      }
      samples_ = std::move(kept), labels_ = std::move(kept_labels), shard_end_ = std::move(ends);
      if (samples_.empty()) throw Error(location + ": no sample has a usable label");
    }
    for (std::int64_t c = 0; c <= largest; ++c) classes_.push_back(std::to_string(c));
  }

  // The label of sample i, checked against the classes when they are known;
  // a bad one is a bad sample (codec::DecodeError), as a bad image is.
  std::int64_t read_label(std::size_t i, const ShardFile& file, std::string& text) const {
    const Sample& s = samples_[i];
    text.resize(s.label_size);
    if (pread_full(file.fd, text.data(), text.size(), s.label_offset, name(i)) != text.size())
      throw codec::DecodeError(name(i) + ": the shard ends inside its label");
    std::string why;
    const auto value = parse_label(text, kLabelExts[s.label_ext], why);
    if (!value) throw codec::DecodeError(name(i) + ": its ." + kLabelExts[s.label_ext] + " label " + why);
    if (!classes_.empty() && *value >= std::int64_t(classes_.size()))
      throw codec::DecodeError(name(i) + ": label " + std::to_string(*value) + " is out of range for the " +
                               std::to_string(classes_.size()) + " classes of " + kClassesFile);
    return *value;
  }

  std::shared_ptr<ShardFile> open(std::uint32_t s) const {
    std::lock_guard<std::mutex> lock(files_mutex_);
    if (auto f = files_[s]) {
      lru_.remove(s);
      lru_.push_front(s);
      return f;
    }
    auto f = std::make_shared<ShardFile>();
    f->fd = ::open(paths_[s].c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f->fd < 0) throw SystemError("cannot open the shard", paths_[s]);
    ::posix_fadvise(f->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    files_[s] = f;
    lru_.push_front(s);
    if (lru_.size() > kOpenShards) {
      files_[lru_.back()].reset();  // closed once the last reader lets go
      lru_.pop_back();
    }
    return f;
  }

  static void advise(ShardFile& f, std::uint64_t end) {
    std::uint64_t advised = f.advised.load(std::memory_order_relaxed);
    if (end + kReadAhead / 2 <= advised) return;
    const std::uint64_t from = std::max(advised, end > kReadAhead ? end - kReadAhead / 2 : 0);
    if (!f.advised.compare_exchange_strong(advised, end + kReadAhead)) return;  // another worker asked
    ::posix_fadvise(f.fd, static_cast<off_t>(from), static_cast<off_t>(end + kReadAhead - from), POSIX_FADV_WILLNEED);
  }

  static std::string index_path(const std::string& tar_path) {
    return (is_tar_name(tar_path) ? tar_path.substr(0, tar_path.size() - 4) : tar_path) + ".idx";
  }

  std::vector<std::string> paths_;
  std::vector<Sample> samples_;
  std::vector<std::size_t> shard_end_;  // samples_ of shard s are [shard_end_[s-1], shard_end_[s])
  std::string names_;                   // "key.ext\0" per sample
  std::vector<std::int32_t> labels_;    // read at listing when there is no classes.txt
  mutable std::mutex files_mutex_;
  mutable std::vector<std::shared_ptr<ShardFile>> files_;
  mutable std::list<std::uint32_t> lru_;
  static thread_local std::string label_text_;
};

thread_local std::string ShardDataset::label_text_;

}  // namespace

std::vector<std::string> expand_braces(const std::string& pattern) {
  std::vector<std::string> out;
  expand_into(pattern, pattern, out);
  return out;
}

void split_member_name(const std::string& name, std::string& key, std::string& ext) {
  const std::size_t slash = name.rfind('/');
  const std::size_t base = slash == std::string::npos ? 0 : slash + 1;
  const std::size_t dot = name.find('.', base);
  if (dot == std::string::npos) {
    key = name, ext.clear();
    return;
  }
  key = name.substr(0, dot);
  ext = name.substr(dot + 1);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
}

std::optional<std::int64_t> parse_label(const std::string& text, const std::string& ext, std::string& why) {
  std::int64_t value = -1;
  auto decimal = [&](std::string_view t) -> bool {
    while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.remove_prefix(1);
    while (!t.empty() && (std::isspace(static_cast<unsigned char>(t.back())) || t.back() == '\0')) t.remove_suffix(1);
    const auto [end, err] = std::from_chars(t.data(), t.data() + t.size(), value);
    return !t.empty() && err == std::errc() && end == t.data() + t.size();
  };
  if (ext == "json") {
    try {
      const auto j = parse_json(text, "label", 8);
      nlohmann::json v = j;
      if (j.is_object()) {
        for (const char* k : {"label", "cls", "class"})
          if (j.contains(k)) {
            v = j[k];
            break;
          }
      }
      if (!v.is_number_integer()) {
        why = "holds no integer (a number, or an object with \"label\", \"cls\" or \"class\")";
        return std::nullopt;
      }
      value = v.get<std::int64_t>();
    } catch (const Error&) {
      why = "is not valid JSON";
      return std::nullopt;
    }
  } else if (!decimal(text)) {
    why = "'" + utf8_escaped(text.substr(0, 40)) + "' is not a decimal class index";
    return std::nullopt;
  }
  if (value < 0 || value >= kMaxClasses) {
    why = std::to_string(value) + " is out of range (0 .. " + std::to_string(kMaxClasses - 1) + ")";
    return std::nullopt;
  }
  return value;
}

bool is_tar_name(const std::string& name) {
  static constexpr char kTar[] = ".tar";
  return name.size() >= 4 && std::equal(name.end() - 4, name.end(), kTar, kTar + 4, [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) == b;
         });
}

std::vector<std::string> find_shards(const std::string& location, const std::string& split) {
  if (location.find('{') != std::string::npos || location.find('}') != std::string::npos) {
    auto names = expand_braces(location);
    for (const auto& n : names) {
      std::error_code ec;
      if (!fs::is_regular_file(n, ec))
        throw Error(n + ": no such shard (from the pattern " + location + ")", {}, ErrorKind::NotFound);
    }
    return names;
  }
  std::error_code ec;
  if (is_tar_name(location) && fs::is_regular_file(location, ec)) return {location};
  if (!fs::is_directory(location, ec)) return {};
  std::vector<std::string> all, of_split;
  for (const auto& entry : fs::directory_iterator(location, ec)) {
    const std::string file = entry.path().filename().string();
    if (!is_tar_name(file) || !entry.is_regular_file(ec)) continue;
    all.push_back(entry.path().string());
    if (file.rfind(split + "-", 0) == 0 || file.rfind(split + "_", 0) == 0) of_split.push_back(entry.path().string());
  }
  if (ec) throw Error(location + ": cannot list: " + ec.message());
  auto& chosen = of_split.empty() ? all : of_split;
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

std::vector<tar::Member> read_dali_index(const std::string& text, const std::string& path, std::uint64_t tar_size) {
  std::istringstream in(text);
  std::string version, line;
  std::size_t count = 0;
  if (!(in >> version >> count) || version != "v1.2")
    throw Error(path + ": not a DALI webdataset index of version v1.2 (first line 'v1.2 SAMPLES', as wds2idx writes)");
  std::getline(in, line);
  std::vector<tar::Member> out;
  for (std::size_t k = 0; k < count; ++k) {
    if (!std::getline(in, line))
      throw Error(path + ": promises " + std::to_string(count) + " samples and lists " + std::to_string(k));
    std::istringstream fields(line);
    std::string ext, name;
    std::uint64_t offset = 0, size = 0;
    std::size_t parts = 0;
    while (fields >> ext) {
      if (!(fields >> offset >> size >> name))
        throw Error(path + ":" + std::to_string(k + 2) + ": expected 'ext offset size name' per member");
      if (offset > tar_size || size > tar_size - offset || offset % tar::kBlock != 0)
        throw Error(path + ":" + std::to_string(k + 2) + ": member " + name + " at byte " + std::to_string(offset) +
                        " (" + std::to_string(size) + " bytes) is not inside the " + std::to_string(tar_size) +
                        "-byte shard on a block boundary",
                    "the index is stale: delete it (it is rebuilt by reading the shard) or re-create it with wds2idx");
      out.push_back({name, offset - std::min<std::uint64_t>(offset, tar::kBlock), offset, size});
      ++parts;
    }
    if (parts == 0) throw Error(path + ":" + std::to_string(k + 2) + ": an empty sample line");
  }
  return out;
}

std::string dali_index_text(const std::vector<std::vector<tar::Member>>& samples) {
  std::string out = "v1.2 " + std::to_string(samples.size()) + "\n";
  std::string key, ext;
  for (const auto& sample : samples) {
    for (std::size_t k = 0; k < sample.size(); ++k) {
      split_member_name(sample[k].name, key, ext);
      out += (k ? " " : "") + ext + " " + std::to_string(sample[k].offset) + " " + std::to_string(sample[k].size) +
             " " + sample[k].name;
    }
    out += "\n";
  }
  return out;
}

DatasetPtr webdataset(const std::vector<std::string>& shards, const std::string& location) {
  return std::make_shared<ShardDataset>(shards, location);
}

}  // namespace convnets::data
