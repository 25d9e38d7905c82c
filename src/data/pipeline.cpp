#include "data/pipeline.h"

#include "core/error.h"

#include <cmath>
#include <sstream>

namespace convnets::data {

std::string option_name(const std::string& field, Naming naming) {
  if (naming == Naming::Python) return field;
  std::string flag = "--" + field;
  for (char& c : flag) c = c == '_' ? '-' : c;
  return flag;
}

namespace {

std::string str(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

void check(bool ok, const PipelineOptions& o, const std::string& field, const std::string& expected,
           const std::string& got) {
  if (!ok) throw Error(option_name(field, o.naming) + " must be " + expected + ", got " + got);
}

void check_choice(const PipelineOptions& o, const std::string& field, const std::string& value,
                  std::initializer_list<const char*> choices) {
  convnets::check_choice(option_name(field, o.naming), value, choices);
}

}  // namespace

TransformOptions transform_options(const PipelineOptions& o) {
  check(o.batch_size >= 1, o, "batch_size", "at least 1", std::to_string(o.batch_size));
  check(o.image_size >= 1 && o.image_size <= 8192, o, "image_size", "in 1..8192", std::to_string(o.image_size));
  check(o.workers >= 0, o, "workers", "0 (one per CPU) or more", std::to_string(o.workers));
  check(o.prefetch >= 1, o, "prefetch", "at least 1", std::to_string(o.prefetch));
  check(o.world_size >= 1, o, "world_size", "at least 1", std::to_string(o.world_size));
  check(o.rank >= 0 && o.rank < o.world_size, o, "rank", "in 0.." + std::to_string(o.world_size - 1),
        std::to_string(o.rank));
  check(o.max_image_pixels >= 0, o, "max_image_pixels", "0 (no limit) or positive", std::to_string(o.max_image_pixels));
  check_choice(o, "bad_images", o.bad_images, {"skip", "fail"});
  check(o.crop_ratio > 0 && o.crop_ratio <= 1, o, "crop_ratio", "in (0, 1]", str(o.crop_ratio));
  check(o.crop_scale_min > 0 && o.crop_scale_min <= 1, o, "crop_scale_min", "in (0, 1]", str(o.crop_scale_min));
  check(o.crop_padding >= 0 && o.crop_padding < o.image_size, o, "crop_padding",
        "in 0.." + std::to_string(o.image_size - 1) + " (less than " + option_name("image_size", o.naming) + ")", std::to_string(o.crop_padding));
  check(std::isfinite(o.reprob) && o.reprob >= 0 && o.reprob <= 1, o, "reprob", "in [0, 1]", str(o.reprob));
  check(o.recount >= 1 && o.recount <= 64, o, "recount", "in 1..64", std::to_string(o.recount));
  check_choice(o, "remode", o.remode, {"const", "rand", "pixel"});
  if (!o.train) {
    check(o.augment.empty(), o, "augment", "empty for evaluation (a training policy)", "'" + o.augment + "'");
    check(o.reprob == 0, o, "reprob", "0 for evaluation (random erasing trains)", str(o.reprob));
    check(o.crop_padding == 0, o, "crop_padding", "0 for evaluation (a training translation)",
          std::to_string(o.crop_padding));
    check_choice(o, "interpolation", o.interpolation, {"bilinear", "bicubic"});
  } else {
    check_choice(o, "interpolation", o.interpolation, {"bilinear", "bicubic", "random"});
  }
  (void)parse_augment_policy(o.augment, option_name("augment", o.naming));

  TransformOptions t;
  if (o.train) {
    t = TransformOptions::train(o.image_size);
    t.crop.scale_min = o.crop_scale_min;
    t.crop_padding = o.crop_padding;
    t.flip = o.flip;
    t.random_filter = o.interpolation == "random";
    if (!t.random_filter) t.filter = parse_filter(o.interpolation, option_name("interpolation", o.naming));
    t.augment = o.augment;
    t.augment_fill = mean_fill(o.mean);
  } else {
    t = TransformOptions::eval(o.image_size, o.crop_ratio, parse_filter(o.interpolation, option_name("interpolation", o.naming)));
  }
  if (o.dct_scaling) t.dct_scaling = *o.dct_scaling;
  t.max_pixels = o.max_image_pixels;
  return t;
}

std::unique_ptr<Loader> make_loader(DatasetPtr dataset, const PipelineOptions& o) {
  auto transform = std::make_shared<const Transform>(transform_options(o));
  LoaderOptions lo;
  lo.batch_size = o.batch_size;
  lo.workers = o.workers;
  lo.prefetch = o.prefetch;
  lo.drop_last = o.drops_last();
  lo.bad_images = parse_bad_image_policy(o.bad_images);
  lo.device_decode = o.device_decode;
  lo.warn = o.warn;
  lo.shard.rank = o.rank;
  lo.shard.world_size = o.world_size;
  lo.shard.seed = o.seed;
  if (o.train) {
    lo.shard.shuffle = true;
    if (lo.drop_last) {
      // Whole micro-batches per rank (ShardOptions::block): rank r's k-th
      // batch is the (k * world + r)-th batch of one process, and the tail
      // that makes no full batch on every rank is trimmed, not padded.
      lo.shard.block = o.batch_size;
      lo.shard.drop_tail = true;
    }
    lo.erasing.prob = o.reprob;
    lo.erasing.count = o.recount;
    lo.erasing.mode = o.remode;
  } else {
    lo.shard.shuffle = false;
    lo.shard.pad = false;  // with several ranks, each sample is evaluated exactly once
  }
  return std::make_unique<Loader>(std::move(dataset), std::move(transform), std::move(lo));
}

}  // namespace convnets::data
