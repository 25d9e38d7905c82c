#include "data/loader.h"

#include "core/error.h"
#include "core/json.h"
#include "kernels/normalize.h"

#include <c10/cuda/CUDAStream.h>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <iostream>

namespace convnets::data {

struct Loader::Worker {
  Workspace ws;
  SampleData sample;
  std::unique_ptr<EncodedBatchBuilder> builder;  // device_decode only
};

Loader::Loader(DatasetPtr dataset, std::shared_ptr<const Transform> transform, LoaderOptions options)
    : dataset_(std::move(dataset)), transform_(std::move(transform)), options_(std::move(options)) {
  if (!dataset_ || dataset_->size() == 0) throw Error("loader: the dataset is empty");
  if (options_.batch_size < 1) throw Error("--batch-size must be at least 1, got " + std::to_string(options_.batch_size));
  if (options_.prefetch < 1) throw Error("--prefetch must be at least 1, got " + std::to_string(options_.prefetch));
  if (options_.workers < 0) throw Error("--workers must be 0 (all CPUs) or more, got " + std::to_string(options_.workers));
  samples_ = static_cast<std::int64_t>(dataset_->epoch_size(options_.shard));
  batches_ = options_.drop_last ? samples_ / options_.batch_size
                                : (samples_ + options_.batch_size - 1) / options_.batch_size;
  if (batches_ == 0)
    throw Error("loader: " + std::to_string(samples_) + " samples per rank make no full batch of " +
                    std::to_string(options_.batch_size),
                "lower --batch-size or keep the last partial batch");
  if (options_.device_decode && transform_->augments())
    throw Error("--data-backend gpu finishes decoding on the device, where the --augment policy's PIL operations do not run",
                "use --data-backend cpu (DLE's DALI loaders refuse --augmentation too)");
  if (options_.device_decode && transform_->options().crop_padding > 0)
    throw Error("--data-backend gpu finishes decoding on the device, where --crop-padding's shift does not run",
                "use --data-backend cpu");
  if (options_.erasing.prob > 0) {
    const auto& e = options_.erasing;
    if (e.count < 1) throw Error("--recount must be at least 1, got " + std::to_string(e.count));
    if (e.mode != "const" && e.mode != "rand" && e.mode != "pixel")
      throw Error("--remode " + e.mode + ": expected const, rand or pixel (timm's random erasing modes)");
  }
  pinned_ = options_.pin_memory && torch::cuda::is_available();
  int n = options_.workers;
  if (n == 0) n = std::max(1u, std::thread::hardware_concurrency());
  for (int k = 0; k < n; ++k) {
    workers_state_.push_back(std::make_unique<Worker>());
    if (options_.device_decode)
      workers_state_.back()->builder = std::make_unique<EncodedBatchBuilder>(*transform_, dataset_->channels());
  }
  for (int k = 0; k < n; ++k) threads_.emplace_back([this, k] { run(*workers_state_[k]); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    ++generation_;  // workers drop the batch they build rather than finish it
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void Loader::start_epoch(std::int64_t epoch, std::int64_t first_batch) {
  if (first_batch < 0 || first_batch > batches_) {
    throw Error("loader: cannot start epoch " + std::to_string(epoch) + " at batch " + std::to_string(first_batch) +
                "; it has " + std::to_string(batches_) + " batches");
  }
  // Shuffled outside the lock (an ImageNet epoch's order takes milliseconds); the next epoch's too, for lookahead.
  auto order = std::make_shared<const std::vector<std::int64_t>>(dataset_->epoch_order(options_.shard, epoch));
  Order ahead;
  if (options_.lookahead) {
    ahead = std::make_shared<const std::vector<std::int64_t>>(dataset_->epoch_order(options_.shard, epoch + 1));
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (options_.lookahead && active_ && first_batch == 0 && epoch == epoch_ + 1 && ahead_order_) {
    // The epoch the workers went on into: what they built or build for it stays; the rest of the last one goes.
    for (auto it = ready_.begin(); it != ready_.end();) it = it->first.first == epoch ? std::next(it) : ready_.erase(it);
    order_ = std::move(ahead_order_);
    next_claim_ = ahead_claim_;
  } else {
    active_ = false;
    ++generation_;
    idle_cv_.wait(lock, [&] { return in_flight_ == 0; });  // nothing stale arrives after this
    ready_.clear();
    order_ = std::move(order);
    next_claim_ = first_batch;
  }
  epoch_ = epoch;
  next_return_ = first_batch;
  ahead_order_ = std::move(ahead);
  ahead_claim_ = 0;
  stats_ = EpochStats{};
  active_ = true;
  work_cv_.notify_all();
}

bool Loader::next(Batch& out) {
  for (;;) {
    const Wait w = next_for(out, std::chrono::hours(1));
    if (w != Wait::Timeout) return w == Wait::Batch;
  }
}

Loader::Wait Loader::next_for(Batch& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!active_) throw Error("loader: next() before start_epoch()");
  if (next_return_ >= batches_) return Wait::End;
  const std::pair<std::int64_t, std::int64_t> key{epoch_, next_return_};
  if (!ready_cv_.wait_for(lock, timeout, [&] { return !active_ || ready_.count(key) != 0; })) return Wait::Timeout;
  if (!active_) throw Error("loader: the epoch was stopped while next() waited");
  auto node = ready_.extract(key);
  ++next_return_;
  work_cv_.notify_all();
  Result& r = node.mapped();
  if (r.error) std::rethrow_exception(r.error);
  stats_ += r.stats;
  out = std::move(r.batch);
  return Wait::Batch;
}

void Loader::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    active_ = false;
    ++generation_;
    ready_.clear();
    ahead_order_.reset();
  }
  ready_cv_.notify_all();
}

bool Loader::active() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return active_;
}

std::int64_t Loader::epoch() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return epoch_;
}

EpochStats Loader::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

std::vector<std::string> Loader::bad_files() const {
  std::lock_guard<std::mutex> lock(bad_mutex_);
  return bad_files_;
}

void Loader::run(Worker& w) {
  const std::int64_t depth = std::int64_t(options_.prefetch) * static_cast<std::int64_t>(workers_state_.size());
  // This epoch's batches up to `depth` beyond the one next() returns next; then, with lookahead, the next epoch's,
  // counted against the same depth.
  auto current = [&] { return next_claim_ < batches_ && next_claim_ < next_return_ + depth; };
  auto ahead = [&] {
    return ahead_order_ && next_claim_ == batches_ && ahead_claim_ < batches_ &&
           batches_ - next_return_ + ahead_claim_ < depth;
  };
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || (active_ && (current() || ahead())); });
    if (stopping_) return;
    const bool next_epoch = !current();
    const std::int64_t number = next_epoch ? ahead_claim_++ : next_claim_++, generation = generation_;
    const std::int64_t epoch = next_epoch ? epoch_ + 1 : epoch_;
    const Order order = next_epoch ? ahead_order_ : order_;
    ++in_flight_;
    lock.unlock();
    Result r = build(w, *order, number, epoch, generation);
    lock.lock();
    --in_flight_;
    // A batch of an epoch left behind (start_epoch went on before it was taken) is dropped.
    if (generation == generation_ && epoch >= epoch_) {
      ready_.emplace(std::make_pair(epoch, number), std::move(r));
      ready_cv_.notify_all();
    }
    idle_cv_.notify_all();
  }
}

Loader::Result Loader::build(Worker& w, const std::vector<std::int64_t>& order, std::int64_t number, std::int64_t epoch,
                             std::int64_t generation) {
  Result r;
  try {
    const std::int64_t begin = number * options_.batch_size;
    const std::int64_t count = std::min(options_.batch_size, samples_ - begin);
    const int size = transform_->size(), channels = dataset_->channels();
    r.batch.labels = at::empty({count}, at::TensorOptions().dtype(at::kLong));
    r.batch.number = number;
    r.batch.indices.resize(count);
    std::uint8_t* dst = nullptr;
    if (w.builder) {
      w.builder->reset();
    } else {
      auto opts = at::TensorOptions().dtype(at::kByte);
      if (pinned_) opts = opts.pinned_memory(true);
      r.batch.images = at::empty({count, size, size, channels}, opts);
      dst = r.batch.images.data_ptr<std::uint8_t>();
    }
    std::int64_t* labels = r.batch.labels.data_ptr<std::int64_t>();
    if (options_.erasing.prob > 0) {
      const auto& e = options_.erasing;
      r.batch.erase = at::zeros({count, e.count, 4}, at::TensorOptions().dtype(at::kInt));
      auto* boxes = reinterpret_cast<EraseBox*>(r.batch.erase.data_ptr<std::int32_t>());
      for (std::int64_t k = 0; k < count; ++k) {
        // A stream of its own, keyed like the sample's: the boxes do not depend
        // on how many numbers the crop and policy drew.
        Rng rng(options_.shard.seed ^ 0x6572617365ULL /* "erase" */, epoch, order[begin + k]);
        draw_erase_boxes(e, size, size, rng, boxes + k * e.count);
      }
    }
    const std::int64_t stride = std::int64_t(size) * size * channels;
    for (std::int64_t k = 0; k < count; ++k) {
      // Stopped or restarted meanwhile: nobody will take this batch.
      if (generation_.load(std::memory_order_relaxed) != generation) return r;
      const std::int64_t used = fill(w, order[begin + k], epoch, dst ? dst + k * stride : nullptr, r.stats);
      r.batch.indices[k] = used;
      labels[k] = w.sample.label;
    }
    if (w.builder) {
      const auto t0 = std::chrono::steady_clock::now();
      auto encoded = std::make_shared<EncodedBatch>(w.builder->finish(pinned_));
      r.stats.transform_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.stats.device_images = encoded->device_images;
      r.batch.encoded = std::move(encoded);
    }
    r.stats.images = count;
  } catch (...) {
    r.error = std::current_exception();
  }
  return r;
}

std::int64_t Loader::fill(Worker& w, std::int64_t index, std::int64_t epoch, std::uint8_t* dst, EpochStats& stats) {
  using Clock = std::chrono::steady_clock;
  const auto n = static_cast<std::int64_t>(dataset_->size());
  // Replacement walks forward from the bad index: deterministic, so the batch
  // does not depend on which worker met the bad file first.
  for (std::int64_t attempt = 0; attempt < n; ++attempt) {
    const std::int64_t candidate = (index + attempt) % n;
    {
      std::lock_guard<std::mutex> lock(bad_mutex_);
      if (bad_indices_.count(candidate)) continue;
    }
    try {
      const auto t0 = Clock::now();
      dataset_->load(static_cast<std::size_t>(candidate), w.sample);
      stats.read_s += std::chrono::duration<double>(Clock::now() - t0).count();
      Rng rng(options_.shard.seed, epoch, index);
      TransformTimes times;
      if (dst) {
        transform_->apply(w.sample, rng, w.ws, dst, &times);
      } else {
        w.builder->add(w.sample, rng, w.ws, &times);
      }
      stats.decode_s += times.decode_s;
      stats.transform_s += times.transform_s;
      if (attempt > 0) ++stats.bad_images;  // one replaced sample, however many bad files it walked past
      return candidate;
    } catch (const codec::DecodeError& e) {
      skip_bad(candidate, e);
    } catch (const std::bad_alloc&) {
      // A file that needs more memory than the machine has is the file's
      // problem, not the run's (a header within --max-image-pixels can still
      // ask for more than a small machine holds).
      skip_bad(candidate, codec::DecodeError(dataset_->name(static_cast<std::size_t>(candidate)) +
                                             ": out of memory while decoding it (std::bad_alloc)"));
    }
  }
  throw Error("loader: none of the " + std::to_string(n) + " samples in " + dataset_->description() +
              " could be decoded");
}

void Loader::skip_bad(std::int64_t index, const codec::DecodeError& error) {
  if (options_.bad_images == BadImagePolicy::Fail) {
    throw codec::DecodeError(error.what(), "--bad-images skip replaces bad files with other samples and reports them",
                             error.too_large());
  }
  std::lock_guard<std::mutex> lock(bad_mutex_);
  if (bad_indices_.insert(index).second) {
    bad_files_.push_back(dataset_->name(static_cast<std::size_t>(index)));
    const std::string msg = std::string("bad image skipped: ") + error.what();
    if (options_.warn) {
      options_.warn(msg);
    } else {
      std::cerr << "convnets: warning: " << utf8_escaped(msg) << '\n';
    }
  }
}

BadImagePolicy parse_bad_image_policy(const std::string& value) {
  if (value == "skip") return BadImagePolicy::Skip;
  if (value == "fail") return BadImagePolicy::Fail;
  throw Error("--bad-images " + value + ": expected skip or fail");
}

namespace {

void check_pixels(const at::Tensor& images) {
  if (images.dim() != 4 || images.scalar_type() != at::kByte || (images.size(3) != 1 && images.size(3) != 3))
    throw Error("normalize: expected a uint8 [B, H, W, 1 or 3] batch, got " + std::string(images.toString()) + " " +
                std::to_string(images.dim()) + "-d");
}

// (x / 255 - mean) / std as x * scale + bias, per channel.
void affine(const std::array<double, 3>& mean, const std::array<double, 3>& std, std::array<float, 3>& scale,
            std::array<float, 3>& bias) {
  for (int c = 0; c < 3; ++c) {
    scale[c] = static_cast<float>(1.0 / (255.0 * std[c]));
    bias[c] = static_cast<float>(-mean[c] / std[c]);
  }
}

}  // namespace

at::Tensor normalize_batch_serial(const at::Tensor& images, const std::array<double, 3>& mean,
                                  const std::array<double, 3>& std) {
  check_pixels(images);
  std::array<float, 3> scale{}, bias{};
  affine(mean, std, scale, bias);
  const at::Tensor src = images.to(at::kCPU).contiguous();
  const std::int64_t n = src.size(0), plane = src.size(1) * src.size(2), channels = src.size(3);
  at::Tensor out = at::empty({n, 3, src.size(1), src.size(2)}, at::TensorOptions().dtype(at::kFloat));
  const std::uint8_t* in = src.data_ptr<std::uint8_t>();
  float* o = out.data_ptr<float>();
  for (std::int64_t b = 0; b < n; ++b) {
    for (int c = 0; c < 3; ++c) {
      // A grayscale batch feeds a 3-channel model as R = G = B, as in normalize_batch.
      const std::uint8_t* p = in + b * plane * channels + (channels == 3 ? c : 0);
      float* dst = o + (b * 3 + c) * plane;
      for (std::int64_t i = 0; i < plane; ++i) dst[i] = static_cast<float>(p[i * channels]) * scale[c] + bias[c];
    }
  }
  return out;
}

at::Tensor normalize_batch(const at::Tensor& images, const std::array<double, 3>& mean,
                           const std::array<double, 3>& std, at::Device device, at::ScalarType dtype,
                           at::MemoryFormat format) {
  check_pixels(images);
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16)
    throw Error("normalize: the input dtype must be float32, float16 or bfloat16, not " +
                std::string(c10::toString(dtype)));
  std::array<float, 3> scale{}, bias{};
  affine(mean, std, scale, bias);
  // The uint8 batch crosses to the device: a quarter of the float bytes.
  const at::Tensor src = images.to(device, /*non_blocking=*/true).contiguous();
  at::Tensor out = at::empty({src.size(0), 3, src.size(1), src.size(2)},
                             at::TensorOptions().dtype(dtype).device(device), format);
  if (device.is_cuda()) {
    kernels::NormalizeArgs k;
    k.src = src.data_ptr<std::uint8_t>();
    k.dst = out.data_ptr();
    k.n = src.size(0), k.h = src.size(1), k.w = src.size(2);
    k.channels = static_cast<int>(src.size(3));
    k.channels_last = format == at::MemoryFormat::ChannelsLast;
    k.dtype = dtype == at::kHalf       ? kernels::InputDtype::Float16
              : dtype == at::kBFloat16 ? kernels::InputDtype::BFloat16
                                       : kernels::InputDtype::Float32;
    for (int c = 0; c < 3; ++c) k.scale[c] = scale[c], k.bias[c] = bias[c];
    const int rc = kernels::launch_normalize(k, c10::cuda::getCurrentCUDAStream(device.index()).stream());
    if (rc != 0) throw Error(std::string("normalize: CUDA kernel launch failed: ") + kernels::cuda_error_name(rc));
    return out;
  }
  // The CPU's elementwise loops cast only outside the kernel: convert first.
  // A grayscale batch feeds a 3-channel model as R = G = B, as JPEG decoding does.
  at::Tensor x = src.size(3) == 1 ? src.expand({src.size(0), src.size(1), src.size(2), 3}) : src;
  x = x.permute({0, 3, 1, 2}).to(at::kFloat);  // NHWC memory viewed as NCHW: channels-last strides
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor s = at::tensor(at::ArrayRef<float>(scale.data(), 3), opts).view({1, 3, 1, 1});
  const at::Tensor b = at::tensor(at::ArrayRef<float>(bias.data(), 3), opts).view({1, 3, 1, 1});
  if (dtype == at::kFloat) return at::addcmul_out(out, b, x, s);
  return out.copy_(at::addcmul(b, x, s));
}

}  // namespace convnets::data

namespace convnets::data {

at::Tensor apply_random_erasing(const at::Tensor& x, const at::Tensor& boxes, const std::string& mode) {
  if (!boxes.defined() || boxes.numel() == 0) return x;
  const std::int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const auto b = boxes.to(x.device(), at::kLong);
  const auto rows = at::arange(H, b.options()).view({1, 1, H, 1});
  const auto cols = at::arange(W, b.options()).view({1, 1, 1, W});
  at::Tensor out = x;
  // Boxes in timm's order: a later one overwrites an earlier one where they meet.
  for (std::int64_t k = 0; k < b.size(1); ++k) {
    auto field = [&](int i) { return b.select(1, k).select(1, i).view({B, 1, 1, 1}); };
    const auto top = field(0), left = field(1), height = field(2), width = field(3);
    const auto mask = (rows >= top) & (rows < top + height) & (cols >= left) & (cols < left + width);
    at::Tensor fill;
    if (mode == "pixel") {
      fill = at::randn(x.sizes(), x.options());
    } else if (mode == "rand") {
      fill = at::randn({B, C, 1, 1}, x.options());
    } else {
      fill = at::zeros({1}, x.options());
    }
    out = at::where(mask, fill, out);
  }
  return out.contiguous(x.suggest_memory_format());
}

}  // namespace convnets::data
