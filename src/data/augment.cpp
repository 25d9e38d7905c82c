#include "data/augment.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

// -ffp-contract=off as pil_ops.cpp: the policies' magnitudes (np.linspace, timm's level functions) are doubles
// computed as numpy and Python compute them, one rounding per operation.
namespace convnets::data {
Fill mean_fill(const std::array<double, 3>& mean) {
  Fill f;
  for (int c = 0; c < 3; ++c) f[c] = static_cast<std::uint8_t>(std::min(255.0, std::nearbyint(255.0 * mean[c])));
  return f;
}

namespace {

constexpr double kLevelDenom = 10.0;  // timm 0.5.4's _LEVEL_DENOM

enum class Op {
  AutoContrast, Equalize, Invert, Rotate, Posterize, Solarize, SolarizeAdd, Color, Contrast, Brightness,
  Sharpness, ShearX, ShearY, TranslateXRel, TranslateYRel,
  TranslateXAbs, TranslateYAbs  // DLE's AutoAugment only
};

// timm's _RAND_TRANSFORMS order (the increasing list differs in level functions only).
constexpr Op kRandOps[] = {Op::AutoContrast, Op::Equalize,  Op::Invert,     Op::Rotate,       Op::Posterize,
                           Op::Solarize,     Op::SolarizeAdd, Op::Color,    Op::Contrast,     Op::Brightness,
                           Op::Sharpness,    Op::ShearX,    Op::ShearY,     Op::TranslateXRel, Op::TranslateYRel};
const char* const kOpNames[] = {"AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize",
                                "SolarizeAdd", "Color", "Contrast", "Brightness", "Sharpness", "ShearX",
                                "ShearY", "TranslateXRel", "TranslateYRel", "TranslateX", "TranslateY"};
// _RAND_CHOICE_WEIGHTS_0 in the order above.
constexpr double kRandWeights0[] = {0.025, 0.005, 0, 0.3, 0, 0.005, 0.005, 0.025, 0.005, 0.005, 0.025, 0.2, 0.2, 0.1, 0.1};

void apply_geometric(Op op, ImageRef img, double v, Resample r, const Fill& fill, std::vector<std::uint8_t>& s) {
  switch (op) {
    case Op::Rotate: pil::rotate(img, v, r, fill, s); break;
    case Op::ShearX: pil::affine(img, {1, v, 0, 0, 1, 0}, r, fill, s); break;
    case Op::ShearY: pil::affine(img, {1, 0, 0, v, 1, 0}, r, fill, s); break;
    case Op::TranslateXRel: pil::affine(img, {1, 0, v * img.width, 0, 1, 0}, r, fill, s); break;
    case Op::TranslateYRel: pil::affine(img, {1, 0, 0, 0, 1, v * img.height}, r, fill, s); break;
    case Op::TranslateXAbs: pil::affine(img, {1, 0, v, 0, 1, 0}, r, fill, s); break;
    case Op::TranslateYAbs: pil::affine(img, {1, 0, 0, 0, 1, v}, r, fill, s); break;
    default: break;
  }
}

// DLE's autoaugment.py: each sub-policy is two (op, probability, magnitude
// index) triples; magnitudes are np.linspace ranges over 11 indices.
struct PolicyOp {
  Op op;
  double p;
  int idx;
};
constexpr PolicyOp kImageNetPolicy[25][2] = {
    {{Op::Equalize, 0.8, 1}, {Op::ShearY, 0.8, 4}},        {{Op::Color, 0.4, 9}, {Op::Equalize, 0.6, 3}},
    {{Op::Color, 0.4, 1}, {Op::Rotate, 0.6, 8}},           {{Op::Solarize, 0.8, 3}, {Op::Equalize, 0.4, 7}},
    {{Op::Solarize, 0.4, 2}, {Op::Solarize, 0.6, 2}},      {{Op::Color, 0.2, 0}, {Op::Equalize, 0.8, 8}},
    {{Op::Equalize, 0.4, 8}, {Op::SolarizeAdd, 0.8, 3}},   {{Op::ShearX, 0.2, 9}, {Op::Rotate, 0.6, 8}},
    {{Op::Color, 0.6, 1}, {Op::Equalize, 1.0, 2}},         {{Op::Invert, 0.4, 9}, {Op::Rotate, 0.6, 0}},
    {{Op::Equalize, 1.0, 9}, {Op::ShearY, 0.6, 3}},        {{Op::Color, 0.4, 7}, {Op::Equalize, 0.6, 0}},
    {{Op::Posterize, 0.4, 6}, {Op::AutoContrast, 0.4, 7}}, {{Op::Solarize, 0.6, 8}, {Op::Color, 0.6, 9}},
    {{Op::Solarize, 0.2, 4}, {Op::Rotate, 0.8, 9}},        {{Op::Rotate, 1.0, 7}, {Op::TranslateYAbs, 0.8, 9}},
    {{Op::ShearX, 0.0, 0}, {Op::Solarize, 0.8, 4}},        {{Op::ShearY, 0.8, 0}, {Op::Color, 0.6, 4}},
    {{Op::Color, 1.0, 0}, {Op::Rotate, 0.6, 2}},           {{Op::Equalize, 0.8, 4}, {Op::Equalize, 0.0, 8}},
    {{Op::Equalize, 1.0, 4}, {Op::AutoContrast, 0.6, 2}},  {{Op::ShearY, 0.4, 7}, {Op::SolarizeAdd, 0.6, 7}},
    {{Op::Posterize, 0.8, 2}, {Op::Solarize, 0.6, 10}},    {{Op::Solarize, 0.6, 8}, {Op::Equalize, 0.6, 1}},
    {{Op::Color, 0.8, 6}, {Op::Rotate, 0.4, 5}},
};

// np.linspace(lo, hi, 11)[idx], as numpy computes it (the last is hi exactly).
double linspace11(double lo, double hi, int idx) { return idx == 10 ? hi : idx * ((hi - lo) / 10) + lo; }

}  // namespace

AugmentPolicy parse_augment_policy(const std::string& spec, const std::string& flag) {
  AugmentPolicy p;
  p.spec = spec;
  if (spec.empty() || spec == "none") {
    p.spec.clear();
    return p;
  }
  if (spec == "autoaugment" || spec == "original" || spec == "v0") {
    if (spec != "autoaugment")
      throw Error(flag + " " + spec + ": timm's AutoAugment policies are not built",
                  "autoaugment (DLE's ImageNet policy) or a RandAugment string such as rand-m9-mstd0.5");
    p.kind = AugmentPolicy::Kind::AutoAugment;
    return p;
  }
  const std::string hint = "timm's RandAugment grammar: rand-m9-mstd0.5 (sections m<int>, n<int>, mstd<float>, "
                           "mmax<int>, inc<int>, w0, separated by '-'), or autoaugment";
  if (spec.rfind("rand", 0) != 0 || (spec.size() > 4 && spec[4] != '-'))
    throw Error(flag + " '" + spec + "' is not an augmentation policy", hint);
  p.kind = AugmentPolicy::Kind::RandAugment;
  std::size_t pos = 4;
  bool have_std = false, have_max = false;
  while (pos < spec.size()) {
    const std::size_t next = std::min(spec.find('-', pos + 1), spec.size());
    const std::string section = spec.substr(pos + 1, next - pos - 1);
    pos = next;
    const std::size_t digit = section.find_first_of("0123456789");
    if (digit == std::string::npos) continue;  // timm skips sections without a digit
    const std::string key = section.substr(0, digit), val = section.substr(digit);
    char* end = nullptr;
    const double num = std::strtod(val.c_str(), &end);
    if (!(num <= 1000)) throw Error(flag + " '" + spec + "': section '" + section + "' is out of range", hint);
    const bool integer = val.find_first_not_of("0123456789") == std::string::npos;
    auto bad = [&](const std::string& why) {
      return Error(flag + " '" + spec + "': section '" + section + "' " + why, hint);
    };
    if (key == "m" || key == "n" || key == "mmax" || key == "inc" || key == "w") {
      if (!integer) throw bad("needs an integer");
    } else if (key == "mstd") {
      if (*end != '\0') throw bad("needs a number");
    } else {
      throw bad("is not a RandAugment section");
    }
    if (key == "m") p.magnitude = num;
    if (key == "n") p.num_layers = static_cast<int>(num);
    if (key == "mstd" && !have_std) p.magnitude_std = num > 100 ? std::numeric_limits<double>::infinity() : num, have_std = true;
    if (key == "mmax" && !have_max) p.magnitude_max = num, have_max = true;
    if (key == "inc") p.increasing = true;  // bool('0') is True in timm 0.5.4
    if (key == "w") {
      if (num != 0) throw bad("names a choice-weight table timm does not have (only w0)");
      p.weighted = true;
    }
  }
  if (p.num_layers < 0 || p.num_layers > 15) throw Error(flag + " '" + spec + "': n must be in 0..15", hint);
  // w0 draws without replacement and gives Posterize and Invert no weight.
  if (p.weighted && p.num_layers > 13) throw Error(flag + " '" + spec + "': with w0, n must be in 0..13", hint);
  return p;
}

Augmenter::Augmenter(AugmentPolicy policy, Fill fill, bool random_resample, Resample resample)
    : policy_(std::move(policy)), fill_(fill), random_resample_(random_resample), resample_(resample) {}

void Augmenter::apply(ImageRef img, Rng& rng, std::vector<std::uint8_t>& scratch, std::vector<Applied>* trace) const {
  switch (policy_.kind) {
    case AugmentPolicy::Kind::RandAugment: rand_augment(img, rng, scratch, trace); break;
    case AugmentPolicy::Kind::AutoAugment: auto_augment(img, rng, scratch, trace); break;
    case AugmentPolicy::Kind::None: break;
  }
}

void Augmenter::rand_augment(ImageRef img, Rng& rng, std::vector<std::uint8_t>& scratch,
                             std::vector<Applied>* trace) const {
  const auto& p = policy_;
  // RandAugment.__call__: all layers' ops are chosen before any runs; uniform
  // with replacement, or (w0) weighted without replacement.
  int chosen[15];
  const int layers = p.num_layers;
  if (!p.weighted) {
    for (int i = 0; i < layers; ++i) chosen[i] = static_cast<int>(rng.integer(0, 14));
  } else {
    double w[15];
    std::copy(std::begin(kRandWeights0), std::end(kRandWeights0), w);
    for (int i = 0; i < layers; ++i) {
      double total = 0;
      for (double x : w) total += x;
      if (total <= 0) throw Error("RandAugment w0: fewer than " + std::to_string(layers) + " ops have a weight");
      double u = rng.uniform() * total;
      int k = 0;
      while (k < 14 && (w[k] == 0 || u >= w[k])) u -= w[k], ++k;
      while (w[k] == 0) --k;  // rounding ran past the last weighted op
      chosen[i] = k;
      w[k] = 0;
    }
  }
  for (int i = 0; i < layers; ++i) {
    const Op op = kRandOps[chosen[i]];
    // AugmentOp.__call__: prob 0.5, then the magnitude noise (drawn for every
    // op), then the level function's sign, then the resample choice.
    if (rng.uniform() > 0.5) continue;
    double m = p.magnitude;
    if (std::isinf(p.magnitude_std)) {
      m = rng.uniform(0, m);
    } else if (p.magnitude_std > 0) {
      m = m + rng.normal() * p.magnitude_std;
    }
    const double upper = p.magnitude_max > 0 ? p.magnitude_max : kLevelDenom;
    m = std::max(0.0, std::min(m, upper));
    auto neg = [&rng](double v) { return rng.uniform() > 0.5 ? -v : v; };
    const double frac = m / kLevelDenom;
    double arg = 0;
    switch (op) {
      case Op::AutoContrast: pil::auto_contrast(img); break;
      case Op::Equalize: pil::equalize(img); break;
      case Op::Invert: pil::invert(img); break;
      case Op::Posterize: {
        const int bits = static_cast<int>(frac * 4);
        arg = p.increasing ? 4 - bits : bits;
        pil::posterize(img, static_cast<int>(arg));
        break;
      }
      case Op::Solarize: {
        const int t = static_cast<int>(frac * 256);
        arg = p.increasing ? 256 - t : t;
        pil::solarize(img, arg);
        break;
      }
      case Op::SolarizeAdd:
        arg = static_cast<int>(frac * 110);
        pil::solarize_add(img, static_cast<int>(arg));
        break;
      case Op::Color:
      case Op::Contrast:
      case Op::Brightness:
      case Op::Sharpness:
        arg = p.increasing ? std::max(0.1, 1.0 + neg(frac * .9)) : frac * 1.8 + 0.1;
        if (op == Op::Color) pil::color(img, arg, scratch);
        if (op == Op::Contrast) pil::contrast(img, arg, scratch);
        if (op == Op::Brightness) pil::brightness(img, arg, scratch);
        if (op == Op::Sharpness) pil::sharpness(img, arg, scratch);
        break;
      default: {
        arg = neg(op == Op::Rotate ? frac * 30. : (op == Op::ShearX || op == Op::ShearY) ? frac * 0.3 : frac * 0.45);
        const Resample r = random_resample_ ? (rng.integer(0, 1) ? Resample::Bicubic : Resample::Bilinear) : resample_;
        apply_geometric(op, img, arg, r, fill_, scratch);
      }
    }
    if (trace) trace->push_back({kOpNames[static_cast<int>(op)], arg});
  }
}

void Augmenter::auto_augment(ImageRef img, Rng& rng, std::vector<std::uint8_t>& scratch,
                             std::vector<Applied>* trace) const {
  const auto& sub = kImageNetPolicy[rng.integer(0, 24)];
  for (const PolicyOp& po : sub) {
    if (!(rng.uniform() < po.p)) continue;
    const int i = po.idx;
    if (trace) trace->push_back({kOpNames[static_cast<int>(po.op)], double(i)});
    auto sign = [&rng]() { return rng.integer(0, 1) ? 1.0 : -1.0; };  // random.choice([-1, 1])
    switch (po.op) {
      case Op::ShearX:
      case Op::ShearY: apply_geometric(po.op, img, linspace11(0, 0.3, i) * sign(), Resample::Bicubic, fill_, scratch); break;
      case Op::TranslateYAbs: apply_geometric(po.op, img, linspace11(0, 250, i) * sign(), Resample::Nearest, fill_, scratch); break;
      case Op::Rotate: pil::rotate(img, linspace11(0, 30, i) * sign(), Resample::Nearest, fill_, scratch); break;
      case Op::Color: pil::color(img, linspace11(0.1, 1.9, i), scratch); break;
      case Op::Contrast: pil::contrast(img, linspace11(0.1, 1.9, i), scratch); break;
      case Op::Brightness: pil::brightness(img, linspace11(0.1, 1.9, i), scratch); break;
      case Op::Sharpness: pil::sharpness(img, linspace11(0.1, 1.9, i), scratch); break;
      case Op::Posterize: {
        static constexpr int kBits[11] = {0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 4};  // np.round(linspace(0, 4, 11))
        pil::posterize(img, kBits[i]);
        break;
      }
      case Op::Solarize: pil::solarize(img, linspace11(0, 256, i)); break;
      case Op::SolarizeAdd: pil::solarize_add(img, static_cast<int>(linspace11(0, 110, i))); break;
      case Op::AutoContrast: pil::auto_contrast(img); break;
      case Op::Equalize: pil::equalize(img); break;
      case Op::Invert: pil::invert(img); break;
      default: break;
    }
  }
}

void draw_erase_boxes(const ErasingParams& p, int height, int width, Rng& rng, EraseBox* out) {
  for (int k = 0; k < p.count; ++k) out[k] = {};
  if (p.prob <= 0 || rng.uniform() > p.prob) return;
  const double area = double(height) * width;
  const double log_lo = std::log(p.min_aspect), log_hi = std::log(1.0 / p.min_aspect);
  // timm's min_count 1, max_count --recount: randint(1, recount) boxes.
  const int count = p.count > 1 ? static_cast<int>(rng.integer(1, p.count)) : 1;
  for (int k = 0; k < count; ++k) {
    for (int attempt = 0; attempt < 10; ++attempt) {
      const double target = rng.uniform(p.min_area, p.max_area) * area / count;
      const double aspect = std::exp(rng.uniform(log_lo, log_hi));
      // timm's h takes the aspect (RandomResizedCrop's w does); Python's round is half-even.
      const int h = static_cast<int>(std::nearbyint(std::sqrt(target * aspect)));
      const int w = static_cast<int>(std::nearbyint(std::sqrt(target / aspect)));
      if (w < width && h < height) {
        const int top = static_cast<int>(rng.integer(0, height - h));
        const int left = static_cast<int>(rng.integer(0, width - w));
        out[k] = {top, left, h, w};
        break;
      }
    }
  }
}

}  // namespace convnets::data
