#include "data/pil_ops.h"

#include "core/cpu_features.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#define CONVNETS_X86_SIMD 1
#endif

// Bit-exactness with Pillow needs every float/double operation rounded on its
// own, in source order: the build compiles this file with -ffp-contract=off so
// no a + b * c becomes a fused multiply-add (Pillow's wheel has none either).

namespace convnets::data {
namespace pil {
namespace {

// Geometry.c's FLOOR: mathematical floor as an int.
inline int pil_floor(double v) { return v < 0.0 ? static_cast<int>(std::floor(v)) : static_cast<int>(v); }
inline int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Pillow's NEAREST affine paths (ImagingTransformAffine): scale/translate
// matrices step through coordinates by repeated addition; others use 16.16
// fixed point when every corner maps within +-32768, else stepped doubles.
void affine_nearest(const std::uint8_t* src, ImageRef out, const std::array<double, 6>& a) {
  const int w = out.width, h = out.height, C = out.channels;
  auto copy = [&](int x, int y, int xin, int yin) {
    if (xin < 0 || xin >= w || yin < 0 || yin >= h) return;
    std::memcpy(out.data + (std::size_t(y) * w + x) * C, src + (std::size_t(yin) * w + xin) * C, C);
  };
  auto coord = [](double v) { return v < 0.0 ? -1 : static_cast<int>(v); };
  if (a[1] == 0 && a[3] == 0) {  // ImagingScaleAffine
    std::vector<int> xin(w);
    double xo = a[2] + a[0] * 0.5;
    for (int x = 0; x < w; ++x, xo += a[0]) xin[x] = coord(xo);
    double yo = a[5] + a[4] * 0.5;
    for (int y = 0; y < h; ++y, yo += a[4]) {
      const int yi = coord(yo);
      for (int x = 0; x < w; ++x) copy(x, y, xin[x], yi);
    }
    return;
  }
  bool fixed = true;
  for (auto [cx, cy] : {std::pair<double, double>{0, 0}, {double(w), double(h)}, {0, double(h)}, {double(w), 0}}) {
    if (std::fabs(cx * a[0] + cy * a[1] + a[2]) >= 32768.0 || std::fabs(cx * a[3] + cy * a[4] + a[5]) >= 32768.0)
      fixed = false;
  }
  if (fixed) {  // affine_fixed
    auto fix = [](double v) { return pil_floor(v * 65536.0 + 0.5); };
    const int a0 = fix(a[0]), a1 = fix(a[1]), a3 = fix(a[3]), a4 = fix(a[4]);
    const int a2 = fix((a[2] + a[0] * 0.5) + a[1] * 0.5), a5 = fix((a[5] + a[3] * 0.5) + a[4] * 0.5);
    for (int y = 0; y < h; ++y) {
      int xx = a2 + y * a1, yy = a5 + y * a4;
      for (int x = 0; x < w; ++x, xx += a0, yy += a3) copy(x, y, xx >> 16, yy >> 16);
    }
    return;
  }
  double xo = (a[2] + a[1] * 0.5) + a[0] * 0.5, yo = (a[5] + a[4] * 0.5) + a[3] * 0.5;
  for (int y = 0; y < h; ++y, xo += a[1], yo += a[4]) {
    double xx = xo, yy = yo;
    for (int x = 0; x < w; ++x, xx += a[0], yy += a[3]) copy(x, y, coord(xx), coord(yy));
  }
}

// Geometry.c's BICUBIC macro in its Horner form (the a = -1 cubic).
inline double cubic(double v1, double v2, double v3, double v4, double d) {
  const double p1 = v2;
  const double p2 = -v1 + v3;
  const double p3 = 2 * (v1 - v2) + v3 - v4;
  const double p4 = -v1 + v2 - v3 + v4;
  return p1 + d * (p2 + d * (p3 + d * p4));
}

#ifdef CONVNETS_X86_SIMD
// An RGB pixel whose taps all lie inside the image, its three channels in
// three lanes of one vector: per lane the scalar code's double operations in
// its order (no FMA), so the same bits, for about a third of the instructions.
// `p` points at the top-left tap; reads up to 16 bytes from each tap row.
__attribute__((target("avx2"))) void bicubic_rgb_avx2(const std::uint8_t* p, std::ptrdiff_t stride, double dx, double dy,
                                                      std::uint8_t* o) {
  const __m128i pick[4] = {_mm_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, -1, -1, -1, -1),
                           _mm_setr_epi8(3, -1, -1, -1, 4, -1, -1, -1, 5, -1, -1, -1, -1, -1, -1, -1),
                           _mm_setr_epi8(6, -1, -1, -1, 7, -1, -1, -1, 8, -1, -1, -1, -1, -1, -1, -1),
                           _mm_setr_epi8(9, -1, -1, -1, 10, -1, -1, -1, 11, -1, -1, -1, -1, -1, -1, -1)};
  const __m256d d = _mm256_set1_pd(dx), sign = _mm256_set1_pd(-0.0);
  __m256d rv[4];
  for (int k = 0; k < 4; ++k) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k * stride));
    const __m128i v1 = _mm_shuffle_epi8(raw, pick[0]), v2 = _mm_shuffle_epi8(raw, pick[1]),
                  v3 = _mm_shuffle_epi8(raw, pick[2]), v4 = _mm_shuffle_epi8(raw, pick[3]);
    const __m128i p2 = _mm_sub_epi32(v3, v1);  // exact in int, as Geometry.c
    const __m128i p3 = _mm_sub_epi32(_mm_add_epi32(_mm_slli_epi32(_mm_sub_epi32(v1, v2), 1), v3), v4);
    const __m128i p4 = _mm_add_epi32(_mm_sub_epi32(_mm_sub_epi32(v2, v1), v3), v4);
    __m256d t = _mm256_mul_pd(d, _mm256_cvtepi32_pd(p4));
    t = _mm256_mul_pd(d, _mm256_add_pd(_mm256_cvtepi32_pd(p3), t));
    t = _mm256_mul_pd(d, _mm256_add_pd(_mm256_cvtepi32_pd(p2), t));
    rv[k] = _mm256_add_pd(_mm256_cvtepi32_pd(v2), t);
  }
  // cubic(rv[0..3], dy), term for term.
  const __m256d e = _mm256_set1_pd(dy), neg0 = _mm256_xor_pd(rv[0], sign);
  const __m256d p2 = _mm256_add_pd(neg0, rv[2]);
  const __m256d p3 =
      _mm256_sub_pd(_mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(2.0), _mm256_sub_pd(rv[0], rv[1])), rv[2]), rv[3]);
  const __m256d p4 = _mm256_add_pd(_mm256_sub_pd(_mm256_add_pd(neg0, rv[1]), rv[2]), rv[3]);
  __m256d s = _mm256_mul_pd(e, p4);
  s = _mm256_mul_pd(e, _mm256_add_pd(p3, s));
  s = _mm256_mul_pd(e, _mm256_add_pd(p2, s));
  s = _mm256_add_pd(rv[1], s);
  s = _mm256_min_pd(_mm256_max_pd(s, _mm256_setzero_pd()), _mm256_set1_pd(255.0));  // clip, then truncate
  const __m128i i = _mm256_cvttpd_epi32(s);
  const int packed = _mm_cvtsi128_si32(_mm_packus_epi16(_mm_packus_epi32(i, i), i));
  std::memcpy(o, &packed, 3);
}

__attribute__((target("avx2"))) void bilinear_rgb_avx2(const std::uint8_t* p, std::ptrdiff_t stride, double dx,
                                                       double dy, std::uint8_t* o) {
  const __m128i pick0 = _mm_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, -1, -1, -1, -1);
  const __m128i pick1 = _mm_setr_epi8(3, -1, -1, -1, 4, -1, -1, -1, 5, -1, -1, -1, -1, -1, -1, -1);
  const __m256d d = _mm256_set1_pd(dx);
  __m256d t[2];
  for (int k = 0; k < 2; ++k) {
    const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + k * stride));
    const __m128i a = _mm_shuffle_epi8(raw, pick0), b = _mm_shuffle_epi8(raw, pick1);
    t[k] = _mm256_add_pd(_mm256_cvtepi32_pd(a), _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_sub_epi32(b, a)), d));
  }
  const __m256d r = _mm256_add_pd(t[0], _mm256_mul_pd(_mm256_sub_pd(t[1], t[0]), _mm256_set1_pd(dy)));
  const __m128i i = _mm256_cvttpd_epi32(r);
  const int packed = _mm_cvtsi128_si32(_mm_packus_epi16(_mm_packus_epi32(i, i), i));
  std::memcpy(o, &packed, 3);
}
#endif

// ImagingGenericTransform with bilinear_filter32RGB / bicubic_filter32RGB.
// `src` has 16 readable bytes past its end (the SIMD kernels' loads).
void affine_filtered(const std::uint8_t* src, ImageRef out, const std::array<double, 6>& a, Resample r) {
  const int w = out.width, h = out.height, C = out.channels;
  auto px = [&](int y, int x, int b) -> int { return src[(std::size_t(y) * w + x) * C + b]; };
#ifdef CONVNETS_X86_SIMD
  static const bool avx2 = cpu_vector_features().avx2;
  const bool simd = avx2 && C == 3;
#else
  const bool simd = false;
#endif
  const std::ptrdiff_t stride = std::ptrdiff_t(w) * C;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const double xin = x + 0.5, yin = y + 0.5;
      const double xs = a[0] * xin + a[1] * yin + a[2];
      const double ys = a[3] * xin + a[4] * yin + a[5];
      if (xs < 0.0 || xs >= w || ys < 0.0 || ys >= h) continue;  // keeps the fill colour
      const double u = xs - 0.5, v = ys - 0.5;
      int x0 = pil_floor(u), y0 = pil_floor(v);
      const double dx = u - x0, dy = v - y0;
      std::uint8_t* o = out.data + (std::size_t(y) * w + x) * C;
#ifdef CONVNETS_X86_SIMD
      if (simd) {  // no tap needs clamping: the vector kernels
        if (r == Resample::Bilinear && x0 >= 0 && x0 + 1 < w && y0 >= 0 && y0 + 1 < h) {
          bilinear_rgb_avx2(src + y0 * stride + std::ptrdiff_t(x0) * 3, stride, dx, dy, o);
          continue;
        }
        if (r == Resample::Bicubic && x0 >= 1 && x0 + 2 < w && y0 >= 1 && y0 + 2 < h) {
          bicubic_rgb_avx2(src + (y0 - 1) * stride + std::ptrdiff_t(x0 - 1) * 3, stride, dx, dy, o);
          continue;
        }
      }
#endif
      if (r == Resample::Bilinear) {
        const int r0 = clampi(y0, 0, h - 1), c0 = clampi(x0, 0, w - 1), c1 = clampi(x0 + 1, 0, w - 1);
        const bool below = y0 + 1 >= 0 && y0 + 1 < h;
        for (int b = 0; b < C; ++b) {
          const double t1 = px(r0, c0, b) + (px(r0, c1, b) - px(r0, c0, b)) * dx;
          const double t2 = below ? px(y0 + 1, c0, b) + (px(y0 + 1, c1, b) - px(y0 + 1, c0, b)) * dx : t1;
          o[b] = static_cast<std::uint8_t>(t1 + (t2 - t1) * dy);
        }
      } else {
        --x0, --y0;
        int cols[4], rows[4];
        for (int k = 0; k < 4; ++k) cols[k] = clampi(x0 + k, 0, w - 1), rows[k] = clampi(y0 + k, 0, h - 1);
        for (int b = 0; b < C; ++b) {
          double rv[4];
          for (int k = 0; k < 4; ++k) {
            // Geometry.c computes these differences in int, then widens.
            const int v1 = px(rows[k], cols[0], b), v2 = px(rows[k], cols[1], b), v3 = px(rows[k], cols[2], b),
                      v4 = px(rows[k], cols[3], b);
            const double p1 = v2, p2 = -v1 + v3, p3 = 2 * (v1 - v2) + v3 - v4, p4 = -v1 + v2 - v3 + v4;
            rv[k] = p1 + dx * (p2 + dx * (p3 + dx * p4));
          }
          const double s = cubic(rv[0], rv[1], rv[2], rv[3], dy);
          o[b] = s <= 0.0 ? 0 : (s >= 255.0 ? 255 : static_cast<std::uint8_t>(s));
        }
      }
    }
  }
}

// Python's round(x, 15): the double nearest the decimal rounded to 15 places
// (printf and strtod both round correctly, as CPython's dtoa does).
double round15(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.15f", x);
  return std::strtod(buf, nullptr);
}

void apply_lut(ImageRef img, const std::array<std::uint8_t, 256>* per_channel) {
  const std::size_t n = std::size_t(img.width) * img.height;
  for (std::size_t i = 0; i < n; ++i)
    for (int c = 0; c < img.channels; ++c) img.data[i * img.channels + c] = per_channel[c][img.data[i * img.channels + c]];
}

void apply_lut(ImageRef img, const std::array<std::uint8_t, 256>& lut) {
  const std::size_t n = img.bytes();
  for (std::size_t i = 0; i < n; ++i) img.data[i] = lut[img.data[i]];
}

std::array<std::array<std::int64_t, 256>, 3> histograms(ImageRef img) {
  std::array<std::array<std::int64_t, 256>, 3> h{};
  const std::size_t n = std::size_t(img.width) * img.height;
  for (std::size_t i = 0; i < n; ++i)
    for (int c = 0; c < img.channels; ++c) ++h[c][img.data[i * img.channels + c]];
  return h;
}

// Convert.c's rgb2l (L24): Rec. 601 luma in 16-bit fixed point, rounded half up.
inline std::uint8_t luma(const std::uint8_t* p, int channels) {
  if (channels == 1) return p[0];
  return static_cast<std::uint8_t>((p[0] * 19595 + p[1] * 38470 + p[2] * 7471 + 0x8000) >> 16);
}

// Blend.c's ImagingBlend(degenerate, img, (float)factor): float32, truncated,
// clipped only when extrapolating. Flat loops over the bytes, which the
// compiler vectorises: the same float operations per byte, the same results.
__attribute__((target_clones("avx2", "default"))) void blend_bytes(std::uint8_t* img, const std::uint8_t* deg,
                                                                   std::size_t n, float alpha) {
  if (alpha >= 0.0f && alpha <= 1.0f) {
    for (std::size_t i = 0; i < n; ++i) {
      const float t = static_cast<float>(deg[i]) + alpha * static_cast<float>(int(img[i]) - int(deg[i]));
      img[i] = static_cast<std::uint8_t>(static_cast<int>(t));
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      float t = static_cast<float>(deg[i]) + alpha * static_cast<float>(int(img[i]) - int(deg[i]));
      t = t < 0.0f ? 0.0f : (t > 255.0f ? 255.0f : t);
      img[i] = static_cast<std::uint8_t>(static_cast<int>(t));
    }
  }
}

void blend(ImageRef img, double factor, const std::uint8_t* degenerate) {
  const float alpha = static_cast<float>(factor);
  if (alpha == 1.0f) return;
  if (alpha == 0.0f) {
    std::memcpy(img.data, degenerate, img.bytes());
    return;
  }
  blend_bytes(img.data, degenerate, img.bytes(), alpha);
}

// ImageFilter.SMOOTH on the interior bytes of one row (Filter.c's
// ImagingFilter3x3: kernel row 0 on the row below, + 0.5, clipped, truncated),
// flat over the row's bytes so that it vectorises with the same float operations.
__attribute__((target_clones("avx2", "default"))) void smooth_row(const std::uint8_t* up, const std::uint8_t* mid,
                                                                  const std::uint8_t* down, std::uint8_t* out,
                                                                  std::size_t n, int C) {
  const float k1 = 1.0f / 13.0f, k5 = 5.0f / 13.0f;
  for (std::size_t l = 0; l < n; ++l) {
    const std::size_t m = l + C, r = m + C;
    float ss = 0.5f;
    ss += (float(down[l]) * k1 + float(down[m]) * k1) + float(down[r]) * k1;
    ss += (float(mid[l]) * k1 + float(mid[m]) * k5) + float(mid[r]) * k1;
    ss += (float(up[l]) * k1 + float(up[m]) * k1) + float(up[r]) * k1;
    ss = ss < 0.0f ? 0.0f : (ss > 255.0f ? 255.0f : ss);
    out[m] = static_cast<std::uint8_t>(static_cast<int>(ss));
  }
}

}  // namespace

void affine(ImageRef img, const std::array<double, 6>& a, Resample r, const Fill& fill,
            std::vector<std::uint8_t>& scratch) {
  scratch.assign(img.data, img.data + img.bytes());
  scratch.resize(img.bytes() + 16);  // slack for the vector kernels' loads
  const std::size_t row = std::size_t(img.width) * img.channels;
  for (int x = 0; x < img.width; ++x) std::memcpy(img.data + std::size_t(x) * img.channels, fill.data(), img.channels);
  for (int y = 1; y < img.height; ++y) std::memcpy(img.data + y * row, img.data, row);
  if (r == Resample::Nearest) {
    affine_nearest(scratch.data(), img, a);
  } else {
    affine_filtered(scratch.data(), img, a, r);
  }
}

void rotate(ImageRef img, double degrees, Resample r, const Fill& fill, std::vector<std::uint8_t>& scratch) {
  double angle = std::fmod(degrees, 360.0);  // Python's float %: the sign of the divisor
  if (angle != 0 && angle < 0) angle += 360.0;
  const int w = img.width, h = img.height, C = img.channels;
  if (angle == 0) return;
  if (angle == 180 || ((angle == 90 || angle == 270) && w == h)) {  // Image.transpose: exact permutations
    scratch.assign(img.data, img.data + img.bytes());
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        int sx, sy;
        if (angle == 180) sx = w - 1 - x, sy = h - 1 - y;
        else if (angle == 90) sx = w - 1 - y, sy = x;  // ROTATE_90: counter-clockwise
        else sx = y, sy = h - 1 - x;
        std::memcpy(img.data + (std::size_t(y) * w + x) * C, scratch.data() + (std::size_t(sy) * w + sx) * C, C);
      }
    }
    return;
  }
  const double t = -(angle * (M_PI / 180.0));  // -math.radians(angle)
  const double a = round15(std::cos(t)), b = round15(std::sin(t)), d = round15(-std::sin(t)), e = round15(std::cos(t));
  const double cx = w / 2.0, cy = h / 2.0;
  double c = a * (-cx) + b * (-cy) + 0.0, f = d * (-cx) + e * (-cy) + 0.0;
  c += cx;
  f += cy;
  affine(img, {a, b, c, d, e, f}, r, fill, scratch);
}

void auto_contrast(ImageRef img) {
  const auto h = histograms(img);
  std::array<std::array<std::uint8_t, 256>, 3> luts;
  for (int c = 0; c < img.channels; ++c) {
    int lo = 0, hi = 255;
    while (lo < 256 && h[c][lo] == 0) ++lo;
    while (hi >= 0 && h[c][hi] == 0) --hi;
    for (int i = 0; i < 256; ++i) {
      if (hi <= lo) {
        luts[c][i] = static_cast<std::uint8_t>(i);
        continue;
      }
      const double scale = 255.0 / (hi - lo), offset = -lo * scale;
      const double v = i * scale + offset;
      const long iv = static_cast<long>(v);  // Python's int(): toward zero
      luts[c][i] = static_cast<std::uint8_t>(iv < 0 ? 0 : (iv > 255 ? 255 : iv));
    }
  }
  apply_lut(img, luts.data());
}

void equalize(ImageRef img) {
  const auto h = histograms(img);
  std::array<std::array<std::uint8_t, 256>, 3> luts;
  for (int c = 0; c < img.channels; ++c) {
    std::int64_t total = 0, last = 0, nonzero = 0;
    for (int i = 0; i < 256; ++i) {
      if (h[c][i]) total += h[c][i], last = h[c][i], ++nonzero;
    }
    const std::int64_t step = nonzero <= 1 ? 0 : (total - last) / 255;
    std::int64_t n = step / 2;
    for (int i = 0; i < 256; ++i) {
      if (step == 0) {
        luts[c][i] = static_cast<std::uint8_t>(i);
        continue;
      }
      luts[c][i] = static_cast<std::uint8_t>(std::min<std::int64_t>(n / step, 255));  // Image.point's CLIP8
      n += h[c][i];
    }
  }
  apply_lut(img, luts.data());
}

void invert(ImageRef img) {
  std::array<std::uint8_t, 256> lut;
  for (int i = 0; i < 256; ++i) lut[i] = static_cast<std::uint8_t>(255 - i);
  apply_lut(img, lut);
}

void posterize(ImageRef img, int bits) {
  if (bits >= 8) return;
  const int mask = ~((1 << (8 - std::max(bits, 0))) - 1);
  std::array<std::uint8_t, 256> lut;
  for (int i = 0; i < 256; ++i) lut[i] = static_cast<std::uint8_t>(i & mask);
  apply_lut(img, lut);
}

void solarize(ImageRef img, double threshold) {
  std::array<std::uint8_t, 256> lut;
  for (int i = 0; i < 256; ++i) lut[i] = static_cast<std::uint8_t>(i < threshold ? i : 255 - i);
  apply_lut(img, lut);
}

void solarize_add(ImageRef img, int add, int threshold) {
  std::array<std::uint8_t, 256> lut;
  for (int i = 0; i < 256; ++i) lut[i] = static_cast<std::uint8_t>(i < threshold ? clampi(i + add, 0, 255) : i);
  apply_lut(img, lut);
}

void color(ImageRef img, double factor, std::vector<std::uint8_t>& scratch) {
  const int C = img.channels;
  const std::size_t n = std::size_t(img.width) * img.height;
  scratch.resize(img.bytes());  // the grey image, L replicated to every channel
  for (std::size_t i = 0; i < n; ++i) std::memset(scratch.data() + i * C, luma(img.data + i * C, C), C);
  blend(img, factor, scratch.data());
}

void contrast(ImageRef img, double factor, std::vector<std::uint8_t>& scratch) {
  const std::size_t n = std::size_t(img.width) * img.height;
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += luma(img.data + i * img.channels, img.channels);
  const auto mean = static_cast<std::uint8_t>(static_cast<double>(sum) / static_cast<double>(n) + 0.5);
  scratch.assign(img.bytes(), mean);
  blend(img, factor, scratch.data());
}

void brightness(ImageRef img, double factor, std::vector<std::uint8_t>& scratch) {
  scratch.assign(img.bytes(), 0);
  blend(img, factor, scratch.data());
}

void sharpness(ImageRef img, double factor, std::vector<std::uint8_t>& scratch) {
  const int w = img.width, h = img.height, C = img.channels;
  if (w < 3 || h < 3) return;  // ImagingFilter returns such images unfiltered: the blend is the image
  // ImageFilter.SMOOTH: (1 1 1 / 1 5 1 / 1 1 1) / 13 in float32; the
  // one-pixel border is copied.
  scratch.assign(img.data, img.data + img.bytes());
  const std::size_t stride = std::size_t(w) * C;
  for (int y = 1; y < h - 1; ++y) {
    const std::uint8_t* up = img.data + (y - 1) * stride;
    smooth_row(up, up + stride, up + 2 * stride, scratch.data() + y * stride, std::size_t(w - 2) * C, C);
  }
  blend(img, factor, scratch.data());
}

}  // namespace pil

}  // namespace convnets::data
