// Hybrid JPEG decoding (coefficients on the CPU, the rest on the device) against libjpeg-turbo's own decode and the CPU loader; on CUDA when present.
#include "codec/jpeg.h"
#include "data/dataset.h"
#include "data/device_decode.h"
#include "data/loader.h"

#include "imagenet_like.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <jpeglib.h>

namespace fs = std::filesystem;
using namespace convnets;

namespace {

struct Variant {
  const char* name;
  int width, height, h_samp, v_samp;  // luma sampling factors (chroma 1x1)
  bool gray, progressive;
};

// A photograph-like test card: smooth gradients, edges and fine noise, so every
// frequency band and both chroma channels carry signal.
std::vector<std::uint8_t> encode(const Variant& v) {
  std::vector<std::uint8_t> rgb(std::size_t(v.width) * v.height * 3);
  std::uint32_t h = 12345;
  for (int y = 0; y < v.height; ++y)
    for (int x = 0; x < v.width; ++x) {
      h = h * 1664525u + 1013904223u;
      const int noise = static_cast<int>(h >> 28) - 8;
      std::uint8_t* p = &rgb[(std::size_t(y) * v.width + x) * 3];
      const bool edge = ((x / 13) + (y / 11)) % 2 == 0;
      p[0] = static_cast<std::uint8_t>(std::clamp((x * 255) / v.width + noise, 0, 255));
      p[1] = static_cast<std::uint8_t>(std::clamp((y * 255) / v.height + (edge ? 40 : -40) + noise, 0, 255));
      p[2] = static_cast<std::uint8_t>(std::clamp(((x + y) * 3) % 256 + noise, 0, 255));
    }
  jpeg_compress_struct c{};
  jpeg_error_mgr err{};
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &out, &size);
  c.image_width = v.width;
  c.image_height = v.height;
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 90, TRUE);
  if (v.gray) {
    jpeg_set_colorspace(&c, JCS_GRAYSCALE);
  } else {
    c.comp_info[0].h_samp_factor = v.h_samp;
    c.comp_info[0].v_samp_factor = v.v_samp;
    c.comp_info[1].h_samp_factor = c.comp_info[1].v_samp_factor = 1;
    c.comp_info[2].h_samp_factor = c.comp_info[2].v_samp_factor = 1;
  }
  if (v.progressive) jpeg_simple_progression(&c);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = &rgb[std::size_t(c.next_scanline) * v.width * 3];
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  std::vector<std::uint8_t> bytes(out, out + size);
  jpeg_destroy_compress(&c);
  std::free(out);
  return bytes;
}

data::SampleData sample_of(std::vector<std::uint8_t> bytes, const std::string& name) {
  data::SampleData s;
  s.name = name;
  s.bytes = std::move(bytes);
  return s;
}

std::vector<std::uint8_t> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

const std::vector<Variant> kVariants = {
    {"4:4:4", 203, 157, 1, 1, false, false}, {"4:2:2", 203, 157, 2, 1, false, false},
    {"4:2:0", 203, 157, 2, 2, false, false}, {"4:2:0 progressive", 161, 205, 2, 2, false, true},
    {"gray", 203, 157, 1, 1, true, false},
};

// Full-scale S x S crops at the corners and the middle, plain and flipped,
// through the device path (as host loops); returns the largest difference from
// libjpeg-turbo's whole-image decode and counts the images the device decoded.
int full_scale_max_diff(const data::SampleData& s, int size, std::int64_t& device_images) {
  const codec::Image full = codec::decode_jpeg(s.bytes.data(), s.bytes.size(), s.name);
  auto o = data::TransformOptions::eval(size);
  o.mode = data::TransformOptions::Mode::Train;
  const data::Transform t(o);  // no DCT scaling, Pillow's pass order
  data::EncodedBatchBuilder builder(t, 3);
  data::Workspace ws;
  struct Crop {
    int left, top;
    bool flip;
  };
  const int w = full.width, h = full.height;
  const std::vector<Crop> crops = {{0, 0, false}, {w - size, h - size, true}, {(w - size) / 2, (h - size) / 2, false},
                                   {w - size, 0, false}, {0, h - size, true}, {(w - size) / 3, (h - size) / 3, true}};
  for (const Crop& c : crops) builder.add(s, t.plan_crop(s, {c.top, c.left, size, size}, c.flip, ws), ws, nullptr);
  const data::EncodedBatch batch = builder.finish(false);
  device_images = batch.device_images;
  const at::Tensor out = data::decode_on_device(batch, at::kCPU, at::kByte);
  int worst = 0;
  for (std::size_t k = 0; k < crops.size(); ++k) {
    const Crop& c = crops[k];
    const auto* got = out[static_cast<std::int64_t>(k)].data_ptr<std::uint8_t>();
    for (int y = 0; y < size; ++y)
      for (int x = 0; x < size; ++x)
        for (int ch = 0; ch < 3; ++ch) {
          const int sx = c.left + (c.flip ? size - 1 - x : x);
          const int want = full.pixels[(std::size_t(c.top + y) * w + sx) * 3 + ch];
          worst = std::max(worst, std::abs(int(got[(std::size_t(y) * size + x) * 3 + ch]) - want));
        }
  }
  return worst;
}

}  // namespace

// The bar: the device decode equals the CPU decoder within 2 per pixel at full
// scale. The IDCT, upsampling and colour conversion reproduce libjpeg-turbo's
// integer arithmetic, so the difference is in fact 0.
TEST(DeviceDecode, FullScaleEqualsLibjpegTurboForEverySampling) {
  for (const Variant& v : kVariants) {
    std::int64_t device = 0;
    const int diff = full_scale_max_diff(sample_of(encode(v), v.name), 64, device);
    EXPECT_EQ(device, 6) << v.name << " was not decoded on the device path";
    EXPECT_LE(diff, 2) << v.name;
    EXPECT_EQ(diff, 0) << v.name << ": expected bit-exact islow IDCT, fancy upsampling and colour conversion";
  }
}

TEST(DeviceDecode, FullScaleEqualsLibjpegTurboOnTheImageNetLikeSet) {
  const std::string root = imagenet_like();
  if (root.empty()) GTEST_SKIP() << "CONVNETS_IMAGENET_LIKE not set (the imagenet_like_data fixture sets it)";
  int files = 0, worst = 0;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(root) / "val")) {
    if (!e.is_regular_file() || e.path().extension() != ".JPEG") continue;
    std::int64_t device = 0;
    worst = std::max(worst, full_scale_max_diff(sample_of(read_file(e.path()), e.path().string()), 128, device));
    EXPECT_EQ(device, 6) << e.path();
    ++files;
  }
  EXPECT_GE(files, 40);
  EXPECT_LE(worst, 2);
  EXPECT_EQ(worst, 0);
}

// A layout the kernels do not take (4:4:0: vertical-only chroma subsampling)
// and a PNG are rendered by the CPU transform and pass through unchanged.
TEST(DeviceDecode, OtherLayoutsFallBackToTheCpuTransform) {
  const Variant v{"4:4:0", 150, 120, 1, 2, false, false};
  const data::SampleData s = sample_of(encode(v), v.name);
  const data::Transform t(data::TransformOptions::train(48));
  data::EncodedBatchBuilder builder(t, 3);
  data::Workspace ws;
  data::Rng rng(7, 0, 0);
  builder.add(s, rng, ws, nullptr);
  const data::EncodedBatch batch = builder.finish(false);
  EXPECT_EQ(batch.device_images, 0);
  EXPECT_EQ(batch.fallback_images, 1);
  std::vector<std::uint8_t> want(48 * 48 * 3);
  data::Rng rng2(7, 0, 0);
  t.apply(s, rng2, ws, want.data(), nullptr);
  const at::Tensor got = data::decode_on_device(batch, at::kCPU, at::kByte);
  EXPECT_EQ(0, std::memcmp(got.data_ptr<std::uint8_t>(), want.data(), want.size()));
}

// Whole training batches: the device path makes the CPU path's random choices
// (same crops and flips, same samples) and its pixels differ only where the
// reduced-size IDCTs (DCT-domain scaling 1/2, 1/4) round differently: by 1.
TEST(DeviceDecode, LoaderBatchesMatchTheCpuLoader) {
  const std::string root = imagenet_like();
  if (root.empty()) GTEST_SKIP() << "CONVNETS_IMAGENET_LIKE not set (the imagenet_like_data fixture sets it)";
  auto ds = data::open_dataset(root, "train");
  auto o = data::TransformOptions::train(112);
  o.pil_exact = true;  // the kernels' pass order
  auto t = std::make_shared<const data::Transform>(o);
  data::LoaderOptions lo;
  lo.batch_size = 32;
  lo.workers = 2;
  lo.shard.seed = 3;
  data::Loader cpu(ds, t, lo);
  lo.device_decode = true;
  data::Loader dev(ds, t, lo);
  cpu.start_epoch(1);
  dev.start_epoch(1);
  data::Batch a, b;
  double sum = 0;
  std::int64_t count = 0, off_by_more_than_2 = 0;
  int worst = 0;
  for (int k = 0; k < 3; ++k) {
    ASSERT_TRUE(cpu.next(a));
    ASSERT_TRUE(dev.next(b));
    ASSERT_FALSE(b.images.defined());
    ASSERT_TRUE(b.encoded);
    EXPECT_EQ(a.indices, b.indices);
    EXPECT_TRUE(torch::equal(a.labels, b.labels));
    EXPECT_EQ(b.encoded->device_images, 32);
    const at::Tensor got = data::decode_on_device(*b.encoded, at::kCPU, at::kByte);
    ASSERT_EQ(got.sizes(), a.images.sizes());
    const at::Tensor d = (got.to(at::kInt) - a.images.to(at::kInt)).abs();
    sum += d.sum().item<double>();
    count += d.numel();
    off_by_more_than_2 += (d > 2).sum().item<std::int64_t>();
    worst = std::max(worst, d.max().item<int>());
  }
  EXPECT_GT(dev.stats().device_images, 0);
  const double mean = sum / static_cast<double>(count);
  std::printf("device vs CPU loader: mean |diff| %.4f, max %d, %.5f%% of values off by more than 2\n", mean, worst,
              100.0 * static_cast<double>(off_by_more_than_2) / static_cast<double>(count));
  // Measured: mean 0.0105, max 1 (libjpeg's 4x4/2x2 IDCT shortcuts vs exact averages).
  EXPECT_LT(mean, 0.05);
  EXPECT_EQ(off_by_more_than_2, 0);
  EXPECT_LE(worst, 2);
}

TEST(DeviceDecode, NormalisedOutputIsTheLoaderNormalisationOfTheRawPixels) {
  std::vector<std::uint8_t> bytes = encode(kVariants[2]);
  const data::SampleData s = sample_of(bytes, "card");
  const data::Transform t(data::TransformOptions::train(40));
  data::EncodedBatchBuilder builder(t, 3);
  data::Workspace ws;
  for (int k = 0; k < 3; ++k) {
    data::Rng rng(1, 0, k);
    builder.add(s, rng, ws, nullptr);
  }
  const data::EncodedBatch batch = builder.finish(false);
  const std::array<double, 3> mean{0.485, 0.456, 0.406}, std{0.229, 0.224, 0.225};
  const at::Tensor raw = data::decode_on_device(batch, at::kCPU, at::kByte);
  const at::Tensor want = data::normalize_batch(raw, mean, std, at::kCPU, at::kFloat);
  const at::Tensor got = data::decode_on_device(batch, at::kCPU, at::kFloat, mean, std);
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_TRUE(got.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_LT((got - want).abs().max().item<double>(), 1e-5);
}

// The CUDA kernels run the same per-element code as the host loops above:
// identical pixels, and fp16 within its rounding.
TEST(DeviceDecode, CudaKernelsEqualTheHostLoops) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: the kernels' host loops are tested above";
  const data::Transform t(data::TransformOptions::train(96));
  data::EncodedBatchBuilder builder(t, 3);
  data::Workspace ws;
  int k = 0;
  for (const Variant& v : kVariants) {
    data::Rng rng(5, 0, k++);
    builder.add(sample_of(encode(v), v.name), rng, ws, nullptr);
  }
  const data::EncodedBatch batch = builder.finish(true);
  const at::Tensor cpu = data::decode_on_device(batch, at::kCPU, at::kByte);
  const at::Tensor gpu = data::decode_on_device(batch, at::Device(at::kCUDA, 0), at::kByte).cpu();
  EXPECT_TRUE(torch::equal(cpu, gpu));
  const std::array<double, 3> mean{0.485, 0.456, 0.406}, std{0.229, 0.224, 0.225};
  const at::Tensor f32 = data::decode_on_device(batch, at::kCPU, at::kFloat, mean, std);
  const at::Tensor f16 = data::decode_on_device(batch, at::Device(at::kCUDA, 0), at::kHalf, mean, std).cpu().to(at::kFloat);
  EXPECT_LT((f16 - f32).abs().max().item<double>(), 1e-2);
}
