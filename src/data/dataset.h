// Dataset sources (image folder, list file, IDX, synthetic): an indexed table of samples, labels and class names.
#pragma once

#include "data/sampler.h"
#include "data/transforms.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace convnets::data {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::size_t size() const = 0;
  // The label of sample `index`; load() also sets SampleData::label, which
  // the loader uses (for a shard stream this reads the label member).
  virtual std::int64_t label(std::size_t index) const = 0;
  // The file path (or "file[index]") that messages about this sample name.
  virtual std::string name(std::size_t index) const = 0;
  // Reads sample `index` (bytes or pixels, and its label) into `out`, reusing
  // its buffers. An unreadable file throws codec::DecodeError (a bad image),
  // not a fatal error.
  virtual void load(std::size_t index, SampleData& out) const = 0;
  // The samples rank o.rank visits in `epoch`, in order, and how many that is
  // (the same for every epoch). Random-access sources deal a global
  // permutation (shard_indices); a tar-shard stream keeps each rank's reads
  // sequential within its shards instead.
  virtual std::vector<std::int64_t> epoch_order(const ShardOptions& o, std::int64_t epoch) const;
  virtual std::size_t epoch_size(const ShardOptions& o) const;
  // Channels of the pixels the transform produces: 3 for decoded images, the
  // stored count for raw pixels (1 for Fashion-MNIST).
  virtual int channels() const { return 3; }

  const std::vector<std::string>& classes() const { return classes_; }
  std::size_t num_classes() const { return classes_.size(); }
  // One line: kind, location, samples, classes.
  const std::string& description() const { return description_; }

 protected:
  std::vector<std::string> classes_;
  std::string description_;
};

using DatasetPtr = std::shared_ptr<const Dataset>;

// The bytes of one image file. Only a regular file is read: a FIFO, a
// directory or a device is no image, and each throws codec::DecodeError
// naming the path and what it is, as an unreadable file does.
void read_image_file(const std::string& path, std::vector<std::uint8_t>& out);

// DIR/<class>/**/<image>, classes sorted by name and files in torchvision
// ImageFolder order. Only .jpg/.jpeg/.png (any case) are samples; other files
// are counted by extension in the description, so none vanish silently.
// Links to folders are followed once each: a cycle, a second link to a folder
// already listed, a broken link and a folder that cannot be read are each
// skipped with a warning naming them.
DatasetPtr image_folder(const std::string& dir);

// PaddleClas list file: "relative/path label" per line (a UTF-8 byte-order
// mark before the first is ignored); the path may contain
// spaces (the label is the last field). Paths are relative to `root` (default:
// the list file's directory). num_classes 0 infers max label + 1.
DatasetPtr list_file(const std::string& path, const std::string& root = "", std::int64_t num_classes = 0);

// IDX images + labels files (gzip or raw), e.g. Fashion-MNIST; read whole. The classes are numbered, except where the
// files' folder is named for Fashion-MNIST (its name holds "fashion") and they hold its 10: then its own names.
DatasetPtr idx_files(const std::string& images, const std::string& labels);

// "0", "1", ... "n-1": the names of classes a dataset does not name (IDX, list files, synthetic data).
std::vector<std::string> numbered_classes(std::int64_t n);
// Whether `classes` are such numbers, which any names of the same count may stand for (a checkpoint trained before
// its data's classes were named).
bool unnamed_classes(const std::vector<std::string>& classes);

// `count` random height x width x channels images with labels index % classes;
// pixels depend only on (seed, index).
DatasetPtr synthetic(std::size_t count, int height, int width, int channels, int classes, std::uint64_t seed = 0);

// The first `count` samples of `dataset` (all of them when count is 0 or
// larger), with the same classes: for short runs and smoke tests.
DatasetPtr head(DatasetPtr dataset, std::size_t count);

// `count` samples spread evenly over `dataset` (every size/count-th from the
// first; all when count is 0 or larger): a sample that covers every class of
// a folder sorted by class, for calibration.
DatasetPtr spread(DatasetPtr dataset, std::size_t count);

// Splits `count` samples off `dataset` (every size/count-th from the first,
// as spread picks them) for validation: {the rest, the held-out ones}. What
// tunes a recipe without looking at the test split; throws Error unless
// 0 < count < size.
std::pair<DatasetPtr, DatasetPtr> holdout(DatasetPtr dataset, std::size_t count);

// Opens whatever `location` names, for split "train" or "val":
//   synthetic[:N]                     -> synthetic 224x224x3, 1000 classes, N samples (default 10000)
//   FILE.tar, a {a..b} / {a,b} pattern -> WebDataset shards (data/shards.h)
//   FILE (any other)                  -> list file
//   DIR with {train,t10k}-images-idx3-ubyte[.gz] -> IDX (train or t10k by split)
//   DIR with train/ and val/          -> DIR/<split>, opened as below
//   DIR holding .tar files            -> its shards (SPLIT-*.tar when there are such)
//   DIR                               -> image folder DIR
DatasetPtr open_dataset(const std::string& location, const std::string& split);

// Whether `location` holds both splits as open_dataset tells them apart (an
// IDX folder with train and t10k files, or train/ and val/ folders).
bool has_splits(const std::string& location);

}  // namespace convnets::data
