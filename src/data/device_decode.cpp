#include "data/device_decode.h"

#include "core/error.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace convnets::data {
namespace {

namespace kj = kernels::jpeg;
using Clock = std::chrono::steady_clock;

// libjpeg-turbo's choice of IDCT size per component (jdmaster.c,
// jpeg_core_output_dimensions): chroma is scaled up by IDCT rather than by the
// upsampler while the sampling ratios allow it and the size stays <= 8.
int component_idct_size(int scale, int max_h, int max_v, int h, int v) {
  int s = scale;
  while (s < 8 && (max_h * scale) % (h * s * 2) == 0 && (max_v * scale) % (v * s * 2) == 0) s *= 2;
  return s;
}

std::int64_t align16(std::int64_t n) { return (n + 15) & ~std::int64_t(15); }

// Identity tables for fallback images, which arrive already at S x S.
void identity_tables(int size, std::vector<std::int32_t>& first, std::vector<std::int32_t>& weights) {
  first.resize(size);
  weights.assign(size, 1 << kj::kResampleBits);
  for (int i = 0; i < size; ++i) first[i] = i;
}

}  // namespace

bool EncodedBatchBuilder::add_coefficients(const SampleData& sample, const SamplePlan& p, Workspace& ws, Item& item) {
  if (!ws.jpeg.read_coefficients(coefs_)) return false;  // CMYK / YCCK: nothing read
  const auto& comps = coefs_.components;
  const int M = p.scale, max_h = coefs_.max_h, max_v = coefs_.max_v;
  kj::ColourJob& cj = item.colour;
  cj = {};
  int c_scale = M;
  if (comps.size() == 3) {
    // Luma at full sampling and both chroma components alike: 4:4:4, 4:2:2,
    // 4:2:0. Anything else (4:4:0, 4:1:1...) is rendered on the CPU.
    if (comps[0].h_samp != max_h || comps[0].v_samp != max_v || comps[1].h_samp != comps[2].h_samp ||
        comps[1].v_samp != comps[2].v_samp || max_h > 2 || max_v > 2)
      return false;
    c_scale = component_idct_size(M, max_h, max_v, comps[1].h_samp, comps[1].v_samp);
    const int hf = (max_h * M) / (comps[1].h_samp * c_scale), vf = (max_v * M) / (comps[1].v_samp * c_scale);
    if (hf * comps[1].h_samp * c_scale != max_h * M || vf * comps[1].v_samp * c_scale != max_v * M) return false;
    if (hf == 1 && vf == 1) {
      cj.mode = kj::kFull;
    } else if (hf == 2 && vf == 1) {
      cj.mode = kj::kH2V1;
    } else if (hf == 2 && vf == 2) {
      cj.mode = kj::kH2V2;
    } else {
      return false;
    }
    cj.ycc = coefs_.ycc ? 1 : 0;
    // libjpeg's downsampled size of a chroma component at this scale.
    cj.c_width = static_cast<int>((std::int64_t(coefs_.width) * comps[1].h_samp * c_scale + max_h * 8 - 1) / (max_h * 8));
    cj.c_height = static_cast<int>((std::int64_t(coefs_.height) * comps[1].v_samp * c_scale + max_v * 8 - 1) / (max_v * 8));
    // jdsample.c: fancy upsampling needs scaling above 1/8 and more than 2 samples.
    cj.fancy = (M > 1 && cj.c_width > 2) ? 1 : 0;
  } else {
    cj.mode = kj::kGray;
  }

  // Whole MCUs around the region, one more on each side: the chroma
  // upsampler reads its neighbours.
  const int mw = max_h * M, mh = max_v * M;
  const int mcus_x = (coefs_.width + 8 * max_h - 1) / (8 * max_h), mcus_y = (coefs_.height + 8 * max_v - 1) / (8 * max_v);
  const int mx0 = std::max(0, p.region.x / mw - 1), my0 = std::max(0, p.region.y / mh - 1);
  const int mx1 = std::min(mcus_x, (p.region.x + p.region.width + mw - 1) / mw + 1);
  const int my1 = std::min(mcus_y, (p.region.y + p.region.height + mh - 1) / mh + 1);
  item.num_planes = static_cast<int>(comps.size());
  for (int c = 0; c < item.num_planes; ++c) {
    Plane& pl = item.planes[c];
    pl.s = c == 0 ? M : c_scale;
    const int bx = mx0 * comps[c].h_samp, by = my0 * comps[c].v_samp;
    pl.blocks_w = (mx1 - mx0) * comps[c].h_samp;
    pl.blocks_h = (my1 - my0) * comps[c].v_samp;
    pl.coef.resize(std::size_t(pl.blocks_w) * pl.blocks_h * 64);
    ws.jpeg.copy_blocks(c, bx, by, pl.blocks_w, pl.blocks_h, pl.coef.data());
    std::copy_n(comps[c].quant, 64, pl.quant.begin());
    if (c == 1) {
      cj.cx0 = bx * pl.s;
      cj.cy0 = by * pl.s;
    }
  }
  const int out_w = codec::JpegDecoder::scaled_size(coefs_.width, M);
  const int out_h = codec::JpegDecoder::scaled_size(coefs_.height, M);
  cj.x0 = mx0 * mw;
  cj.y0 = my0 * mh;
  cj.width = std::min(item.planes[0].blocks_w * M, out_w - cj.x0);
  cj.height = std::min(item.planes[0].blocks_h * M, out_h - cj.y0);
  // Tap indices relative to the RGB region's origin.
  item.xtaps = p.px.taps;
  item.ytaps = p.py.taps;
  item.xfirst.resize(p.px.first_padded.size());
  item.yfirst.resize(p.py.first_padded.size());
  for (std::size_t i = 0; i < item.xfirst.size(); ++i) item.xfirst[i] = p.lo_x + p.px.first_padded[i] - cj.x0;
  for (std::size_t i = 0; i < item.yfirst.size(); ++i) item.yfirst[i] = p.lo_y + p.py.first_padded[i] - cj.y0;
  item.xweights = p.px.weights_padded;
  item.yweights = p.py.weights_padded;
  for (const int f : item.xfirst)
    if (f < 0 || f + item.xtaps > cj.width) throw Error(sample.name + ": device decode: horizontal taps outside the decoded region");
  for (const int f : item.yfirst)
    if (f < 0 || f + item.ytaps > cj.height) throw Error(sample.name + ": device decode: vertical taps outside the decoded region");
  item.flip = p.flip;
  return true;
}

void EncodedBatchBuilder::add(const SampleData& sample, Rng& rng, Workspace& ws, TransformTimes* times) {
  add(sample, transform_.plan(sample, rng, ws), ws, times);
}

void EncodedBatchBuilder::add(const SampleData& sample, const SamplePlan& plan, Workspace& ws, TransformTimes* times) {
  if (count_ == items_.size()) items_.emplace_back();
  Item& item = items_[count_];
  if (plan.out_w != transform_.size() || plan.out_h != transform_.size())
    throw Error("device decode: output " + std::to_string(plan.out_w) + "x" + std::to_string(plan.out_h) +
                " is not the square batch size");
  const auto t0 = Clock::now();
  item.device = plan.format == codec::ImageFormat::Jpeg && add_coefficients(sample, plan, ws, item);
  if (item.device) {
    if (times) times->decode_s += std::chrono::duration<double>(Clock::now() - t0).count();
  } else {
    // The CPU renders what the device path does not take; after a
    // read_coefficients the decoder must open the file again.
    if (plan.format == codec::ImageFormat::Jpeg) ws.jpeg.open(sample.bytes.data(), sample.bytes.size(), sample.name);
    const int n = transform_.size();
    std::vector<std::uint8_t>& rgb = item.rgb;
    rgb.resize(std::size_t(n) * n * 3);
    if (channels_ == 3) {
      transform_.render(sample, plan, ws, rgb.data(), times);
    } else {
      gray_.resize(std::size_t(n) * n * channels_);
      transform_.render(sample, plan, ws, gray_.data(), times);
      for (std::size_t i = 0; i < std::size_t(n) * n; ++i) rgb[i * 3] = rgb[i * 3 + 1] = rgb[i * 3 + 2] = gray_[i * channels_];
    }
  }
  ++count_;
}

EncodedBatch EncodedBatchBuilder::finish(bool pinned) {
  const int n = transform_.size();
  const auto images = static_cast<std::int64_t>(count_);
  // Pass 1: sizes.
  std::int64_t planes = 0, colour = 0, table_ints = 0, coef_bytes = 0, fallback_bytes = 0;
  std::int64_t plane_bytes = 0, rgb_bytes = 0, blocks = 0, colour_pixels = 0;
  std::vector<std::int32_t> id_first, id_weights;
  identity_tables(n, id_first, id_weights);
  table_ints += 2 * n;  // the shared identity tables
  for (std::size_t k = 0; k < count_; ++k) {
    const Item& it = items_[k];
    if (!it.device) {
      fallback_bytes += align16(static_cast<std::int64_t>(it.rgb.size()));
      continue;
    }
    ++colour;
    planes += it.num_planes;
    for (int c = 0; c < it.num_planes; ++c) {
      const Plane& p = it.planes[c];
      coef_bytes += align16(static_cast<std::int64_t>(p.coef.size()) * 2);
      plane_bytes += align16(std::int64_t(p.blocks_w) * p.blocks_h * p.s * p.s);
      blocks += std::int64_t(p.blocks_w) * p.blocks_h;
    }
    rgb_bytes += align16(std::int64_t(it.colour.width) * it.colour.height * 3);
    colour_pixels += std::int64_t(it.colour.width) * it.colour.height;
    table_ints += static_cast<std::int64_t>(it.xfirst.size() + it.xweights.size() + it.yfirst.size() + it.yweights.size());
  }
  EncodedBatch out;
  kj::BatchArgs& a = out.args;
  std::int64_t at = 0;
  a.plane_jobs = at;
  at = align16(at + planes * std::int64_t(sizeof(kj::PlaneJob)));
  a.colour_jobs = at;
  at = align16(at + colour * std::int64_t(sizeof(kj::ColourJob)));
  a.resample_jobs = at;
  at = align16(at + images * std::int64_t(sizeof(kj::ResampleJob)));
  const std::int64_t quant_at = at;
  at = align16(at + planes * 128);
  const std::int64_t tables_at = at;
  at = align16(at + table_ints * 4);
  const std::int64_t coef_at = at;
  at += coef_bytes;
  const std::int64_t fallback_at = at;
  at += fallback_bytes;
  const std::int64_t host_bytes = at;
  const std::int64_t plane_at = at;
  at += plane_bytes;
  const std::int64_t rgb_at = at;
  at += rgb_bytes;
  out.device_bytes = std::max<std::int64_t>(at, 16);

  auto opts = at::TensorOptions().dtype(at::kByte);
  if (pinned) opts = opts.pinned_memory(true);
  out.host = at::empty({std::max<std::int64_t>(host_bytes, 16)}, opts);
  std::uint8_t* base = out.host.data_ptr<std::uint8_t>();
  auto* plane_jobs = reinterpret_cast<kj::PlaneJob*>(base + a.plane_jobs);
  auto* colour_jobs = reinterpret_cast<kj::ColourJob*>(base + a.colour_jobs);
  auto* resample_jobs = reinterpret_cast<kj::ResampleJob*>(base + a.resample_jobs);
  std::int64_t quant_next = quant_at, table_next = tables_at, coef_next = coef_at, fallback_next = fallback_at;
  std::int64_t plane_next = plane_at, rgb_next = rgb_at, block_next = 0, pixel_next = 0;
  auto put_table = [&](const std::vector<std::int32_t>& v) {
    const std::int64_t off = table_next;
    std::memcpy(base + off, v.data(), v.size() * 4);
    table_next += static_cast<std::int64_t>(v.size()) * 4;
    return off;
  };
  const std::int64_t id_first_at = put_table(id_first), id_weights_at = put_table(id_weights);
  int pj = 0, cjn = 0;
  for (std::size_t k = 0; k < count_; ++k) {
    const Item& it = items_[k];
    kj::ResampleJob& r = resample_jobs[k];
    r = {};
    if (!it.device) {
      std::memcpy(base + fallback_next, it.rgb.data(), it.rgb.size());
      r.src = fallback_next;
      r.src_stride = n * 3;
      r.xfirst = r.yfirst = id_first_at;
      r.xweights = r.yweights = id_weights_at;
      r.xtaps = r.ytaps = 1;
      fallback_next += align16(static_cast<std::int64_t>(it.rgb.size()));
      continue;
    }
    kj::ColourJob cj = it.colour;
    std::int64_t plane_offsets[3] = {0, 0, 0};
    int strides[3] = {0, 0, 0};
    for (int c = 0; c < it.num_planes; ++c) {
      const Plane& p = it.planes[c];
      kj::PlaneJob& j = plane_jobs[pj++];
      j = {};
      std::memcpy(base + quant_next, p.quant.data(), 128);
      j.quant = quant_next;
      quant_next += 128;
      std::memcpy(base + coef_next, p.coef.data(), p.coef.size() * 2);
      j.coef = coef_next;
      coef_next += align16(static_cast<std::int64_t>(p.coef.size()) * 2);
      j.plane = plane_next;
      plane_offsets[c] = plane_next;
      strides[c] = p.blocks_w * p.s;
      plane_next += align16(std::int64_t(p.blocks_w) * p.blocks_h * p.s * p.s);
      j.first_block = block_next;
      block_next += std::int64_t(p.blocks_w) * p.blocks_h;
      j.blocks_w = p.blocks_w;
      j.blocks_h = p.blocks_h;
      j.s = p.s;
    }
    cj.y = plane_offsets[0];
    cj.y_stride = strides[0];
    if (it.num_planes == 3) {
      cj.cb = plane_offsets[1];
      cj.cr = plane_offsets[2];
      cj.c_stride = strides[1];
    }
    cj.rgb = rgb_next;
    cj.first_pixel = pixel_next;
    pixel_next += std::int64_t(cj.width) * cj.height;
    rgb_next += align16(std::int64_t(cj.width) * cj.height * 3);
    colour_jobs[cjn++] = cj;
    r.src = cj.rgb;
    r.src_stride = cj.width * 3;
    r.xfirst = put_table(it.xfirst);
    r.xweights = put_table(it.xweights);
    r.yfirst = put_table(it.yfirst);
    r.yweights = put_table(it.yweights);
    r.xtaps = it.xtaps;
    r.ytaps = it.ytaps;
    r.flip = it.flip ? 1 : 0;
    ++out.device_images;
  }
  out.fallback_images = images - out.device_images;
  a.num_planes = pj;
  a.num_colour = cjn;
  a.num_images = static_cast<std::int32_t>(images);
  a.size = n;
  a.total_blocks = blocks;
  a.total_colour_pixels = colour_pixels;
  count_ = 0;
  return out;
}

at::Tensor decode_on_device(const EncodedBatch& batch, at::Device device, at::ScalarType dtype,
                            const std::array<double, 3>& mean, const std::array<double, 3>& std) {
  kj::BatchArgs a = batch.args;
  const std::int64_t n = a.num_images, s = a.size;
  switch (dtype) {
    case at::kByte: a.out_type = kj::OutputType::Uint8; break;
    case at::kFloat: a.out_type = kj::OutputType::Float32; break;
    case at::kHalf: a.out_type = kj::OutputType::Float16; break;
    case at::kBFloat16: a.out_type = kj::OutputType::BFloat16; break;
    default:
      throw Error("device decode: the output dtype must be uint8, float32, float16 or bfloat16, not " +
                  std::string(c10::toString(dtype)));
  }
  for (int c = 0; c < 3; ++c) {
    a.scale[c] = static_cast<float>(1.0 / (255.0 * std[c]));
    a.bias[c] = static_cast<float>(-mean[c] / std[c]);
  }
  at::Tensor arena = at::empty({batch.device_bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  arena.narrow(0, 0, batch.host.numel()).copy_(batch.host, /*non_blocking=*/true);
  // NHWC memory either way: uint8 is the loader's [B, S, S, 3]; float types
  // are its channels-last [B, 3, S, S] view.
  // The host loops store uint8 or fp32 only: 16-bit types are converted after.
  const bool host_fp32 = device.is_cpu() && dtype != at::kByte && dtype != at::kFloat;
  if (host_fp32) a.out_type = kj::OutputType::Float32;
  at::Tensor out = at::empty({n, s, s, 3}, at::TensorOptions().dtype(host_fp32 ? at::kFloat : dtype).device(device));
  if (device.is_cpu()) {
    kj::run_batch_cpu(arena.data_ptr<std::uint8_t>(), a, out.data_ptr());
    if (host_fp32) out = out.to(dtype);
  } else {
    const int rc = kj::launch_batch(arena.data_ptr<std::uint8_t>(), a, out.data_ptr(),
                                    c10::cuda::getCurrentCUDAStream(device.index()).stream());
    if (rc != 0) throw Error("device decode: CUDA kernel launch failed (error " + std::to_string(rc) + ")");
  }
  if (dtype == at::kByte) return out;
  return out.permute({0, 3, 1, 2});
}

}  // namespace convnets::data
