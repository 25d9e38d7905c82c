// Augmentation policies on the loader threads (timm's RandAugment, DLE's AutoAugment, timm's random erasing boxes), drawing their ops and magnitudes as the references do.
#pragma once

#include "data/pil_ops.h"
#include "data/rng.h"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace convnets::data {

// timm's img_mean fill for the dataset's mean (0..1 scale): min(255, round(255 * mean)), Python's half-even round.
Fill mean_fill(const std::array<double, 3>& mean);

// A policy by name: "" (none), "autoaugment" (DLE's AutoaugmentImageNetPolicy,
// its 25 sub-policies) or timm's RandAugment string, rand-mM[-nN][-mstdS]
// [-mmaxX][-incK][-w0] (timm 0.5.4's grammar: any inc section, even inc0,
// selects the "increasing" ops, as bool('0') is True there).
struct AugmentPolicy {
  enum class Kind { None, AutoAugment, RandAugment };
  Kind kind = Kind::None;
  std::string spec;
  int num_layers = 2;
  double magnitude = 10, magnitude_std = 0, magnitude_max = 0;  // mstd > 100 -> infinity (uniform)
  bool increasing = false;
  bool weighted = false;  // w0: timm's _RAND_CHOICE_WEIGHTS_0, drawn without replacement
};
AugmentPolicy parse_augment_policy(const std::string& spec, const std::string& flag);

class Augmenter {
 public:
  // fill: the colour geometric ops leave where no source pixel lands (timm:
  // the dataset mean x 255, rounded; DLE: 128). RandAugment's geometric ops
  // pick bilinear or bicubic per op when `random_resample`, as timm does when
  // --train-interpolation is random, else use `resample`.
  Augmenter(AugmentPolicy policy, Fill fill, bool random_resample, Resample resample);
  const AugmentPolicy& policy() const { return policy_; }
  // What one apply() did, op by op (for the distribution tests): the op's
  // timm name and its argument after the level function (0 for none).
  struct Applied {
    const char* op;
    double arg;
  };
  // Draws only from `rng`, so a sample's augmentation depends on (seed, epoch, index) alone.
  void apply(ImageRef img, Rng& rng, std::vector<std::uint8_t>& scratch, std::vector<Applied>* trace = nullptr) const;

 private:
  void rand_augment(ImageRef img, Rng& rng, std::vector<std::uint8_t>& scratch, std::vector<Applied>* trace) const;
  void auto_augment(ImageRef img, Rng& rng, std::vector<std::uint8_t>& scratch, std::vector<Applied>* trace) const;
  AugmentPolicy policy_;
  Fill fill_;
  bool random_resample_;
  Resample resample_;
};

// timm's RandomErasing box draw (random_erasing.py _erase): with probability
// `prob`, randint(1, count) boxes of area fraction U(min_area, max_area) / that and
// log-uniform aspect in [min_aspect, 1 / min_aspect]; ten tries each, a box
// strictly smaller than the image. The fill happens on the device, after
// normalisation (timm's prefetcher), see apply_random_erasing.
struct ErasingParams {
  double prob = 0;
  double min_area = 0.02, max_area = 1.0 / 3.0, min_aspect = 0.3;
  int count = 1;
  std::string mode = "const";  // const | rand | pixel
};
struct EraseBox {
  int top = 0, left = 0, height = 0, width = 0;  // height 0: none
};
void draw_erase_boxes(const ErasingParams& p, int height, int width, Rng& rng, EraseBox* out);

}  // namespace convnets::data
