#include "bench/data_bench.h"

#include "core/error.h"
#include "data/pipeline.h"
#include "io/safetensors.h"

#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>

namespace convnets::bench {
namespace {

// printf's formatting, as a string.
std::string line(const char* format, ...) {
  char text[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  return text;
}

}  // namespace

nlohmann::ordered_json run_data_bench(const DataBenchOptions& a, const std::function<void(const std::string&)>& say) {
  using Clock = std::chrono::steady_clock;
  const bool train = !a.eval;
  data::PipelineOptions o;
  o.train = train;
  o.image_size = a.size;
  o.batch_size = a.batch_size;
  o.workers = a.workers;
  o.prefetch = a.prefetch;
  o.seed = a.seed;
  o.drop_last = a.drop_last;  // default off: every image counts once per pass
  o.rank = a.rank;
  o.world_size = a.world_size;
  if (a.dct_scaling != "auto") o.dct_scaling = a.dct_scaling == "on";
  o.max_image_pixels = a.max_image_pixels;
  o.bad_images = a.bad_images;
  o.interpolation = a.interpolation;
  o.augment = a.augment;  // with the ImageNet mean as its fill, as timm's default
  o.reprob = a.reprob;    // boxes drawn on the loader threads; the fill runs on the training device
  o.crop_padding = a.crop_padding;
  // gpu: the loader threads only entropy-decode; the device stage runs here
  // on CUDA when there is one (else the figures are the CPU side alone).
  o.device_decode = a.backend == "gpu";
  const bool device_stage = o.device_decode && torch::cuda::is_available();
  const data::TransformOptions t = data::transform_options(o);  // the options' errors before the files'
  auto dataset = data::open_dataset(a.location, train ? "train" : "val");
  const auto loader_ptr = data::make_loader(dataset, o);
  data::Loader& loader = *loader_ptr;
  // --save-batches: what the loader yielded, to compare with another loader
  // (the Python package's) batch for batch.
  NamedTensors saved;

  {
    say(line("dataset     %s", dataset->description().c_str()));
    if (a.world_size > 1)
      say(line("rank        %d of %d: %lld samples per epoch", a.rank, a.world_size,
               static_cast<long long>(loader.samples_per_epoch())));
    say(line("transform   %s %d (%s), DCT scaling %s; %d workers, batch %lld",
                !train ? "resize + centre crop"
                : a.crop_padding > 0 ? ("RandomResizedCrop + RandomCrop(padding=" + std::to_string(a.crop_padding) +
                                        ") + flip").c_str()
                                     : "RandomResizedCrop + flip",
                a.size,
                train ? a.interpolation.c_str() : data::filter_name(t.filter), t.dct_scaling ? "on" : "off",
                loader.workers(), static_cast<long long>(a.batch_size)));
    if (!a.augment.empty() || a.reprob > 0)
      say(line("augment     %s; random erasing p %g (boxes here, fill on the device)",
               a.augment.empty() ? "none" : a.augment.c_str(), a.reprob));
    if (o.device_decode)
      say(line("backend     gpu: loader threads entropy-decode; %s",
               device_stage ? "IDCT, colour, resize on cuda:0"
                            : "no CUDA device, so only that CPU side is measured (decode = entropy decoding)"));
  }
  // The first batch per worker fills the pipeline and the page cache: not timed.
  const std::int64_t warmup = std::min<std::int64_t>(loader.workers(), loader.batches_per_epoch());
  std::int64_t seen_batches = 0, timed_images = 0;
  data::EpochStats sum;
  Clock::time_point t0 = Clock::now();
  data::Batch batch;
  for (std::int64_t epoch = 0; timed_images < a.images; ++epoch) {
    loader.start_epoch(epoch);
    while (loader.next(batch)) {
      if (device_stage) data::decode_on_device(*batch.encoded, at::Device(at::kCUDA, 0), at::kHalf);
      if (!a.save_batches.empty() && batch.images.defined()) {
        const std::string key = std::to_string(epoch) + "." + std::to_string(batch.number);
        saved.emplace_back("images." + key, batch.images);
        saved.emplace_back("labels." + key, batch.labels);
        if (batch.erase.defined()) saved.emplace_back("erase." + key, batch.erase);
      }
      if (++seen_batches == warmup) t0 = Clock::now();
      else if (seen_batches > warmup) timed_images += batch.labels.size(0);
      if (timed_images >= a.images) break;
    }
    const data::EpochStats s = loader.stats();
    sum += s;
    if (s.bad_images > 0)
      say(line("epoch %lld: %lld bad images replaced (%zu distinct files so far)", static_cast<long long>(epoch),
               static_cast<long long>(s.bad_images), loader.bad_files().size()));
  }
  if (device_stage) torch::cuda::synchronize();
  if (!a.save_batches.empty()) {
    if (saved.empty()) throw Error("--save-batches saves decoded pixels: leave out --data-backend gpu");
    save_safetensors(a.save_batches, saved, {{"format", "convnets-batches/1"}});
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const double rate = timed_images / seconds;
  const std::int64_t total_images = sum.images, bad = sum.bad_images;
  const double per = 1e3 / static_cast<double>(total_images);
  nlohmann::ordered_json r = {{"dataset", dataset->description()},
                              {"mode", train ? "train" : "eval"},
                              {"rank", a.rank},
                              {"world_size", a.world_size},
                              {"samples_per_epoch", loader.samples_per_epoch()},
                              {"size", a.size},
                              {"dct_scaling", t.dct_scaling},
                              {"workers", loader.workers()},
                              {"batch_size", a.batch_size},
                              {"timed_images", timed_images},
                              {"seconds", seconds},
                              {"images_per_s", rate},
                              {"images_per_s_per_worker", rate / loader.workers()},
                              {"read_ms", sum.read_s * per},
                              {"decode_ms", sum.decode_s * per},
                              {"transform_ms", sum.transform_s * per},
                              {"bad_images", bad},
                              {"total_images", total_images},
                              {"backend", a.backend},
                              {"device_stage", device_stage},
                              {"device_decoded_fraction", total_images > 0 ? double(sum.device_images) / double(total_images) : 0.0}};
  return r;
}

std::string format_data_bench(const nlohmann::ordered_json& r) {
  const double rate = r.at("images_per_s").get<double>();
  const int workers = r.at("workers").get<int>();
  return line("images/s    %.1f  (%.1f per worker, %lld images in %.2f s)", rate, rate / workers,
              r.at("timed_images").get<long long>(), r.at("seconds").get<double>()) +
         "\n" +
         line("per image   read %.3f ms, decode %.3f ms, transform %.3f ms (mean over %lld)",
              r.at("read_ms").get<double>(), r.at("decode_ms").get<double>(), r.at("transform_ms").get<double>(),
              r.at("total_images").get<long long>()) +
         "\n" + line("bad images  %lld", r.at("bad_images").get<long long>()) + "\n";
}

}  // namespace convnets::bench
