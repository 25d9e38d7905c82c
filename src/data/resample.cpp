#include "data/resample.h"

#include "core/cpu_features.h"
#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#define CONVNETS_X86_SIMD 1
#endif

namespace convnets::data {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow's PRECISION_BITS for 8-bit images

inline double bilinear(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// Resample.c's bicubic_filter, term for term (a = -0.5).
inline double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

inline std::uint8_t clip8(std::int32_t ss) {
  const std::int32_t v = ss >> kPrecisionBits;
  return static_cast<std::uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

}  // namespace

Filter parse_filter(const std::string& name, const std::string& what) {
  if (name == "bilinear") return Filter::Bilinear;
  if (name == "bicubic") return Filter::Bicubic;
  throw Error(what + " '" + name + "' is not a resampling filter", "use bilinear or bicubic (PIL's antialiased filters)");
}

const char* filter_name(Filter f) { return f == Filter::Bicubic ? "bicubic" : "bilinear"; }

AxisPlan plan_axis(int in_size, double box0, double box1, int full_out, int out_begin, int out_count, Filter filter) {
  // Mirrors Pillow's precompute_coeffs + normalize_coeffs_8bpc operation for
  // operation (same double arithmetic, same truncations), so weights agree bit for bit.
  AxisPlan p;
  const double scale = (box1 - box0) / full_out;
  const double filterscale = std::max(scale, 1.0);
  const bool cubic = filter == Filter::Bicubic;
  const double support = (cubic ? 2.0 : 1.0) * filterscale;
  p.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  p.in_size = in_size;
  p.full_out = full_out;
  p.identity = full_out == in_size && box0 == 0.0 && box1 == in_size;
  p.first.resize(out_count);
  p.count.resize(out_count);
  p.weights.assign(std::size_t(out_count) * p.ksize, 0);
  std::vector<double> k(p.ksize);
  p.src_begin = in_size;
  p.src_end = 0;
  for (int i = 0; i < out_count; ++i) {
    const int xx = out_begin + i;
    const double center = box0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double t = (x + xmin - center + 0.5) * ss;
      k[x] = cubic ? bicubic(t) : bilinear(t);
      ww += k[x];
    }
    std::int32_t* w = &p.weights[std::size_t(i) * p.ksize];
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? k[x] / ww : k[x];
      w[x] = v < 0 ? static_cast<std::int32_t>(-0.5 + v * (1 << kPrecisionBits))
                   : static_cast<std::int32_t>(0.5 + v * (1 << kPrecisionBits));
    }
    p.first[i] = xmin;
    p.count[i] = xmax;
    p.src_begin = std::min(p.src_begin, xmin);
    p.src_end = std::max(p.src_end, xmin + xmax);
  }
  if (p.src_end <= p.src_begin) p.src_begin = p.src_end = 0;
  p.taps = 0;
  for (int c : p.count) p.taps = std::max(p.taps, c);
  p.first_padded.resize(out_count);
  p.weights_padded.assign(std::size_t(out_count) * p.taps, 0);
  for (int i = 0; i < out_count; ++i) {
    const int start = std::max(p.src_begin, std::min(p.first[i], p.src_end - p.taps));
    p.first_padded[i] = start;
    for (int t = 0; t < p.count[i]; ++t)
      p.weights_padded[std::size_t(i) * p.taps + (p.first[i] - start) + t] = p.weights[std::size_t(i) * p.ksize + t];
  }
  p.weights_by_tap.resize(p.weights_padded.size());
  for (int i = 0; i < out_count; ++i)
    for (int t = 0; t < p.taps; ++t)
      p.weights_by_tap[std::size_t(t) * out_count + i] = p.weights_padded[std::size_t(i) * p.taps + t];
  return p;
}

namespace {

// Fixed tap count K for RGB: the compiler unrolls the taps and keeps the
// three sums in registers.
// `step` is 3, or -3 with `out` at the last pixel to write the row mirrored.
template <int K>
void horizontal_rgb(const std::uint8_t* in, std::uint8_t* out, int step, int out_w, const int* first,
                    const std::int32_t* w, int src_begin) {
  const std::int32_t half = 1 << (kPrecisionBits - 1);
  for (int x = 0; x < out_w; ++x, w += K, out += step) {
    const std::uint8_t* s = in + (first[x] - src_begin) * 3;
    std::int32_t a0 = half, a1 = half, a2 = half;
    for (int t = 0; t < K; ++t) a0 += s[3 * t] * w[t], a1 += s[3 * t + 1] * w[t], a2 += s[3 * t + 2] * w[t];
    out[0] = clip8(a0), out[1] = clip8(a1), out[2] = clip8(a2);
  }
}

// Any channel count and tap count; `step` as for horizontal_rgb (+-C).
void horizontal_any(const std::uint8_t* in, std::uint8_t* out, int step, int out_w, int C, int taps,
                    const int* first, const std::int32_t* w, int src_begin) {
  const std::int32_t half = 1 << (kPrecisionBits - 1);
  for (int x = 0; x < out_w; ++x, w += taps, out += step) {
    const std::uint8_t* s = in + std::ptrdiff_t(first[x] - src_begin) * C;
    for (int c = 0; c < C; ++c) {
      std::int32_t a = half;
      for (int t = 0; t < taps; ++t) a += s[t * C + c] * w[t];
      out[c] = clip8(a);
    }
  }
}

// The vertical pass's inner loop dominates; AVX2 clones it with 8-lane 32-bit
// multiplies where the CPU has them (chosen at load time), SSE2 elsewhere.
__attribute__((target_clones("avx2", "default"))) void vertical_row(const std::uint8_t* tmp, std::ptrdiff_t tmp_stride,
                                                                     int first, int count, const std::int32_t* w,
                                                                     std::int32_t* acc, std::uint8_t* out, int len) {
  for (int i = 0; i < len; ++i) acc[i] = 1 << (kPrecisionBits - 1);
  for (int t = 0; t < count; ++t) {
    const std::uint8_t* in = tmp + std::ptrdiff_t(first + t) * tmp_stride;
    const std::int32_t wt = w[t];
    for (int i = 0; i < len; ++i) acc[i] += in[i] * wt;
  }
  for (int i = 0; i < len; ++i) out[i] = clip8(acc[i]);
}


#ifdef CONVNETS_X86_SIMD
// AVX2 horizontal RGB kernel: 8 outputs at a time, one 32-bit gather per tap
// (R, G, B and one byte past), the same integer arithmetic as the scalar
// kernel, so results are identical. Reads one byte past each source row: the
// caller guarantees that slack. Returns the number of outputs written; the
// scalar kernel finishes the rest.
__attribute__((target("avx2"))) int horizontal_rgb_avx2(const std::uint8_t* in, std::uint8_t* out, bool flip,
                                                        int out_w, const std::int32_t* byte_offset,
                                                        const std::int32_t* w_by_tap, int taps) {
  const __m256i half = _mm256_set1_epi32(1 << (kPrecisionBits - 1)), lo8 = _mm256_set1_epi32(0xff);
  const __m256i top = _mm256_set1_epi32(255), zero = _mm256_setzero_si256(), reverse = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
  const __m128i squeeze = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  int x = 0;
  for (; x + 8 <= out_w; x += 8) {
    const __m256i off = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(byte_offset + x));
    __m256i r = half, g = half, b = half;
    for (int t = 0; t < taps; ++t) {
      const __m256i px = _mm256_i32gather_epi32(reinterpret_cast<const int*>(in + 3 * t), off, 1);
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w_by_tap + std::size_t(t) * out_w + x));
      r = _mm256_add_epi32(r, _mm256_mullo_epi32(_mm256_and_si256(px, lo8), w));
      g = _mm256_add_epi32(g, _mm256_mullo_epi32(_mm256_and_si256(_mm256_srli_epi32(px, 8), lo8), w));
      b = _mm256_add_epi32(b, _mm256_mullo_epi32(_mm256_and_si256(_mm256_srli_epi32(px, 16), lo8), w));
    }
    // Bicubic's negative lobes can take a sum below zero: clamp both ends, as clip8 does.
    r = _mm256_max_epi32(_mm256_min_epi32(_mm256_srai_epi32(r, kPrecisionBits), top), zero);
    g = _mm256_max_epi32(_mm256_min_epi32(_mm256_srai_epi32(g, kPrecisionBits), top), zero);
    b = _mm256_max_epi32(_mm256_min_epi32(_mm256_srai_epi32(b, kPrecisionBits), top), zero);
    __m256i rgb = _mm256_or_si256(r, _mm256_or_si256(_mm256_slli_epi32(g, 8), _mm256_slli_epi32(b, 16)));
    std::uint8_t* o = out + std::ptrdiff_t(x) * 3;
    if (flip) {
      rgb = _mm256_permutevar8x32_epi32(rgb, reverse);
      o = out + std::ptrdiff_t(out_w - x - 8) * 3;
    }
    const __m128i a = _mm_shuffle_epi8(_mm256_castsi256_si128(rgb), squeeze);
    const __m128i c = _mm_shuffle_epi8(_mm256_extracti128_si256(rgb, 1), squeeze);
    std::memcpy(o, &a, 12);
    std::memcpy(o + 12, &c, 12);
  }
  return x;
}
#endif

// Scalar by nature (each output reads its own window), so it is the pass to
// run on as few rows as possible. Writes each row mirrored when `flip`.
void horizontal_pass(const codec::ImageView& src, const AxisPlan& h, std::uint8_t* dst, std::ptrdiff_t dst_stride,
                     bool flip, bool src_has_slack, std::vector<std::int32_t>& offsets) {
  const int C = src.channels, out_w = h.out_count(), taps = h.taps;
  const int step = flip ? -C : C;
  const std::ptrdiff_t start = flip ? std::ptrdiff_t(out_w - 1) * C : 0;
  const int* first = h.first_padded.data();
  const std::int32_t* w = h.weights_padded.data();
#ifdef CONVNETS_X86_SIMD
  static const bool avx2 = cpu_vector_features().avx2;
  if (C == 3 && src_has_slack && avx2) {
    offsets.resize(out_w);
    for (int x = 0; x < out_w; ++x) offsets[x] = (first[x] - h.src_begin) * 3;
    for (int y = 0; y < src.height; ++y) {
      const std::uint8_t* in = src.row(y);
      std::uint8_t* out = dst + y * dst_stride;
      const int done = horizontal_rgb_avx2(in, out, flip, out_w, offsets.data(), h.weights_by_tap.data(), taps);
      // The scalar kernel finishes the last out_w % 8 outputs.
      horizontal_any(in, out + start + std::ptrdiff_t(done) * step, step, out_w - done, 3, taps, first + done,
                     w + std::size_t(done) * taps, h.src_begin);
    }
    return;
  }
#else
  (void)src_has_slack;
  (void)offsets;
#endif
  for (int y = 0; y < src.height; ++y) {
    const std::uint8_t* in = src.row(y);
    std::uint8_t* out = dst + y * dst_stride + start;
    switch (C == 3 ? taps : 0) {
      case 1: horizontal_rgb<1>(in, out, step, out_w, first, w, h.src_begin); break;
      case 2: horizontal_rgb<2>(in, out, step, out_w, first, w, h.src_begin); break;
      case 3: horizontal_rgb<3>(in, out, step, out_w, first, w, h.src_begin); break;
      case 4: horizontal_rgb<4>(in, out, step, out_w, first, w, h.src_begin); break;
      case 5: horizontal_rgb<5>(in, out, step, out_w, first, w, h.src_begin); break;
      case 6: horizontal_rgb<6>(in, out, step, out_w, first, w, h.src_begin); break;
      default: horizontal_any(in, out, step, out_w, C, taps, first, w, h.src_begin);
    }
  }
}

// src rows are local rows v.src_begin.. ; row_len bytes per row are filtered.
void vertical_pass(const codec::ImageView& src, int row_len, const AxisPlan& v, std::uint8_t* dst,
                   std::ptrdiff_t dst_stride, std::vector<std::int32_t>& accum) {
  accum.resize(row_len);
  for (int y = 0; y < v.out_count(); ++y) {
    std::uint8_t* out = dst + y * dst_stride;
    if (v.identity) {
      std::copy_n(src.row(v.first[y] - v.src_begin), row_len, out);
    } else {
      vertical_row(src.data, src.stride, v.first[y] - v.src_begin, v.count[y], &v.weights[std::size_t(y) * v.ksize],
                   accum.data(), out, row_len);
    }
  }
}

}  // namespace

void resample(const codec::ImageView& src, const AxisPlan& h, const AxisPlan& v, std::uint8_t* dst,
              std::ptrdiff_t dst_stride, bool flip, bool pil_order, std::vector<std::uint8_t>& scratch,
              std::vector<std::int32_t>& accum) {
  const int C = src.channels;
  const int out_w = h.out_count(), out_h = v.out_count();
  const int src_w = h.src_end - h.src_begin, src_h = v.src_end - v.src_begin;
  // Pillow 13's ImagingResampleInner (PR #9549): vertical first when the
  // height shrinks by more than twice the pixels the width does.
  const int shrink_h = v.in_size - v.full_out, shrink_w = h.in_size - h.full_out;
  const bool vertical_first = !v.identity && !h.identity &&
                              (pil_order ? shrink_h > 0 && shrink_h > 2 * shrink_w : src_h > out_h);
  // When the horizontal pass writes the output it mirrors as it goes; only
  // outputs whose last pass is vertical need flipping afterwards.
  bool mirror_after = false;
  if (h.identity) {
    vertical_pass(src, out_w * C, v, dst, dst_stride, accum);
    mirror_after = flip;
  } else if (v.identity) {
    horizontal_pass({src.data + std::ptrdiff_t(v.first[0] - v.src_begin) * src.stride, src.width, out_h, C,
                     src.stride}, h, dst, dst_stride, flip, src.slack > 0, accum);
  } else if (vertical_first) {
    const std::ptrdiff_t stride = std::ptrdiff_t(src_w) * C;
    scratch.resize(std::size_t(out_h) * stride + 16);  // slack for the gathering kernel
    vertical_pass(src, src_w * C, v, scratch.data(), stride, accum);
    horizontal_pass({scratch.data(), src_w, out_h, C, stride}, h, dst, dst_stride, flip, true, accum);
  } else {
    const std::ptrdiff_t stride = std::ptrdiff_t(out_w) * C;
    scratch.resize(std::size_t(src_h) * stride);
    horizontal_pass({src.data, src.width, src_h, C, src.stride}, h, scratch.data(), stride, false, src.slack > 0, accum);
    vertical_pass({scratch.data(), out_w, src_h, C, stride}, out_w * C, v, dst, dst_stride, accum);
    mirror_after = flip;
  }
  if (mirror_after) {
    for (int y = 0; y < out_h; ++y) {
      std::uint8_t* out = dst + y * dst_stride;
      for (int a = 0, b = out_w - 1; a < b; ++a, --b)
        for (int c = 0; c < C; ++c) std::swap(out[a * C + c], out[b * C + c]);
    }
  }
}

}  // namespace convnets::data
