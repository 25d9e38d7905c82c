// ImageNet-recipe transforms with torchvision semantics: RandomResizedCrop + flip for training, resize + centre crop for eval.
#pragma once

#include "codec/image.h"
#include "codec/jpeg.h"
#include "data/augment.h"
#include "data/resample.h"
#include "data/rng.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace convnets::data {

// One sample as a dataset yields it: encoded file bytes (JPEG/PNG) or pixels.
struct SampleData {
  std::string name;                 // file path, or "file[index]", for messages
  std::vector<std::uint8_t> bytes;  // the encoded file, when `encoded`
  codec::Image pixels;              // raw pixels (IDX, synthetic), when !encoded
  bool encoded = true;
  // Set by Dataset::load: a shard stream learns a sample's label only when it
  // reads the sample, so the label travels with the bytes.
  std::int64_t label = 0;
};

// torchvision's (i, j, h, w): top row, left column, height, width.
struct CropBox {
  int top = 0, left = 0, height = 0, width = 0;
};

struct RandomResizedCropParams {
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
};

// torchvision.transforms.RandomResizedCrop.get_params: ten attempts at a
// random area fraction and log-uniform aspect ratio, then the centre-crop
// fallback clamped to the ratio range.
CropBox random_resized_crop_box(int width, int height, const RandomResizedCropParams& p, Rng& rng);

// torchvision's RandomCrop(size, padding) on a size x size image, in place:
// zero-pad by `padding` on every side, then take the window at a uniform
// random offset (fill 0, torchvision's default). `scratch` is reused storage.
void pad_and_crop(ImageRef img, int padding, Rng& rng, std::vector<std::uint8_t>& scratch);

// Resize(shorter side -> floor(size / crop_ratio)) + CenterCrop(size), as
// torchvision computes them (int() of the long side, Python's half-even round
// for the crop offset).
struct EvalGeometry {
  int resized_width = 0, resized_height = 0, top = 0, left = 0;
};
EvalGeometry eval_geometry(int width, int height, int size, double crop_ratio);

struct TransformOptions {
  enum class Mode { Train, Eval };
  Mode mode = Mode::Train;
  int size = 224;
  RandomResizedCropParams crop;
  bool flip = true;            // train: horizontal flip with p = 0.5
  // Train: torchvision's RandomCrop(size, padding) after the resized crop:
  // the size x size output is zero-padded by this many pixels on every side
  // and a size x size window taken at a uniform offset, i.e. shifted by up to
  // this many pixels each way (the CIFAR recipes' translation, He et al. 2015
  // sec. 4.2). 0: off. Runs on the host, after the decode.
  int crop_padding = 0;
  double crop_ratio = 0.875;   // eval: 224 / 0.875 = 256
  Filter filter = Filter::Bilinear;
  // timm's --train-interpolation random: each training sample picks bilinear
  // or bicubic with equal odds (RandomResizedCropAndInterpolation).
  bool random_filter = false;
  // Train: an augmentation policy applied to the crop (parse_augment_policy),
  // with the fill colour its geometric ops leave (timm: round(255 * mean)).
  std::string augment;
  Fill augment_fill{128, 128, 128};
  // Decode JPEGs at the smallest scale M/8 whose crop still has at least as
  // many pixels as the output. Output then differs slightly from full-scale
  // decoding, so it defaults on for training and off for evaluation.
  bool dct_scaling = true;
  // Resample in PIL's pass order, so that (without DCT scaling) output equals
  // torchvision's bit for bit; otherwise the cheaper order is used, which
  // differs by rounding only. On for evaluation, off for training.
  bool pil_exact = false;
  // Images above this many pixels (from the header) are refused before any
  // decoding: codec::check_image_size, PIL's decompression-bomb rule.
  std::int64_t max_pixels = codec::kDefaultMaxImagePixels;

  // The recipes' defaults: train is fast (DCT scaling, cheaper pass order),
  // eval reproduces torchvision exactly.
  static TransformOptions train(int size) {
    TransformOptions o;
    o.size = size;
    return o;
  }
  static TransformOptions eval(int size, double crop_ratio = 0.875, Filter filter = Filter::Bilinear) {
    TransformOptions o;
    o.mode = Mode::Eval;
    o.size = size;
    o.crop_ratio = crop_ratio;
    o.filter = filter;
    o.flip = false;
    o.dct_scaling = false;
    o.pil_exact = true;
    return o;
  }
};

// Per-thread decoders and buffers, reused across samples.
struct Workspace {
  codec::JpegDecoder jpeg;
  codec::Image decoded;
  std::vector<std::uint8_t> scratch;
  std::vector<std::int32_t> accum;
  std::vector<std::uint8_t> augment;
};

// What the transform does to one sample once its random choices are made:
// decode `region` (in the image scaled by scale/8) and resample it through
// px/py (whose taps are local to lo_x/lo_y) to out_w x out_h, mirrored if
// `flip`. The device decoder follows the same plan.
struct SamplePlan {
  codec::ImageFormat format = codec::ImageFormat::Unknown;
  codec::Rect full;  // full-resolution size
  int scale = 8;     // DCT scaling M/8 (JPEG only)
  int lo_x = 0, lo_y = 0;
  AxisPlan px, py;
  codec::Rect region;
  int out_w = 0, out_h = 0;
  bool flip = false;
};

struct TransformTimes {
  double decode_s = 0, transform_s = 0;
};

class Transform {
 public:
  explicit Transform(TransformOptions options);  // validates; throws Error naming the option
  const TransformOptions& options() const { return options_; }
  bool augments() const { return augmenter_ != nullptr; }
  int size() const { return options_.size; }

  // Writes size x size x channels uint8 (HWC) to dst. Randomness comes only
  // from `rng`. Throws codec::DecodeError for an undecodable sample.
  void apply(const SampleData& sample, Rng& rng, Workspace& ws, std::uint8_t* dst, TransformTimes* times) const;

  // apply() in two halves: the random choices and geometry (opening the
  // JPEG header in `ws`), then the decode and resample.
  SamplePlan plan(const SampleData& sample, Rng& rng, Workspace& ws) const;
  SamplePlan plan_crop(const SampleData& sample, const CropBox& box, bool flip, Workspace& ws) const;
  // Returns the channel count written.
  int render(const SampleData& sample, const SamplePlan& plan, Workspace& ws, std::uint8_t* dst,
             TransformTimes* times) const;

  // The training transform for a given box and flip: the deterministic part
  // of apply(), which tests compare with PIL's crop + resize.
  void apply_crop(const SampleData& sample, const CropBox& box, bool flip, Workspace& ws, std::uint8_t* dst,
                  TransformTimes* times) const;

 private:
  TransformOptions options_;
  std::shared_ptr<const Augmenter> augmenter_;
};

}  // namespace convnets::data
