#include "data/pipeline.h"

#include "core/error.h"
#include "core/options.h"

#include <cmath>
#include <sstream>

namespace convnets::data {

namespace {

std::string str(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

void check(bool ok, const std::string& field, const std::string& expected, const std::string& got) {
  if (!ok) throw Error(options::name(field) + " must be " + expected + ", got " + got);
}

}  // namespace

TransformOptions transform_options(const PipelineOptions& o) {
  check(o.batch_size >= 1, "batch_size", "at least 1", std::to_string(o.batch_size));
  check(o.image_size >= 1 && o.image_size <= 8192, "image_size", "in 1..8192", std::to_string(o.image_size));
  check(o.workers >= 0, "workers", "0 (one per CPU) or more", std::to_string(o.workers));
  check(o.prefetch >= 1, "prefetch", "at least 1", std::to_string(o.prefetch));
  check(o.world_size >= 1, "world_size", "at least 1", std::to_string(o.world_size));
  check(o.rank >= 0 && o.rank < o.world_size, "rank", "in 0.." + std::to_string(o.world_size - 1),
        std::to_string(o.rank));
  check(o.max_image_pixels >= 0, "max_image_pixels", "0 (no limit) or positive", std::to_string(o.max_image_pixels));
  options::check(options::bad_images, o.bad_images);
  check(o.crop_ratio > 0 && o.crop_ratio <= 1, "crop_ratio", "in (0, 1]", str(o.crop_ratio));
  check(o.crop_scale_min > 0 && o.crop_scale_min <= 1, "crop_scale_min", "in (0, 1]", str(o.crop_scale_min));
  options::check_crop_padding(o.crop_padding, o.image_size, o.train);
  check(std::isfinite(o.reprob) && o.reprob >= 0 && o.reprob <= 1, "reprob", "in [0, 1]", str(o.reprob));
  check(o.recount >= 1 && o.recount <= 64, "recount", "in 1..64", std::to_string(o.recount));
  options::check(options::remode, o.remode);
  if (!o.train) {
    check(o.augment.empty(), "augment", "empty for evaluation (a training policy)", "'" + o.augment + "'");
    check(o.reprob == 0, "reprob", "0 for evaluation (random erasing trains)", str(o.reprob));
    options::check(options::eval_interpolation, o.interpolation);
  } else {
    options::check(options::train_interpolation, o.interpolation);
  }
  (void)parse_augment_policy(o.augment, options::name("augment"));

  TransformOptions t;
  if (o.train) {
    t = TransformOptions::train(o.image_size);
    t.crop.scale_min = o.crop_scale_min;
    t.crop_padding = o.crop_padding;
    t.flip = o.flip;
    t.random_filter = o.interpolation == "random";
    if (!t.random_filter) t.filter = parse_filter(o.interpolation, options::name("interpolation"));
    t.augment = o.augment;
    t.augment_fill = mean_fill(o.mean);
  } else {
    t = TransformOptions::eval(o.image_size, o.crop_ratio, parse_filter(o.interpolation, options::name("interpolation")));
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
    lo.lookahead = true;  // a training loop takes the next epoch next
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
