// The device half of hybrid JPEG decoding (dequantise + IDCT, chroma upsampling + colour conversion, resample + flip + normalise) as per-element functions that the CUDA kernels and their CPU loops share; no torch headers.
#pragma once

#include "kernels/host_device.h"

#include <cstdint>

namespace convnets::kernels::jpeg {

// Every job lives in one byte arena (host-built, copied to the device in one
// transfer); offsets are in bytes from the arena's start.

// One component of one image: blocks_w x blocks_h coefficient blocks (int16,
// natural order) whose IDCT at size s x s (s = 8, 4, 2, 1: libjpeg's
// DCT-domain scaling) fills a plane of (blocks_w*s) x (blocks_h*s) samples.
struct PlaneJob {
  std::int64_t coef = 0, plane = 0, quant = 0;  // quant: 64 uint16, natural order
  std::int64_t first_block = 0;                 // index of this plane's first block in the batch
  std::int32_t blocks_w = 0, blocks_h = 0, s = 8, pad = 0;
};

enum ChromaMode : std::int32_t { kGray = 0, kFull = 1, kH2V1 = 2, kH2V2 = 3 };

// One image: Y/Cb/Cr planes -> interleaved RGB over width x height samples of
// the (scaled) image starting at (x0, y0), the Y plane's origin.
struct ColourJob {
  std::int64_t y = 0, cb = 0, cr = 0, rgb = 0;
  std::int64_t first_pixel = 0;  // index of this image's first pixel in the batch
  std::int32_t width = 0, height = 0, y_stride = 0, c_stride = 0;
  std::int32_t x0 = 0, y0 = 0;
  std::int32_t cx0 = 0, cy0 = 0;        // chroma plane origin, in chroma samples
  std::int32_t c_width = 0, c_height = 0;  // chroma samples of the whole image (libjpeg's downsampled size)
  std::int32_t mode = kFull;
  std::int32_t fancy = 1;  // triangle-filter upsampling (libjpeg's do_fancy_upsampling), else replication
  std::int32_t ycc = 1;    // YCbCr -> RGB; 0: the components are R, G, B already
  std::int32_t pad = 0;
};

// One output image: Pillow's separable bilinear resample (horizontal pass
// first, 8-bit rounding between passes) of an interleaved RGB source, through
// per-output tap tables: `taps` fixed-point weights (22 fractional bits) from
// source index first[i]. Indices are relative to the source's (0, 0).
struct ResampleJob {
  std::int64_t src = 0;            // uint8 RGB rows of src_stride bytes
  std::int64_t xfirst = 0, xweights = 0, yfirst = 0, yweights = 0;  // int32 tables
  std::int32_t src_stride = 0, xtaps = 0, ytaps = 0, flip = 0;
};

enum class OutputType : std::int32_t { Uint8 = 0, Float32 = 1, Float16 = 2, BFloat16 = 3 };

struct BatchArgs {
  std::int64_t plane_jobs = 0, colour_jobs = 0, resample_jobs = 0;  // offsets of the job arrays
  std::int32_t num_planes = 0, num_colour = 0, num_images = 0, size = 0;
  std::int64_t total_blocks = 0, total_colour_pixels = 0;
  OutputType out_type = OutputType::Uint8;
  float scale[3] = {1, 1, 1}, bias[3] = {0, 0, 0};  // float outputs: u8 * scale + bias (normalisation)
};

constexpr int kResampleBits = 22;  // Pillow's PRECISION_BITS

CONVNETS_HD std::uint8_t clamp8(int v) { return static_cast<std::uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v); }

// libjpeg's jpeg_idct_islow (jidctint.c): the Loeffler-Ligtenberg-Moschytz
// integer IDCT with 13-bit constants and 2 extra bits between the passes.
// `put(row, col, v)` receives each output before the final descale (v is the
// sample times 2^18, level shift not applied).
template <typename Put>
CONVNETS_HD void idct_islow_raw(const std::int16_t* coef, const std::uint16_t* q, Put put) {
  constexpr int kConst = 13, kPass1 = 2;
  constexpr std::int64_t c0_298 = 2446, c0_390 = 3196, c0_541 = 4433, c0_765 = 6270, c0_899 = 7373, c1_175 = 9633,
                         c1_501 = 12299, c1_847 = 15137, c1_961 = 16069, c2_053 = 16819, c2_562 = 20995,
                         c3_072 = 25172;
  std::int32_t ws[64];
  // One 8-point pass; `in(k)` yields input k, `out(k, v)` takes output k.
  auto pass = [&](auto in, auto out) {
    std::int64_t z2 = in(2), z3 = in(6);
    std::int64_t z1 = (z2 + z3) * c0_541;
    const std::int64_t t2 = z1 - z3 * c1_847, t3 = z1 + z2 * c0_765;
    const std::int64_t e0 = (in(0) + in(4)) * (std::int64_t(1) << kConst);
    const std::int64_t e1 = (in(0) - in(4)) * (std::int64_t(1) << kConst);
    const std::int64_t t10 = e0 + t3, t13 = e0 - t3, t11 = e1 + t2, t12 = e1 - t2;
    std::int64_t o0 = in(7), o1 = in(5), o2 = in(3), o3 = in(1);
    z1 = o0 + o3;
    z2 = o1 + o2;
    z3 = o0 + o2;
    std::int64_t z4 = o1 + o3;
    const std::int64_t z5 = (z3 + z4) * c1_175;
    o0 *= c0_298;
    o1 *= c2_053;
    o2 *= c3_072;
    o3 *= c1_501;
    z1 *= -c0_899;
    z2 *= -c2_562;
    z3 = z3 * -c1_961 + z5;
    z4 = z4 * -c0_390 + z5;
    o0 += z1 + z3;
    o1 += z2 + z4;
    o2 += z2 + z3;
    o3 += z1 + z4;
    out(0, t10 + o3), out(7, t10 - o3), out(1, t11 + o2), out(6, t11 - o2);
    out(2, t12 + o1), out(5, t12 - o1), out(3, t13 + o0), out(4, t13 - o0);
  };
  for (int col = 0; col < 8; ++col) {
    pass([&](int k) { return std::int64_t(coef[k * 8 + col]) * q[k * 8 + col]; },
         [&](int k, std::int64_t v) {
           constexpr int n = kConst - kPass1;
           ws[k * 8 + col] = static_cast<std::int32_t>((v + (std::int64_t(1) << (n - 1))) >> n);
         });
  }
  for (int row = 0; row < 8; ++row) {
    pass([&](int k) { return std::int64_t(ws[row * 8 + k]); }, [&](int k, std::int64_t v) { put(row, k, v); });
  }
}

// Full size: jpeg_idct_islow bit for bit, so full-scale planes equal
// libjpeg-turbo's (and PIL's). Reduced sizes (s = 4, 2): libjpeg's jidctred.c
// outputs the averages of 2x2 (4x4) full-size outputs, which this computes
// from the undescaled sums (its own integer shortcuts round differently, by
// about 1). s = 1 is libjpeg's DC/8 exactly.
CONVNETS_HD void idct_scaled(const std::int16_t* coef, const std::uint16_t* q, int s, std::uint8_t* out, int stride) {
  constexpr int kOut = 13 + 2 + 3;
  if (s == 8) {
    idct_islow_raw(coef, q, [&](int row, int col, std::int64_t v) {
      out[row * stride + col] = clamp8(static_cast<int>((v + (std::int64_t(1) << (kOut - 1))) >> kOut) + 128);
    });
    return;
  }
  if (s == 1) {
    const int dc = coef[0] * q[0];
    out[0] = clamp8(((dc + 4) >> 3) + 128);
    return;
  }
  const int f = 8 / s, shift = kOut + (f == 2 ? 2 : 4);
  std::int64_t acc[16] = {};
  idct_islow_raw(coef, q, [&](int row, int col, std::int64_t v) { acc[(row / f) * s + col / f] += v; });
  for (int y = 0; y < s; ++y)
    for (int x = 0; x < s; ++x)
      out[y * stride + x] = clamp8(static_cast<int>((acc[y * s + x] + (std::int64_t(1) << (shift - 1))) >> shift) + 128);
}

CONVNETS_HD void idct_block(const std::uint8_t* arena, const PlaneJob& p, std::int64_t block) {
  const std::int64_t by = block / p.blocks_w, bx = block - by * p.blocks_w;
  const auto* coef = reinterpret_cast<const std::int16_t*>(arena + p.coef) + block * 64;
  const auto* q = reinterpret_cast<const std::uint16_t*>(arena + p.quant);
  const int stride = p.blocks_w * p.s;
  auto* out = const_cast<std::uint8_t*>(arena) + p.plane + (by * p.s) * stride + bx * p.s;
  idct_scaled(coef, q, p.s, out, stride);
}

// libjpeg's jdsample.c fancy upsampling of one chroma sample at image
// position (gx, gy): the triangle filter with its exact rounding biases and
// edge replication at the component's true size.
CONVNETS_HD int chroma_at(const std::uint8_t* c, const ColourJob& j, int gx, int gy) {
  auto at = [&](int cx, int cy) { return int(c[(cy - j.cy0) * j.c_stride + (cx - j.cx0)]); };
  auto clampi = [](int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; };
  switch (j.mode) {
    case kH2V1: {
      const int cx = gx >> 1, cy = gy;
      if (!j.fancy) return at(cx, cy);
      const bool odd = gx & 1;
      const int nx = clampi(odd ? cx + 1 : cx - 1, 0, j.c_width - 1);
      return (3 * at(cx, cy) + at(nx, cy) + (odd ? 2 : 1)) >> 2;
    }
    case kH2V2: {
      const int cx = gx >> 1, cy = gy >> 1;
      if (!j.fancy) return at(cx, cy);
      const bool odd_x = gx & 1, odd_y = gy & 1;
      const int ny = clampi(odd_y ? cy + 1 : cy - 1, 0, j.c_height - 1);
      const int nx = clampi(odd_x ? cx + 1 : cx - 1, 0, j.c_width - 1);
      const int here = 3 * at(cx, cy) + at(cx, ny), there = 3 * at(nx, cy) + at(nx, ny);
      return (3 * here + there + (odd_x ? 7 : 8)) >> 4;
    }
    default:
      return at(gx, gy);
  }
}

// jdcolor.c's ycc_rgb_convert with its 16-bit fixed-point tables.
CONVNETS_HD void colour_pixel(const std::uint8_t* arena, const ColourJob& j, std::int64_t i) {
  const int ly = static_cast<int>(i / j.width), lx = static_cast<int>(i - std::int64_t(ly) * j.width);
  const int y = arena[j.y + std::int64_t(ly) * j.y_stride + lx];
  std::uint8_t* out = const_cast<std::uint8_t*>(arena) + j.rgb + (std::int64_t(ly) * j.width + lx) * 3;
  if (j.mode == kGray) {
    out[0] = out[1] = out[2] = static_cast<std::uint8_t>(y);
    return;
  }
  const int gx = j.x0 + lx, gy = j.y0 + ly;
  const int cb = chroma_at(arena + j.cb, j, gx, gy), cr = chroma_at(arena + j.cr, j, gx, gy);
  if (!j.ycc) {
    out[0] = static_cast<std::uint8_t>(y), out[1] = static_cast<std::uint8_t>(cb), out[2] = static_cast<std::uint8_t>(cr);
    return;
  }
  const std::int32_t half = 1 << 15, b = cb - 128, r = cr - 128;
  out[0] = clamp8(y + ((91881 * r + half) >> 16));
  out[1] = clamp8(y + ((-22554 * b + (-46802 * r + half)) >> 16));
  out[2] = clamp8(y + ((116130 * b + half) >> 16));
}

// Output pixel (ox, oy) of a resample job, all three channels.
CONVNETS_HD void resample_pixel(const std::uint8_t* arena, const ResampleJob& j, int size, int ox, int oy,
                                std::uint8_t* px) {
  const auto* xf = reinterpret_cast<const std::int32_t*>(arena + j.xfirst);
  const auto* xw = reinterpret_cast<const std::int32_t*>(arena + j.xweights);
  const auto* yf = reinterpret_cast<const std::int32_t*>(arena + j.yfirst);
  const auto* yw = reinterpret_cast<const std::int32_t*>(arena + j.yweights);
  const int sx = j.flip ? size - 1 - ox : ox;  // torchvision flips after the resize
  const std::int32_t half = 1 << (kResampleBits - 1);
  std::int32_t acc[3] = {half, half, half};
  const std::int32_t* wx = xw + std::int64_t(sx) * j.xtaps;
  const std::int32_t* wy = yw + std::int64_t(oy) * j.ytaps;
  for (int ty = 0; ty < j.ytaps; ++ty) {
    const std::uint8_t* row = arena + j.src + std::int64_t(yf[oy] + ty) * j.src_stride + std::int64_t(xf[sx]) * 3;
    std::int32_t h[3] = {half, half, half};
    for (int tx = 0; tx < j.xtaps; ++tx)
      for (int c = 0; c < 3; ++c) h[c] += row[tx * 3 + c] * wx[tx];
    for (int c = 0; c < 3; ++c) acc[c] += clamp8(h[c] >> kResampleBits) * wy[ty];
  }
  for (int c = 0; c < 3; ++c) px[c] = clamp8(acc[c] >> kResampleBits);
}

// Host loops over the same per-element functions (tests, and a CPU device).
void run_batch_cpu(std::uint8_t* arena, const BatchArgs& args, void* out);

// Enqueues the three stages on `stream` (a cudaStream_t); `arena` and `out`
// are device pointers. Returns the CUDA error code of the launches (0: success).
int launch_batch(std::uint8_t* arena, const BatchArgs& args, void* out, void* stream);

}  // namespace convnets::kernels::jpeg
