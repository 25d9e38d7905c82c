#include "data/transforms.h"

#include "codec/png.h"
#include "core/options.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

namespace convnets::data {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Where the output comes from: a source box in full-resolution coordinates
// (PIL's resize box), the rectangle the filter may read (a crop clamps the
// filter to itself; a plain resize reads the whole image), and which window of
// a full_w x full_h virtual output to compute.
struct Geometry {
  double bx0, by0, bx1, by1;
  codec::Rect clamp;
  int full_w, full_h, out_x, out_y, out_w, out_h;
  bool flip;
};

// Full-resolution size of a sample; opens the JPEG header in `ws` as a side effect.
codec::Rect source_size(const SampleData& s, Workspace& ws, std::int64_t max_pixels, codec::ImageFormat& format) {
  if (!s.encoded) {
    format = codec::ImageFormat::Unknown;
    return {0, 0, s.pixels.width, s.pixels.height};
  }
  format = codec::sniff_format(s.bytes.data(), s.bytes.size());
  codec::Rect full;
  switch (format) {
    case codec::ImageFormat::Jpeg:
      full = ws.jpeg.open(s.bytes.data(), s.bytes.size(), s.name);
      break;
    case codec::ImageFormat::Png:
      full = codec::png_size(s.bytes.data(), s.bytes.size(), s.name);
      break;
    default:
      if (s.bytes.empty()) throw codec::DecodeError(s.name + ": empty file (0 bytes)");
      throw codec::DecodeError(s.name + ": not a JPEG or PNG image (unrecognised leading bytes)");
  }
  codec::check_image_size(full, max_pixels, s.name);
  return full;
}

SamplePlan plan_render(codec::ImageFormat format, codec::Rect full, const Geometry& g, bool dct_scaling,
                       Filter filter) {
  SamplePlan p;
  p.format = format;
  p.full = full;
  p.flip = g.flip;
  p.out_w = g.out_w;
  p.out_h = g.out_h;
  if (format == codec::ImageFormat::Jpeg && dct_scaling) {
    // Smallest M whose scaled box still covers the output without upsampling.
    // Only 1/8, 1/4 and 1/2: libjpeg-turbo has SIMD IDCTs for those (and 4:2:0
    // chroma then lands on 8x8); other M/8 use plain-C 6x6..14x14 IDCTs that
    // measured slower than decoding at full scale.
    for (int m : {1, 2, 4}) {
      if ((g.bx1 - g.bx0) * m / 8.0 >= g.full_w && (g.by1 - g.by0) * m / 8.0 >= g.full_h) {
        p.scale = m;
        break;
      }
    }
  }
  int lo_x = g.clamp.x, hi_x = g.clamp.x + g.clamp.width, lo_y = g.clamp.y, hi_y = g.clamp.y + g.clamp.height;
  const double f = p.scale / 8.0;
  if (p.scale != 8) {
    lo_x = static_cast<int>(std::floor(lo_x * f));
    lo_y = static_cast<int>(std::floor(lo_y * f));
    hi_x = std::min(static_cast<int>(std::ceil(hi_x * f)), codec::JpegDecoder::scaled_size(full.width, p.scale));
    hi_y = std::min(static_cast<int>(std::ceil(hi_y * f)), codec::JpegDecoder::scaled_size(full.height, p.scale));
  }
  p.lo_x = lo_x;
  p.lo_y = lo_y;
  p.px = plan_axis(hi_x - lo_x, g.bx0 * f - lo_x, g.bx1 * f - lo_x, g.full_w, g.out_x, g.out_w, filter);
  p.py = plan_axis(hi_y - lo_y, g.by0 * f - lo_y, g.by1 * f - lo_y, g.full_h, g.out_y, g.out_h, filter);
  p.region = {lo_x + p.px.src_begin, lo_y + p.py.src_begin, p.px.src_end - p.px.src_begin,
              p.py.src_end - p.py.src_begin};
  return p;
}

// A crop then a resize to n x n: the filter reads only inside the box, as
// PIL does after Image.crop (torchvision's resized_crop).
Geometry crop_geometry(const CropBox& b, bool flip, int n) {
  return {double(b.left), double(b.top), double(b.left + b.width), double(b.top + b.height),
          {b.left, b.top, b.width, b.height}, n, n, 0, 0, n, n, flip};
}

}  // namespace

void pad_and_crop(ImageRef img, int padding, Rng& rng, std::vector<std::uint8_t>& scratch) {
  // torchvision's RandomCrop.get_params draws the row, then the column, of
  // the window in the padded image: i in [0, h + 2p - h], j likewise.
  const int top = static_cast<int>(rng.integer(0, 2 * padding));
  const int left = static_cast<int>(rng.integer(0, 2 * padding));
  const int dy = top - padding, dx = left - padding;  // output (y, x) reads source (y + dy, x + dx)
  if (dx == 0 && dy == 0) return;
  if (std::abs(dx) >= img.width || std::abs(dy) >= img.height) {  // the window holds padding only
    std::fill(img.data, img.data + img.bytes(), std::uint8_t{0});
    return;
  }
  const std::size_t row = std::size_t(img.width) * img.channels;
  scratch.assign(img.data, img.data + img.bytes());
  std::fill(img.data, img.data + img.bytes(), std::uint8_t{0});
  const int x0 = std::max(0, -dx), x1 = std::min(img.width, img.width - dx);
  for (int y = std::max(0, -dy); y < std::min(img.height, img.height - dy); ++y) {
    std::copy_n(scratch.data() + (y + dy) * row + std::size_t(x0 + dx) * img.channels,
                std::size_t(x1 - x0) * img.channels, img.data + y * row + std::size_t(x0) * img.channels);
  }
}

CropBox random_resized_crop_box(int width, int height, const RandomResizedCropParams& p, Rng& rng) {
  const double area = double(height) * width;
  const double log_lo = std::log(p.ratio_min), log_hi = std::log(p.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.uniform(p.scale_min, p.scale_max);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    // Python's round() is half-to-even, as is nearbyint in the default mode.
    const int w = static_cast<int>(std::nearbyint(std::sqrt(target_area * aspect)));
    const int h = static_cast<int>(std::nearbyint(std::sqrt(target_area / aspect)));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int top = static_cast<int>(rng.integer(0, height - h));
      const int left = static_cast<int>(rng.integer(0, width - w));
      return {top, left, h, w};
    }
  }
  const double in_ratio = double(width) / height;
  int w = width, h = height;
  if (in_ratio < p.ratio_min) {
    h = static_cast<int>(std::nearbyint(w / p.ratio_min));
  } else if (in_ratio > p.ratio_max) {
    w = static_cast<int>(std::nearbyint(h * p.ratio_max));
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

EvalGeometry eval_geometry(int width, int height, int size, double crop_ratio) {
  const int short_target = static_cast<int>(std::floor(size / crop_ratio + 1e-9));
  EvalGeometry g;
  if (width <= height) {
    g.resized_width = short_target;
    g.resized_height = static_cast<int>(double(std::int64_t(short_target) * height) / width);
  } else {
    g.resized_height = short_target;
    g.resized_width = static_cast<int>(double(std::int64_t(short_target) * width) / height);
  }
  g.top = static_cast<int>(std::nearbyint((g.resized_height - size) / 2.0));
  g.left = static_cast<int>(std::nearbyint((g.resized_width - size) / 2.0));
  return g;
}

Transform::Transform(TransformOptions options) : options_(options) {
  const auto& o = options_;
  if (o.size < 1 || o.size > 8192) throw Error("transform: --size " + std::to_string(o.size) + " is not in 1..8192");
  if (!(o.crop_ratio > 0.0 && o.crop_ratio <= 1.0))
    throw Error("transform: crop ratio " + std::to_string(o.crop_ratio) + " is not in (0, 1]",
                "0.875 gives torchvision's Resize(256) + CenterCrop(224)");
  const auto& c = o.crop;
  if (!(c.scale_min > 0 && c.scale_min <= c.scale_max && c.scale_max <= 1.0))
    throw Error("transform: crop scale range [" + std::to_string(c.scale_min) + ", " + std::to_string(c.scale_max) +
                "] must satisfy 0 < min <= max <= 1");
  if (!(c.ratio_min > 0 && c.ratio_min <= c.ratio_max))
    throw Error("transform: crop aspect-ratio range must satisfy 0 < min <= max");
  options::check_crop_padding(o.crop_padding, o.size, o.mode == TransformOptions::Mode::Train);
  const AugmentPolicy policy = parse_augment_policy(o.augment, "--augment");
  if (policy.kind != AugmentPolicy::Kind::None) {
    if (o.mode != TransformOptions::Mode::Train) throw Error("transform: --augment applies to training only");
    // DLE's AutoAugment fills with grey 128 whatever the mean; timm's RandAugment with the mean colour.
    const Fill fill = policy.kind == AugmentPolicy::Kind::AutoAugment ? Fill{128, 128, 128} : o.augment_fill;
    augmenter_ = std::make_shared<const Augmenter>(policy, fill, o.random_filter,
                                                   o.filter == Filter::Bicubic ? Resample::Bicubic : Resample::Bilinear);
  }
}

int Transform::render(const SampleData& s, const SamplePlan& p, Workspace& ws, std::uint8_t* dst,
                      TransformTimes* times) const {
  auto t0 = Clock::now();
  codec::ImageView view;
  if (p.format == codec::ImageFormat::Jpeg) {
    view = ws.jpeg.decode(p.scale, p.region);
  } else {
    const codec::Image* img = &s.pixels;
    if (p.format == codec::ImageFormat::Png) {
      codec::decode_png(s.bytes.data(), s.bytes.size(), s.name, ws.decoded);
      img = &ws.decoded;
    }
    view = img->view();
    view.data += p.region.y * view.stride + std::ptrdiff_t(p.region.x) * view.channels;
    view.width = p.region.width;
    view.height = p.region.height;
  }
  auto t1 = Clock::now();
  resample(view, p.px, p.py, dst, std::ptrdiff_t(p.out_w) * view.channels, p.flip, options_.pil_exact, ws.scratch,
           ws.accum);
  if (times) {
    times->decode_s += std::chrono::duration<double>(t1 - t0).count();
    times->transform_s += since(t1);
  }
  return view.channels;
}

SamplePlan Transform::plan_crop(const SampleData& sample, const CropBox& box, bool flip, Workspace& ws) const {
  codec::ImageFormat format;
  const codec::Rect full = source_size(sample, ws, options_.max_pixels, format);
  return plan_render(format, full, crop_geometry(box, flip, options_.size), options_.dct_scaling, options_.filter);
}

void Transform::apply_crop(const SampleData& sample, const CropBox& box, bool flip, Workspace& ws, std::uint8_t* dst,
                           TransformTimes* times) const {
  render(sample, plan_crop(sample, box, flip, ws), ws, dst, times);
}

SamplePlan Transform::plan(const SampleData& sample, Rng& rng, Workspace& ws) const {
  codec::ImageFormat format;
  const codec::Rect full = source_size(sample, ws, options_.max_pixels, format);
  if (full.width <= 0 || full.height <= 0) throw codec::DecodeError(sample.name + ": image has no pixels");
  const int n = options_.size;
  if (options_.mode == TransformOptions::Mode::Train) {
    const CropBox box = random_resized_crop_box(full.width, full.height, options_.crop, rng);
    const Filter filter = options_.random_filter ? (rng.coin() ? Filter::Bicubic : Filter::Bilinear) : options_.filter;
    const bool flip = options_.flip && rng.coin();
    return plan_render(format, full, crop_geometry(box, flip, n), options_.dct_scaling, filter);
  }
  const EvalGeometry e = eval_geometry(full.width, full.height, n, options_.crop_ratio);
  const Geometry g{0.0, 0.0, double(full.width), double(full.height), full, e.resized_width, e.resized_height,
                   e.left, e.top, n, n, false};
  return plan_render(format, full, g, options_.dct_scaling, options_.filter);
}

void Transform::apply(const SampleData& sample, Rng& rng, Workspace& ws, std::uint8_t* dst,
                      TransformTimes* times) const {
  const int channels = render(sample, plan(sample, rng, ws), ws, dst, times);
  if (options_.crop_padding > 0) {
    const auto t0 = Clock::now();
    pad_and_crop({dst, options_.size, options_.size, channels}, options_.crop_padding, rng, ws.augment);
    if (times) times->transform_s += since(t0);
  }
  if (augmenter_) {
    const auto t0 = Clock::now();
    augmenter_->apply({dst, options_.size, options_.size, channels}, rng, ws.augment);
    if (times) times->transform_s += since(t0);
  }
}

}  // namespace convnets::data
