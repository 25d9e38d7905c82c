// The loader a user asks for, from the options they name: one place that turns them into a Loader, so that `train`, `bench data`, `eval` and the Python package's convnets.data.Loader load the same batches.
#pragma once

#include "codec/image.h"
#include "data/loader.h"

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace convnets::data {

struct PipelineOptions {
  bool train = true;  // RandomResizedCrop + flip (+ policy, erasing boxes); else resize + centre crop
  int image_size = 224;
  std::int64_t batch_size = 64;
  int workers = 0;   // 0: one per online CPU
  int prefetch = 2;  // batches per worker prepared ahead
  std::uint64_t seed = 0;
  // Drop the epoch's final partial batch; unset: drop when training. A
  // training loader that drops deals whole batches to ranks (ShardOptions::block);
  // one that keeps them deals samples as DistributedSampler does.
  std::optional<bool> drop_last;
  int rank = 0, world_size = 1;
  // Training transform.
  double crop_scale_min = 0.08;
  int crop_padding = 0;  // then RandomCrop(size, padding): shifts of up to this many pixels, zero fill
  bool flip = true;
  std::string interpolation = "bilinear";  // train: bilinear | bicubic | random; eval: bilinear | bicubic
  std::string augment;                     // "", autoaugment, or timm's rand-... string
  std::array<double, 3> mean{0.485, 0.456, 0.406};  // the policy's fill colour (timm: round(255 * mean))
  double reprob = 0;  // timm's random erasing: boxes drawn here, filled after normalisation
  int recount = 1;
  std::string remode = "const";
  // Evaluation transform: resize the short side to image_size / crop_ratio.
  double crop_ratio = 0.875;
  std::optional<bool> dct_scaling;  // unset: on for training, off for evaluation
  std::string bad_images = "skip";  // skip | fail
  std::int64_t max_image_pixels = codec::kDefaultMaxImagePixels;
  bool device_decode = false;  // --data-backend gpu
  std::function<void(const std::string&)> warn;  // bad-image reports; stderr if empty

  bool drops_last() const { return drop_last.value_or(train); }
};

// Checks every option, naming it as the caller spells it (core/options.h), and builds the
// transform's options.
TransformOptions transform_options(const PipelineOptions& o);

// The loader of `dataset` for `o`: the training order (a seeded shuffle per
// epoch) or, for evaluation, every sample once in order, split over ranks.
std::unique_ptr<Loader> make_loader(DatasetPtr dataset, const PipelineOptions& o);

}  // namespace convnets::data
