// PIL-exact antialiased resampling (Pillow's Resample.c, bilinear and bicubic), restricted to the output window a transform needs.
#pragma once

#include "codec/image.h"

#include <cstdint>
#include <string>
#include <vector>

namespace convnets::data {

// One axis of the resample. Source coordinates are local to the range the
// filter may read, [0, in_size); PIL's box [box0, box1) within it maps onto a
// virtual output of full_out samples, of which [out_begin, out_begin + out_count)
// are computed. With box = (0, in_size) and the full output this is exactly
// Image.resize; a sub-window of the output gives the same samples as resizing
// fully and cropping afterwards (torchvision's Resize + CenterCrop).
struct AxisPlan {
  int ksize = 0;
  bool identity = false;                   // PIL skips such a pass; so do we
  std::vector<int> first, count;           // source taps per output sample
  std::vector<std::int32_t> weights;       // out_count x ksize, fixed point (PIL: 22 fractional bits)
  int src_begin = 0, src_end = 0;          // union of all taps: what must be decoded
  int in_size = 0, full_out = 0;           // the resize this axis belongs to (PIL's pass order depends on them)
  // Every output reads exactly `taps` samples from first[i] (zero weights pad
  // short windows, and windows at the right edge start earlier), so the
  // horizontal pass runs a fixed-length, unrollable loop. Adding in * 0 leaves
  // PIL's sums unchanged.
  int taps = 0;
  std::vector<int> first_padded;
  std::vector<std::int32_t> weights_padded;  // out_count x taps
  std::vector<std::int32_t> weights_by_tap;  // taps x out_count: the SIMD kernel's layout
  int out_count() const { return static_cast<int>(first.size()); }
};

// Pillow's resampling filters: BILINEAR (triangle, support 1) and BICUBIC
// (Keys' cubic with a = -0.5, support 2, so weights can be negative and sums
// are clipped to 0..255).
enum class Filter { Bilinear, Bicubic };

// "bilinear" | "bicubic" -> Filter; throws Error naming `what` otherwise.
Filter parse_filter(const std::string& name, const std::string& what);
const char* filter_name(Filter f);

AxisPlan plan_axis(int in_size, double box0, double box1, int full_out, int out_begin, int out_count,
                   Filter filter = Filter::Bilinear);

// Two separable passes with 8-bit rounding in between. `pil_order` runs them
// in Pillow 13's order (vertical first iff the height shrinks by more than
// twice as many pixels as the width, else horizontal first; older Pillows
// always ran horizontal first), and the result equals Image.resize bit for bit. Otherwise the pass order that does less work is chosen: when the
// image shrinks vertically, running the (vectorised) vertical pass first leaves
// fewer rows for the (scalar) horizontal pass; results then differ from PIL by
// rounding only (at most 1 per pass).
// src(0, 0) is local sample (h.src_begin, v.src_begin); dst receives
// v.out_count() rows of h.out_count() pixels, mirrored left-right when `flip`.
void resample(const codec::ImageView& src, const AxisPlan& h, const AxisPlan& v, std::uint8_t* dst,
              std::ptrdiff_t dst_stride, bool flip, bool pil_order, std::vector<std::uint8_t>& scratch,
              std::vector<std::int32_t>& accum);

}  // namespace convnets::data
