#include "data/dataset.h"

#include "core/error.h"
#include "core/json.h"
#include "core/limits.h"
#include "data/shards.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

namespace fs = std::filesystem;

namespace convnets::data {

std::vector<std::int64_t> Dataset::epoch_order(const ShardOptions& o, std::int64_t epoch) const {
  return shard_indices(size(), o, epoch);
}

std::size_t Dataset::epoch_size(const ShardOptions& o) const { return shard_size(size(), o); }

// One read of the whole file: this runs once per sample per epoch. Opening a
// FIFO would wait for a writer forever (the run hangs): O_NONBLOCK makes the
// open itself return for one.
void read_image_file(const std::string& path, std::vector<std::uint8_t>& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw codec::DecodeError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO (named pipe)"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                    : "a special file";
    ::close(fd);
    throw codec::DecodeError(path + ": is " + std::string(kind) + ", not an image file");
  }
  out.resize(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  int err = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : 0;
      break;
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  if (done != out.size()) {
    throw codec::DecodeError(path + ": read error: " +
                             (err ? std::string(std::strerror(err)) : "the file shrank while it was read"));
  }
}

namespace {

bool lower_ends_with(std::string s, const std::string& suffix) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Files on disk with one label each: the image-folder and list-file layouts.
class FileDataset : public Dataset {
 public:
  FileDataset(std::vector<std::string> paths, std::vector<std::int32_t> labels, std::vector<std::string> classes,
              std::string description)
      : paths_(std::move(paths)), labels_(std::move(labels)) {
    classes_ = std::move(classes);
    description_ = std::move(description);
  }
  std::size_t size() const override { return paths_.size(); }
  std::int64_t label(std::size_t i) const override { return labels_[i]; }
  std::string name(std::size_t i) const override { return paths_[i]; }
  void load(std::size_t i, SampleData& out) const override {
    out.name = paths_[i];
    out.encoded = true;
    out.label = labels_[i];
    read_image_file(paths_[i], out.bytes);
  }

 private:
  std::vector<std::string> paths_;
  std::vector<std::int32_t> labels_;
};

// Whole images held in memory as raw pixels: IDX and synthetic data.
class PixelDataset : public Dataset {
 public:
  PixelDataset(std::string source, std::size_t count, int h, int w, int c, std::vector<std::uint8_t> pixels,
               std::vector<std::int32_t> labels, std::vector<std::string> classes, std::uint64_t synthetic_seed,
               std::string description)
      : source_(std::move(source)), count_(count), h_(h), w_(w), c_(c), pixels_(std::move(pixels)),
        labels_(std::move(labels)), seed_(synthetic_seed) {
    classes_ = std::move(classes);
    description_ = std::move(description);
  }
  std::size_t size() const override { return count_; }
  std::int64_t label(std::size_t i) const override {
    return labels_.empty() ? std::int64_t(i % classes_.size()) : labels_[i];
  }
  std::string name(std::size_t i) const override { return source_ + "[" + std::to_string(i) + "]"; }
  int channels() const override { return c_; }
  void load(std::size_t i, SampleData& out) const override {
    out.name = name(i);
    out.encoded = false;
    out.label = label(i);
    out.pixels.resize(w_, h_, c_);
    const std::size_t n = out.pixels.pixels.size();
    if (!pixels_.empty()) {
      std::memcpy(out.pixels.pixels.data(), pixels_.data() + i * n, n);
      return;
    }
    Rng rng(seed_, 0, static_cast<std::int64_t>(i));
    std::uint8_t* p = out.pixels.pixels.data();
    for (std::size_t k = 0; k < n; k += 8) {
      const std::uint64_t r = rng.next();
      std::memcpy(p + k, &r, std::min<std::size_t>(8, n - k));
    }
  }

 private:
  std::string source_;
  std::size_t count_;
  int h_, w_, c_;
  std::vector<std::uint8_t> pixels_;  // empty for synthetic data: generated on load
  std::vector<std::int32_t> labels_;
  std::uint64_t seed_;
};

std::vector<std::uint8_t> read_maybe_gzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // zlib reads plain files transparently
  if (!f) throw Error(path + ": cannot open: " + std::strerror(errno), {}, errno_kind(errno));
  std::vector<std::uint8_t> out;
  std::uint8_t chunk[1 << 16];
  int n;
  while ((n = gzread(f, chunk, sizeof chunk)) > 0) out.insert(out.end(), chunk, chunk + n);
  int zerr = Z_OK;
  const std::string msg = n < 0 ? gzerror(f, &zerr) : "";
  gzclose(f);
  if (n < 0) throw Error(path + ": corrupt gzip stream: " + msg);
  return out;
}

// IDX header: 0, 0, type, ndims, then ndims big-endian uint32 sizes.
std::vector<std::size_t> idx_header(const std::vector<std::uint8_t>& d, const std::string& path, std::size_t& offset) {
  if (d.size() < 4 || d[0] != 0 || d[1] != 0)
    throw Error(path + ": not an IDX file (expected the magic 00 00 <type> <ndims>)");
  if (d[2] != 0x08) throw Error(path + ": IDX element type 0x" + std::to_string(d[2]) + " is not unsigned byte (0x08)");
  const std::size_t ndims = d[3];
  if (d.size() < 4 + 4 * ndims) throw Error(path + ": IDX header is truncated");
  std::vector<std::size_t> dims(ndims);
  offset = 4 + 4 * ndims;
  // The product is checked against the file as it grows: sizes up to 2^32 each
  // would overflow it and make a damaged header look consistent.
  std::size_t total = 1;
  bool larger = false;
  for (std::size_t k = 0; k < ndims; ++k) {
    const std::uint8_t* p = &d[4 + 4 * k];
    dims[k] = (std::size_t(p[0]) << 24) | (std::size_t(p[1]) << 16) | (std::size_t(p[2]) << 8) | p[3];
    if (dims[k] != 0 && total > (d.size() - offset) / dims[k]) larger = true;
    total *= larger ? 1 : dims[k];
  }
  if (larger)
    throw Error(path + ": IDX header promises more data than the file's " + std::to_string(d.size() - offset) +
                " bytes (" + join([&] {
                  std::vector<std::string> v;
                  for (auto x : dims) v.push_back(std::to_string(x));
                  return v;
                }(), " x ") + ")");
  if (d.size() - offset != total)
    throw Error(path + ": IDX header promises " + std::to_string(total) + " bytes of data, the file holds " +
                std::to_string(d.size() - offset));
  return dims;
}

}  // namespace

std::vector<std::string> numbered_classes(std::int64_t n) {
  std::vector<std::string> out;
  for (std::int64_t k = 0; k < n; ++k) out.push_back(std::to_string(k));
  return out;
}

bool unnamed_classes(const std::vector<std::string>& classes) {
  return classes == numbered_classes(static_cast<std::int64_t>(classes.size()));
}

namespace {

// Fashion-MNIST's labels, as Zalando's README (and Debian's dataset-fashion-mnist's copy of it) lists them: IDX files
// carry numbers only, so a folder of them named for the set gets its names.
std::vector<std::string> idx_class_names(const std::string& folder, std::int64_t n) {
  auto lower = folder;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == 10 && lower.find("fashion") != std::string::npos) {
    return {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
  }
  return numbered_classes(n);
}

}  // namespace

namespace {

bool image_extension(const std::string& file) {
  return lower_ends_with(file, ".jpg") || lower_ends_with(file, ".jpeg") || lower_ends_with(file, ".png");
}

// One class folder's files, walked as torchvision's sorted(os.walk(root,
// followlinks=True)) lists them, but with each directory visited once: a link
// back up the tree (a cycle) or to a directory already listed is skipped
// with a warning, as are broken links and folders that cannot be read. File
// types come from readdir's d_type; only links (and file systems that give no
// type) cost a stat, so the walk stays one getdents per folder.
class FolderWalk {
 public:
  std::map<std::string, std::vector<std::string>> by_dir;  // folder -> image file names
  std::map<std::string, std::size_t> ignored;               // extension -> files that are no images
  std::vector<std::string> warnings;

  void walk(const std::string& dir, bool top) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
      warn(dir + ": cannot read: " + std::strerror(errno));
      return;
    }
    if (!seen_.insert({st.st_dev, st.st_ino}).second) {
      warn(dir + ": a folder already listed, reached again through a symbolic link (a cycle or a second way to "
                 "it): skipped");
      return;
    }
    DIR* d = ::opendir(dir.c_str());
    if (!d) {
      if (top) throw SystemError("cannot list the class folder", dir);
      warn(dir + ": cannot list this folder (" + std::strerror(errno) + "): skipped");
      return;
    }
    auto& files = by_dir[dir];
    std::vector<std::string> subdirs;
    // readdir tells its end from an error only through errno, which the stats below also set.
    for (errno = 0; const dirent* e = ::readdir(d); errno = 0) {
      const char* n = e->d_name;
      if (n[0] == '.' && (n[1] == 0 || (n[1] == '.' && n[2] == 0))) continue;
      std::string path = dir + "/" + n;
      unsigned char type = e->d_type;
      if (type == DT_LNK || type == DT_UNKNOWN) {
        struct stat target {};
        if (::stat(path.c_str(), &target) != 0) {
          struct stat link {};
          const bool is_link = ::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode);
          warn(path + (is_link ? ": broken symbolic link (" : ": cannot be read (") + std::strerror(errno) + "): skipped");
          continue;
        }
        if (S_ISDIR(target.st_mode)) {
          type = DT_DIR;
        } else {
          type = S_ISREG(target.st_mode) ? DT_REG : DT_UNKNOWN;
        }
      }
      if (type == DT_DIR) {
        subdirs.push_back(std::move(path));
      } else if (image_extension(n)) {
        files.emplace_back(n);
      } else {
        const std::string ext = fs::path(n).extension().string();
        ++ignored[ext.empty() ? "(no extension)" : ext];
      }
    }
    const int err = errno;
    ::closedir(d);
    if (err) warn(dir + ": listing stopped early (" + std::strerror(err) + ")");
    for (const auto& sub : subdirs) walk(sub, false);
  }

 private:
  void warn(const std::string& what) {
    warnings.push_back(what);
    std::cerr << "convnets: warning: " << utf8_escaped(what) << '\n';
  }
  std::set<std::pair<dev_t, ino_t>> seen_;
};

}  // namespace

DatasetPtr image_folder(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error(dir + ": not a directory", "expected DIR/<class>/<image> folders");
  std::vector<std::string> classes;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_directory(ec)) classes.push_back(entry.path().filename().string());
  if (ec) throw Error(dir + ": cannot list: " + ec.message());
  if (classes.empty())
    throw Error(dir + ": no class folders", "expected DIR/<class>/<image>, one folder per class");
  std::sort(classes.begin(), classes.end());

  std::vector<std::string> paths;
  std::vector<std::int32_t> labels;
  std::map<std::string, std::size_t> skipped;
  std::size_t warnings = 0;
  for (std::size_t c = 0; c < classes.size(); ++c) {
    FolderWalk walk;
    const std::string class_dir = (fs::path(dir) / classes[c]).string();
    walk.walk(class_dir, true);
    warnings += walk.warnings.size();
    for (const auto& [ext, n] : walk.ignored) skipped[ext] += n;
    const std::size_t before = paths.size();
    for (auto& [folder, files] : walk.by_dir) {
      std::sort(files.begin(), files.end());
      for (const auto& f : files) {
        paths.push_back(folder + "/" + f);
        labels.push_back(static_cast<std::int32_t>(c));
      }
    }
    if (paths.size() == before)
      throw Error(class_dir + ": class '" + classes[c] + "' has no images",
                  "every class folder needs at least one .jpg, .jpeg or .png file");
  }
  std::string desc = "image folder " + dir + ": " + std::to_string(paths.size()) + " images, " +
                     std::to_string(classes.size()) + " classes";
  std::vector<std::string> ignored;
  for (const auto& [ext, n] : skipped) ignored.push_back(std::to_string(n) + " " + ext);
  if (!ignored.empty()) desc += " (ignored, not .jpg/.jpeg/.png: " + join(ignored) + ")";
  if (warnings) desc += " (" + std::to_string(warnings) + " links or folders skipped, see the warnings)";
  return std::make_shared<FileDataset>(std::move(paths), std::move(labels), std::move(classes), std::move(desc));
}

DatasetPtr list_file(const std::string& path, const std::string& root_in, std::int64_t num_classes) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open list file: " + std::strerror(errno), {}, errno_kind(errno));
  const std::string root = root_in.empty() ? fs::path(path).parent_path().string() : root_in;
  std::vector<std::string> paths;
  std::vector<std::int32_t> labels;
  std::string line;
  std::int64_t max_label = -1;
  for (std::size_t lineno = 1; std::getline(in, line); ++lineno) {
    // Windows Notepad starts a UTF-8 file with a byte-order mark.
    if (lineno == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    const std::size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(lineno);
    // A path is a C string to the file system: it would end silently at the NUL.
    if (line.find('\0') != std::string::npos)
      throw Error(where + ": a NUL byte in the line; a list file is text, one 'relative/path label' per line");
    const std::size_t split = line.find_last_of(" \t");
    if (split == std::string::npos || split < start)
      throw Error(where + ": expected 'relative/path label', got '" + line + "'");
    const std::string label_text = line.substr(split + 1);
    std::int64_t label = 0;
    const auto [end, err] = std::from_chars(label_text.data(), label_text.data() + label_text.size(), label);
    if (err != std::errc() || end != label_text.data() + label_text.size())
      throw Error(where + ": label '" + label_text + "' is not an integer");
    if (label < 0 || label >= kMaxClasses)
      throw Error(where + ": label " + label_text + " is out of range; expected 0 .. " + std::to_string(kMaxClasses - 1));
    if (num_classes > 0 && label >= num_classes)
      throw Error(where + ": label " + label_text + " is out of range for " + std::to_string(num_classes) +
                  " classes (labels are 0.." + std::to_string(num_classes - 1) + ")");
    std::string rel = line.substr(start, split - start);
    while (!rel.empty() && (rel.back() == ' ' || rel.back() == '\t')) rel.pop_back();
    paths.push_back((fs::path(root) / rel).string());
    labels.push_back(static_cast<std::int32_t>(label));
    max_label = std::max(max_label, label);
  }
  if (paths.empty()) throw Error(path + ": list file has no samples", "expected lines 'relative/path label'");
  // The error_code form: a path too long or otherwise unusable is the list
  // file's fault, reported as such, not a filesystem_error from deep inside.
  std::error_code exists_ec;
  if (!fs::exists(paths.front(), exists_ec))
    throw Error(path + ":1: '" + paths.front() + "' " + (exists_ec ? "cannot be checked: " + exists_ec.message() : "does not exist"),
                "paths are relative to the list file's folder unless a data root is given",
                exists_ec ? ErrorKind::Io : ErrorKind::NotFound);
  const std::int64_t n = num_classes > 0 ? num_classes : max_label + 1;
  std::string desc = "list file " + path + ": " + std::to_string(paths.size()) + " images, " + std::to_string(n) +
                     " classes";
  return std::make_shared<FileDataset>(std::move(paths), std::move(labels), numbered_classes(n), std::move(desc));
}

DatasetPtr idx_files(const std::string& images, const std::string& labels) {
  std::vector<std::uint8_t> img = read_maybe_gzip(images), lab = read_maybe_gzip(labels);
  std::size_t img_off = 0, lab_off = 0;
  const auto idims = idx_header(img, images, img_off);
  const auto ldims = idx_header(lab, labels, lab_off);
  if (idims.size() != 3 && idims.size() != 4)
    throw Error(images + ": IDX images need 3 dimensions (N, H, W) or 4 (N, H, W, C), found " +
                std::to_string(idims.size()));
  if (ldims.size() != 1) throw Error(labels + ": IDX labels need 1 dimension, found " + std::to_string(ldims.size()));
  if (idims[0] != ldims[0])
    throw Error(images + " holds " + std::to_string(idims[0]) + " images but " + labels + " holds " +
                std::to_string(ldims[0]) + " labels");
  if (idims[0] == 0) throw Error(images + ": IDX file has no images");
  if (idims[1] == 0 || idims[2] == 0 || idims[1] > 65535 || idims[2] > 65535)
    throw Error(images + ": IDX images of " + std::to_string(idims[1]) + "x" + std::to_string(idims[2]) +
                " pixels; expected each side in 1 .. 65535");
  if (idims.size() == 4 && idims[3] != 1 && idims[3] != 3)
    throw Error(images + ": IDX images with " + std::to_string(idims[3]) + " channels; expected 1 or 3");
  const int h = int(idims[1]), w = int(idims[2]), c = idims.size() == 4 ? int(idims[3]) : 1;
  std::vector<std::int32_t> lv(lab.begin() + lab_off, lab.end());
  const std::int64_t n_classes = *std::max_element(lv.begin(), lv.end()) + 1;
  img.erase(img.begin(), img.begin() + img_off);
  std::string desc = "IDX " + images + ": " + std::to_string(idims[0]) + " images " + std::to_string(h) + "x" +
                     std::to_string(w) + "x" + std::to_string(c) + ", " + std::to_string(n_classes) + " classes";
  return std::make_shared<PixelDataset>(images, idims[0], h, w, c, std::move(img), std::move(lv),
                                        idx_class_names(fs::path(images).parent_path().string(), n_classes), 0,
                                        std::move(desc));
}

DatasetPtr synthetic(std::size_t count, int height, int width, int channels, int classes, std::uint64_t seed) {
  if (count == 0 || height < 1 || width < 1 || channels < 1 || classes < 1)
    throw Error("synthetic dataset: count, height, width, channels and classes must all be at least 1");
  std::string desc = "synthetic: " + std::to_string(count) + " images " + std::to_string(height) + "x" +
                     std::to_string(width) + "x" + std::to_string(channels) + ", " + std::to_string(classes) +
                     " classes";
  return std::make_shared<PixelDataset>("synthetic", count, height, width, channels, std::vector<std::uint8_t>{},
                                        std::vector<std::int32_t>{}, numbered_classes(classes), seed,
                                        std::move(desc));
}

namespace {

// Every `stride`-th sample of `base` from the first, `count` of them.
// Some samples of another dataset, in the order of `indices`: head, spread and holdout.
class SubsetDataset : public Dataset {
 public:
  SubsetDataset(DatasetPtr base, std::vector<std::size_t> indices, const std::string& how)
      : base_(std::move(base)), indices_(std::move(indices)) {
    classes_ = base_->classes();
    description_ = base_->description() + ", " + how;
  }
  std::size_t size() const override { return indices_.size(); }
  std::int64_t label(std::size_t i) const override { return base_->label(indices_[i]); }
  std::string name(std::size_t i) const override { return base_->name(indices_[i]); }
  void load(std::size_t i, SampleData& out) const override { base_->load(indices_[i], out); }
  int channels() const override { return base_->channels(); }

 private:
  DatasetPtr base_;
  std::vector<std::size_t> indices_;
};

std::vector<std::size_t> strided(std::size_t count, std::size_t stride) {
  std::vector<std::size_t> out(count);
  for (std::size_t i = 0; i < count; ++i) out[i] = i * stride;
  return out;
}

}  // namespace

DatasetPtr head(DatasetPtr dataset, std::size_t count) {
  if (count == 0 || count >= dataset->size()) return dataset;
  return std::make_shared<SubsetDataset>(std::move(dataset), strided(count, 1), "first " + std::to_string(count) + " used");
}

DatasetPtr spread(DatasetPtr dataset, std::size_t count) {
  if (count == 0 || count >= dataset->size()) return dataset;
  const std::size_t stride = dataset->size() / count;
  return std::make_shared<SubsetDataset>(std::move(dataset), strided(count, stride),
                                         std::to_string(count) + " used (every " + std::to_string(stride) + "th)");
}

std::pair<DatasetPtr, DatasetPtr> holdout(DatasetPtr dataset, std::size_t count) {
  const std::size_t n = dataset->size();
  if (count == 0 || count >= n)
    throw Error("cannot hold out " + std::to_string(count) + " of the " + std::to_string(n) + " samples of " +
                    dataset->description(),
                "--holdout takes 1 .. " + std::to_string(n - (n > 0)) + " samples");
  const std::size_t stride = n / count;
  std::vector<std::size_t> held = strided(count, stride), kept;
  kept.reserve(n - count);
  for (std::size_t i = 0, h = 0; i < n; ++i) {
    if (h < held.size() && held[h] == i) {
      ++h;
    } else {
      kept.push_back(i);
    }
  }
  const std::string every = " (every " + std::to_string(stride) + "th from the first)";
  auto rest = std::make_shared<SubsetDataset>(dataset, std::move(kept),
                                              std::to_string(count) + " held out for validation" + every);
  auto val = std::make_shared<SubsetDataset>(std::move(dataset), std::move(held),
                                             "the " + std::to_string(count) + " held out" + every);
  return {rest, val};
}

bool has_splits(const std::string& location) {
  std::error_code ec;
  if (!fs::is_directory(location, ec)) return false;
  const fs::path d(location);
  for (const char* suffix : {".gz", ""})
    if (fs::exists(d / (std::string("train-images-idx3-ubyte") + suffix), ec) &&
        fs::exists(d / (std::string("t10k-images-idx3-ubyte") + suffix), ec))
      return true;
  return fs::is_directory(d / "train", ec) && fs::is_directory(d / "val", ec);
}

DatasetPtr open_dataset(const std::string& location, const std::string& split) {
  if (split != "train" && split != "val") throw Error("dataset split '" + split + "' is not train or val");
  if (location.rfind("synthetic", 0) == 0) {
    std::size_t count = 10000;
    if (location.size() > 9) {
      const auto [end, err] = std::from_chars(location.data() + 10, location.data() + location.size(), count);
      if (location[9] != ':' || err != std::errc() || end != location.data() + location.size() || count == 0)
        throw Error("dataset '" + location + "': expected synthetic or synthetic:N with N >= 1");
    }
    return synthetic(count, 224, 224, 3, 1000, split == "train" ? 0 : 1);
  }
  std::error_code ec;
  const bool file = fs::is_regular_file(location, ec);
  if (!file && !fs::is_directory(location, ec) && location.find('{') == std::string::npos)
    throw Error(location + ": no such file or directory",
                "give an image folder, a list file, an IDX folder, .tar shards (a folder, FILE.tar or a "
                "{000000..000009} pattern) or synthetic[:N]",
                ErrorKind::NotFound);
  if (file && !is_tar_name(location)) return list_file(location);
  if (!file) {
    const std::string prefix = split == "train" ? "train" : "t10k";
    for (const char* suffix : {".gz", ""}) {
      const fs::path images = fs::path(location) / (prefix + "-images-idx3-ubyte" + suffix);
      const fs::path labels = fs::path(location) / (prefix + "-labels-idx1-ubyte" + suffix);
      if (fs::exists(images, ec) && fs::exists(labels, ec)) return idx_files(images.string(), labels.string());
    }
    if (fs::is_directory(fs::path(location) / "train", ec) && fs::is_directory(fs::path(location) / "val", ec))
      return open_dataset((fs::path(location) / split).string(), split);
  }
  if (const auto shards = find_shards(location, split); !shards.empty()) return webdataset(shards, location);
  return image_folder(location);
}

}  // namespace convnets::data
