// Data pipeline tests that need no reference implementation: loader determinism, sharding, bad files, dataset errors.
#include "codec/image.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/resample.h"
#include "data/transforms.h"

#include "imagenet_like.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

namespace fs = std::filesystem;
using namespace convnets;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("convnets_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(reinterpret_cast<std::uintptr_t>(this)));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

void write(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

std::vector<data::Batch> epoch(data::Loader& loader, std::int64_t e) {
  loader.start_epoch(e);
  std::vector<data::Batch> out;
  data::Batch b;
  while (loader.next(b)) out.push_back(b);
  return out;
}

std::shared_ptr<const data::Transform> train_transform(int size = 64) {
  return std::make_shared<const data::Transform>(data::TransformOptions::train(size));
}

}  // namespace

TEST(Resample, IdentityAndConstantImages) {
  codec::Image img;
  img.resize(37, 23, 3);
  for (std::size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = static_cast<std::uint8_t>(i * 31);
  std::vector<std::uint8_t> out(37 * 23 * 3), scratch;
  std::vector<std::int32_t> acc;
  auto h = data::plan_axis(37, 0, 37, 37, 0, 37), v = data::plan_axis(23, 0, 23, 23, 0, 23);
  data::resample(img.view(), h, v, out.data(), 37 * 3, false, true, scratch, acc);
  EXPECT_EQ(out, img.pixels);
  // A constant image stays constant under any scale, pass order and flip.
  std::fill(img.pixels.begin(), img.pixels.end(), 77);
  for (int n : {5, 16, 50}) {
    for (bool pil : {true, false}) {
      auto ph = data::plan_axis(37, 0, 37, n, 0, n), pv = data::plan_axis(23, 0, 23, n, 0, n);
      std::vector<std::uint8_t> o(std::size_t(n) * n * 3);
      data::resample(img.view(), ph, pv, o.data(), n * 3, true, pil, scratch, acc);
      for (auto x : o) ASSERT_EQ(x, 77) << "size " << n;
    }
  }
}

// torchvision's RandomCrop(size, padding=p): every output is the input moved
// by (dy, dx) in [-p, p]^2 with zeros shifted in, each offset equally likely.
TEST(Transform, CropPaddingShiftsByUpToThePaddingWithZeroFill) {
  const int w = 9, h = 7, c = 2, p = 2;
  std::vector<std::uint8_t> src(std::size_t(w) * h * c);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>(1 + i % 250);  // no zeros
  std::map<std::pair<int, int>, int> seen;
  data::Rng rng(123);
  std::vector<std::uint8_t> scratch;
  const int draws = 5000;
  for (int k = 0; k < draws; ++k) {
    auto img = src;
    data::pad_and_crop({img.data(), w, h, c}, p, rng, scratch);
    int found = 0;
    for (int dy = -p; dy <= p; ++dy) {
      for (int dx = -p; dx <= p; ++dx) {
        bool same = true;
        for (int y = 0; y < h && same; ++y)
          for (int x = 0; x < w && same; ++x)
            for (int ch = 0; ch < c && same; ++ch) {
              const int sy = y + dy, sx = x + dx;
              const std::uint8_t want = (sy < 0 || sy >= h || sx < 0 || sx >= w) ? 0 : src[(sy * w + sx) * c + ch];
              same = img[(y * w + x) * c + ch] == want;
            }
        if (same) {
          ++seen[{dy, dx}];
          ++found;
        }
      }
    }
    ASSERT_EQ(found, 1) << "draw " << k << " is not exactly one shift of the input";
  }
  ASSERT_EQ(seen.size(), std::size_t((2 * p + 1) * (2 * p + 1)));
  const double expected = double(draws) / seen.size();  // 200; binomial sd ~13.9
  for (const auto& [offset, n] : seen)
    EXPECT_NEAR(n, expected, 5 * 13.9) << "offset (" << offset.first << ", " << offset.second << ")";

  // Called directly with a padding beyond the image (Transform refuses it,
  // the function must not read outside): a far shift is padding only.
  const int tw = 3, th = 2, tp = 4;
  const std::vector<std::uint8_t> tiny{1, 2, 3, 4, 5, 6};
  int blank = 0;
  for (int k = 0; k < 2000; ++k) {
    auto img = tiny;
    data::pad_and_crop({img.data(), tw, th, 1}, tp, rng, scratch);
    if (std::all_of(img.begin(), img.end(), [](std::uint8_t v) { return v == 0; })) {
      ++blank;
      continue;
    }
    int found = 0;
    for (int dy = 1 - th; dy < th; ++dy)
      for (int dx = 1 - tw; dx < tw; ++dx) {
        bool same = true;
        for (int y = 0; y < th; ++y)
          for (int x = 0; x < tw; ++x) {
            const int sy = y + dy, sx = x + dx;
            same = same && img[y * tw + x] == ((sy < 0 || sy >= th || sx < 0 || sx >= tw) ? 0 : tiny[sy * tw + sx]);
          }
        found += same;
      }
    ASSERT_EQ(found, 1) << "draw " << k;
  }
  EXPECT_NEAR(blank, 2000.0 * 66 / 81, 5 * 17.4);  // 15 of the 81 shifts keep a pixel; binomial sd ~17.4

  // The option is checked where it is set: in range and for training only.
  auto o = data::TransformOptions::train(8);
  o.crop_padding = 8;
  try {
    data::Transform t(o);
    FAIL() << "--crop-padding 8 with an 8 px crop was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--crop-padding must be in 0..7 (less than --image-size), got 8"), std::string::npos) << e.what();
  }
  auto ev = data::TransformOptions::eval(8);
  ev.crop_padding = 1;
  EXPECT_THROW(data::Transform{ev}, Error);
}

TEST(Loader, BatchesAreIdenticalWithOneOrFourWorkers) {
  const std::string root = imagenet_like();
  if (root.empty()) GTEST_SKIP() << "CONVNETS_IMAGENET_LIKE not set (the imagenet_like_data fixture sets it)";
  auto ds = data::image_folder(root + "/train");
  data::LoaderOptions o;
  o.batch_size = 24;
  o.shard.seed = 11;
  o.workers = 1;
  data::Loader one(ds, train_transform(), o);
  o.workers = 4;
  o.prefetch = 1;
  data::Loader four(ds, train_transform(), o);
  for (std::int64_t e = 0; e < 2; ++e) {
    auto a = epoch(one, e), b = epoch(four, e);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_EQ(std::int64_t(a.size()), std::int64_t(ds->size()) / 24);  // drop_last
    for (std::size_t k = 0; k < a.size(); ++k) {
      ASSERT_TRUE(torch::equal(a[k].images, b[k].images)) << "epoch " << e << " batch " << k;
      ASSERT_TRUE(torch::equal(a[k].labels, b[k].labels));
      EXPECT_EQ(a[k].images.sizes(), (std::vector<std::int64_t>{24, 64, 64, 3}));
    }
  }
  // Another epoch or seed draws other crops and order.
  auto e0 = epoch(one, 0), e1 = epoch(one, 1);
  EXPECT_FALSE(torch::equal(e0[0].images, e1[0].images));
  o.shard.seed = 12;
  data::Loader other(ds, train_transform(), o);
  EXPECT_FALSE(torch::equal(epoch(other, 0)[0].images, e0[0].images));
}

// A dataset that counts its reads, so a test can see what the workers loaded without timing them.
class CountingDataset : public data::Dataset {
 public:
  explicit CountingDataset(data::DatasetPtr inner) : inner_(std::move(inner)) { classes_ = inner_->classes(); }
  std::size_t size() const override { return inner_->size(); }
  std::int64_t label(std::size_t i) const override { return inner_->label(i); }
  std::string name(std::size_t i) const override { return inner_->name(i); }
  int channels() const override { return inner_->channels(); }
  void load(std::size_t i, data::SampleData& out) const override {
    ++loads;
    inner_->load(i, out);
  }
  mutable std::atomic<std::int64_t> loads{0};

 private:
  data::DatasetPtr inner_;
};

// Lookahead (training loaders) builds the next epoch's first batches while the last ones of this epoch are
// taken, and start_epoch(epoch + 1) keeps them; what comes out is what a loader without it gives, batch for batch,
// through an epoch left half-way, a resumed start and a stop.
TEST(Loader, LookaheadStartsTheNextEpochEarlyAndGivesTheSameBatches) {
  auto counting = std::make_shared<CountingDataset>(data::synthetic(64, 8, 8, 3, 5, 2));
  data::LoaderOptions o;
  o.batch_size = 8;
  o.workers = 3;
  o.prefetch = 1;
  o.shard.shuffle = true;
  o.shard.seed = 7;
  data::Loader plain(counting, train_transform(8), o);
  o.lookahead = true;
  data::Loader ahead(counting, train_transform(8), o);
  auto same = [](const std::vector<data::Batch>& a, const std::vector<data::Batch>& b, const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (std::size_t k = 0; k < a.size(); ++k) {
      ASSERT_TRUE(torch::equal(a[k].images, b[k].images)) << what << ", batch " << k;
      ASSERT_TRUE(torch::equal(a[k].labels, b[k].labels)) << what << ", batch " << k;
      ASSERT_EQ(a[k].indices, b[k].indices) << what << ", batch " << k;
    }
  };
  same(epoch(plain, 0), epoch(ahead, 0), "epoch 0");
  // Epoch 0 is over (64 reads by each loader) and epoch 1 not started: the workers with lookahead go on into it,
  // up to the prefetch depth (3 workers x 1 = 3 batches of 8), and no further.
  const std::int64_t expected = 2 * 64 + 3 * 8;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (counting->loads.load() < expected && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(counting->loads.load(), expected) << "the next epoch's first 3 batches, and no more";
  same(epoch(plain, 1), epoch(ahead, 1), "epoch 1, begun ahead");
  // Two batches of epoch 2 taken, then epoch 3: the rest of epoch 2 is dropped, epoch 3 is whole.
  for (auto* l : {&plain, &ahead}) {
    l->start_epoch(2);
    data::Batch b;
    ASSERT_TRUE(l->next(b));
    ASSERT_TRUE(l->next(b));
  }
  same(epoch(plain, 3), epoch(ahead, 3), "epoch 3 after epoch 2 left half-way");
  // A resumed start (batch 5 of epoch 4) and a jump back to epoch 1 are restarts, not continuations.
  for (auto* l : {&plain, &ahead}) l->start_epoch(4, 5);
  std::vector<data::Batch> p, a;
  data::Batch b;
  while (plain.next(b)) p.push_back(b);
  while (ahead.next(b)) a.push_back(b);
  same(p, a, "epoch 4 from batch 5");
  EXPECT_EQ(p.size(), 3u);
  same(epoch(plain, 1), epoch(ahead, 1), "epoch 1 again");
  // After stop() nothing is built ahead any more.
  ahead.stop();
  plain.stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::int64_t stopped = counting->loads.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(counting->loads.load(), stopped);
}

TEST(Loader, LabelsFollowTheSamplerOrder) {
  auto ds = data::synthetic(50, 8, 8, 3, 7, 3);
  data::LoaderOptions o;
  o.batch_size = 8;
  o.drop_last = false;
  o.workers = 3;
  o.shard.shuffle = true;
  o.shard.seed = 5;
  data::Loader loader(ds, train_transform(8), o);
  const auto order = data::shard_indices(50, o.shard, 3);
  std::vector<std::int64_t> seen;
  for (const auto& b : epoch(loader, 3)) {
    for (std::int64_t k = 0; k < b.labels.size(0); ++k) {
      EXPECT_EQ(b.labels[k].item<std::int64_t>(), b.indices[k] % 7);
      seen.push_back(b.indices[k]);
    }
  }
  EXPECT_EQ(seen, order);
  EXPECT_EQ(loader.batches_per_epoch(), 7);  // 50 / 8 rounded up: the last batch is partial
}

TEST(Loader, ShardsCoverTheDatasetOncePerEpoch) {
  auto ds = data::synthetic(101, 4, 4, 1, 3);
  std::multiset<std::int64_t> all;
  for (int rank = 0; rank < 4; ++rank) {
    data::LoaderOptions o;
    o.batch_size = 5;
    o.drop_last = false;
    o.workers = 2;
    o.shard = {rank, 4, true, 9, false};
    data::Loader loader(ds, train_transform(4), o);
    EXPECT_EQ(loader.samples_per_epoch(), 26);
    for (const auto& b : epoch(loader, 1)) all.insert(b.indices.begin(), b.indices.end());
  }
  std::set<std::int64_t> distinct(all.begin(), all.end());
  EXPECT_EQ(distinct.size(), 101u);  // every sample visited
  EXPECT_EQ(all.size(), 104u);       // 3 repeats pad 101 to 4 x 26
}

TEST(Loader, BadFilesAreReplacedAndReportedOnceOrStopTheRun) {
  const std::string root = imagenet_like();
  if (root.empty()) GTEST_SKIP() << "CONVNETS_IMAGENET_LIKE not set (the imagenet_like_data fixture sets it)";
  TempDir tmp;
  std::vector<fs::path> good;
  for (const auto& e : fs::directory_iterator(root + "/val/n00000000_astronaut")) good.push_back(e.path());
  std::sort(good.begin(), good.end());
  fs::create_directories(tmp.path / "c");
  for (int k = 0; k < 6; ++k) fs::copy_file(good[k], tmp.path / "c" / ("g" + std::to_string(k) + ".jpg"));
  std::ifstream in(good[0], std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  write(tmp.path / "c" / "a_zero.jpg", "");
  write(tmp.path / "c" / "b_truncated.jpg", bytes.substr(0, bytes.size() / 3));
  write(tmp.path / "c" / "c_text.png", "not an image at all");
  write(tmp.path / "c" / "d_corrupt.jpg", bytes.substr(0, 200) + std::string(2000, '\x55'));

  auto ds = data::image_folder(tmp.path.string());
  ASSERT_EQ(ds->size(), 10u);
  std::vector<std::string> reports;
  std::mutex m;
  data::LoaderOptions o;
  o.batch_size = 5;
  o.workers = 3;
  o.warn = [&](const std::string& msg) {
    std::lock_guard<std::mutex> lock(m);
    reports.push_back(msg);
  };
  data::Loader loader(ds, train_transform(), o);
  for (int e = 0; e < 3; ++e) {
    auto batches = epoch(loader, e);
    ASSERT_EQ(batches.size(), 2u);
    for (const auto& b : batches)
      for (auto i : b.indices) EXPECT_EQ(fs::path(ds->name(i)).filename().string()[0], 'g') << ds->name(i);
    EXPECT_EQ(loader.stats().bad_images, 4) << "epoch " << e;
  }
  EXPECT_EQ(reports.size(), 4u);  // once per file, not once per epoch
  for (const char* name : {"a_zero.jpg", "b_truncated.jpg", "c_text.png", "d_corrupt.jpg"}) {
    EXPECT_EQ(std::count_if(reports.begin(), reports.end(),
                            [&](const std::string& r) { return r.find(name) != std::string::npos; }),
              1)
        << name;
  }
  o.bad_images = data::BadImagePolicy::Fail;
  data::Loader strict(ds, train_transform(), o);
  strict.start_epoch(0);
  data::Batch b;
  try {
    while (strict.next(b)) {
    }
    FAIL() << "a bad file must stop the run under --bad-images fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(tmp.path.string()), std::string::npos) << e.what();
  }
}

TEST(Datasets, ImageFolderOrderListFileAndIdx) {
  TempDir tmp;
  for (const char* f : {"b/z.jpg", "b/sub/a.JPEG", "a/y.png", "a/x.jpg", "a/notes.txt"}) write(tmp.path / f, "x");
  auto ds = data::image_folder(tmp.path.string());
  ASSERT_EQ(ds->size(), 4u);
  EXPECT_EQ(ds->classes(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ds->name(0), (tmp.path / "a" / "x.jpg").string());
  EXPECT_EQ(ds->name(2), (tmp.path / "b" / "z.jpg").string());  // files of b/ before b/sub/ (os.walk order)
  EXPECT_EQ(ds->name(3), (tmp.path / "b" / "sub" / "a.JPEG").string());
  EXPECT_EQ(ds->label(3), 1);
  EXPECT_NE(ds->description().find("1 .txt"), std::string::npos) << ds->description();

  write(tmp.path / "list.txt", "a/x.jpg 0\n\nb/z.jpg 3\r\n");
  auto lf = data::list_file((tmp.path / "list.txt").string());
  EXPECT_EQ(lf->size(), 2u);
  EXPECT_EQ(lf->num_classes(), 4u);
  EXPECT_EQ(lf->label(1), 3);
  auto expect_error = [](auto fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  write(tmp.path / "bad.txt", "a/x.jpg 0\na/y.png one\n");
  expect_error([&] { data::list_file((tmp.path / "bad.txt").string()); }, "bad.txt:2: label 'one'");
  expect_error([&] { data::list_file((tmp.path / "list.txt").string(), "", 3); }, "list.txt:3: label 3 is out of range");
  // The path would be cut at the NUL by the file system's C strings: refused, naming the line.
  write(tmp.path / "nul.txt", std::string("a/x.jpg 0\na/y.png\0.jpg 1\n", 25));
  expect_error([&] { data::list_file((tmp.path / "nul.txt").string()); }, "nul.txt:2: a NUL byte in the line");
  write(tmp.path / "empty.txt", "\n");
  expect_error([&] { data::list_file((tmp.path / "empty.txt").string()); }, "no samples");
  fs::create_directories(tmp.path / "c");
  expect_error([&] { data::image_folder(tmp.path.string()); }, "class 'c' has no images");

  // IDX: 3 images 2x2 (gzip) + labels (raw).
  const std::string img_hdr("\0\0\x08\x03\0\0\0\x03\0\0\0\x02\0\0\0\x02", 16);
  gzFile g = gzopen((tmp.path / "i.gz").c_str(), "wb");
  const std::string img = img_hdr + std::string("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c", 12);
  gzwrite(g, img.data(), unsigned(img.size()));
  gzclose(g);
  write(tmp.path / "l", std::string("\0\0\x08\x01\0\0\0\x03\x02\x00\x01", 11));
  auto idx = data::idx_files((tmp.path / "i.gz").string(), (tmp.path / "l").string());
  ASSERT_EQ(idx->size(), 3u);
  EXPECT_EQ(idx->channels(), 1);
  EXPECT_EQ(idx->label(0), 2);
  data::SampleData s;
  idx->load(1, s);
  EXPECT_EQ(s.pixels.pixels, (std::vector<std::uint8_t>{5, 6, 7, 8}));
  write(tmp.path / "l2", std::string("\0\0\x08\x01\0\0\0\x02\x02\x00", 10));
  expect_error([&] { data::idx_files((tmp.path / "i.gz").string(), (tmp.path / "l2").string()); }, "holds 3 images but");
}

TEST(Datasets, FashionMnistFromDebianPackage) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir)) GTEST_SKIP() << dir << " absent (Debian package dataset-fashion-mnist; setup.sh installs it)";
  auto train = data::open_dataset(dir, "train"), val = data::open_dataset(dir, "val");
  EXPECT_EQ(train->size(), 60000u);
  EXPECT_EQ(val->size(), 10000u);
  EXPECT_EQ(train->num_classes(), 10u);
  data::SampleData s;
  train->load(0, s);
  EXPECT_EQ(s.pixels.width, 28);
  EXPECT_EQ(s.pixels.channels, 1);
  EXPECT_EQ(train->label(0), 9);  // the first training image is an ankle boot
  // Its classes by Zalando's names (its README's table), where IDX files carry numbers only; in a folder not named
  // for the set, the numbers.
  EXPECT_EQ(train->classes(), (std::vector<std::string>{"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                                                        "Shirt", "Sneaker", "Bag", "Ankle boot"}));
  EXPECT_EQ(val->classes(), train->classes());
}

TEST(Datasets, HoldoutSplitsTrainingDataIntoTwoDisjointParts) {
  auto base = data::synthetic(103, 4, 4, 1, 10);
  auto [rest, held] = data::holdout(base, 10);
  ASSERT_EQ(held->size(), 10u);
  ASSERT_EQ(rest->size(), 93u);
  EXPECT_EQ(held->classes(), base->classes());
  std::set<std::string> seen;
  for (std::size_t i = 0; i < held->size(); ++i) {
    EXPECT_EQ(held->name(i), base->name(i * 10));  // every 10th, as spread picks calibration images
    EXPECT_EQ(held->label(i), base->label(i * 10));
    seen.insert(held->name(i));
  }
  for (std::size_t i = 0; i < rest->size(); ++i) EXPECT_TRUE(seen.insert(rest->name(i)).second) << rest->name(i);
  EXPECT_EQ(seen.size(), base->size());  // together, every sample once
  data::SampleData a, b;
  held->load(3, a);
  base->load(30, b);
  EXPECT_EQ(a.pixels.pixels, b.pixels.pixels);
  for (const auto& [count, text] : {std::pair<std::size_t, std::string>{103, "--holdout takes 1 .. 102 samples"},
                                     {0, "cannot hold out 0 of the 103 samples"}}) {
    try {
      data::holdout(base, count);
      ADD_FAILURE() << "held out " << count;
    } catch (const Error& e) {
      EXPECT_NE((std::string(e.what()) + " " + e.hint()).find(text), std::string::npos) << e.what();
    }
  }
}

TEST(Normalize, MatchesTheFormulaInChannelsLastLayout) {
  auto images = torch::randint(0, 256, {2, 5, 7, 3}, torch::kByte);
  const std::array<double, 3> mean{0.485, 0.456, 0.406}, std{0.229, 0.224, 0.225};
  auto x = data::normalize_batch(images, mean, std, torch::kCPU, torch::kFloat);
  EXPECT_EQ(x.sizes(), (std::vector<std::int64_t>{2, 3, 5, 7}));
  EXPECT_TRUE(x.is_contiguous(torch::MemoryFormat::ChannelsLast));
  auto m = torch::tensor({0.485, 0.456, 0.406}, torch::kDouble).view({1, 3, 1, 1});
  auto s = torch::tensor({0.229, 0.224, 0.225}, torch::kDouble).view({1, 3, 1, 1});
  auto ref = (images.permute({0, 3, 1, 2}).to(torch::kDouble) / 255.0 - m) / s;
  EXPECT_LT((x.to(torch::kDouble) - ref).abs().max().item<double>(), 1e-5);
  // One channel (Fashion-MNIST) feeds 3-channel models as R = G = B.
  auto gray = data::normalize_batch(images.narrow(3, 0, 1), mean, std, torch::kCPU, torch::kFloat);
  auto g = (images.narrow(3, 0, 1).permute({0, 3, 1, 2}).to(torch::kDouble) / 255.0 - m) / s;
  EXPECT_LT((gray.to(torch::kDouble) - g).abs().max().item<double>(), 1e-5);
  EXPECT_THROW(data::normalize_batch(images.to(torch::kFloat), mean, std, torch::kCPU, torch::kFloat), Error);
  // Any output dtype and layout from the same single pass.
  auto half = data::normalize_batch(images, mean, std, torch::kCPU, torch::kBFloat16, torch::MemoryFormat::Contiguous);
  EXPECT_EQ(half.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(half.is_contiguous());
  EXPECT_TRUE(torch::equal(half, x.to(torch::kBFloat16).contiguous()));
}
