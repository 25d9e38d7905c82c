#include "codec/jpeg.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <vector>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>
#include <jerror.h>

namespace convnets::codec {
namespace {

struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void on_message(j_common_ptr cinfo, int level) {
  // libjpeg fills a premature end of data with grey and only warns; PIL
  // refuses such files ("image file is truncated"), and so do we.
  if (level == -1 && cinfo->err->msg_code == JWRN_JPEG_EOF) on_error_exit(cinfo);
}

// A complete JPEG ends with EOI (FF D9). Region decoding stops after the last
// row it needs, so without this check a file cut short below the crop would
// pass as valid. Entropy-coded data never contains FF D9 (FF is stuffed), so
// finding it near the end is reliable; a little trailing junk is tolerated.
bool has_end_marker(const std::uint8_t* data, std::size_t size) {
  const std::size_t from = size > 4096 ? size - 4096 : 0;
  for (std::size_t i = size; i >= from + 2; --i)
    if (data[i - 2] == 0xff && data[i - 1] == 0xd9) return true;
  return false;
}

// PIL's CMYK -> RGB (Convert.c cmyk2rgb): r = (255-k) - c*(255-k)/255, with
// its rounding MULDIV255, so CMYK files match PIL's decode too.
inline std::uint8_t muldiv255(int a, int b) {
  const int t = a * b + 128;
  return static_cast<std::uint8_t>(((t >> 8) + t) >> 8);
}

// Padding after the pixels so the resampler's SIMD gathers may over-read.
constexpr int kSlack = 16;

}  // namespace

struct JpegDecoder::State {
  jpeg_decompress_struct cinfo{};
  ErrorManager err{};
  std::string name;
  std::vector<std::uint8_t> rows, rgb;
  std::vector<JSAMPROW> row_ptrs;
};

JpegDecoder::JpegDecoder() : s_(std::make_unique<State>()) {
  s_->cinfo.err = jpeg_std_error(&s_->err.pub);
  s_->err.pub.error_exit = on_error_exit;
  s_->err.pub.emit_message = on_message;
  if (setjmp(s_->err.jump)) throw Error(std::string("libjpeg initialisation failed: ") + s_->err.message);
  jpeg_create_decompress(&s_->cinfo);
}

JpegDecoder::~JpegDecoder() { jpeg_destroy_decompress(&s_->cinfo); }

Rect JpegDecoder::open(const std::uint8_t* data, std::size_t size, const std::string& name) {
  State& s = *s_;
  s.name = name;
  jpeg_abort_decompress(&s.cinfo);
  if (size < 4) throw DecodeError(name + ": truncated JPEG (" + std::to_string(size) + " bytes)");
  if (!has_end_marker(data, size)) throw DecodeError(name + ": truncated JPEG (no end-of-image marker)");
  if (setjmp(s.err.jump)) {
    jpeg_abort_decompress(&s.cinfo);
    throw DecodeError(name + ": corrupt JPEG: " + s.err.message);
  }
  jpeg_mem_src(&s.cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&s.cinfo, TRUE);
  const auto cs = s.cinfo.jpeg_color_space;
  if (cs != JCS_GRAYSCALE && cs != JCS_YCbCr && cs != JCS_RGB && cs != JCS_CMYK && cs != JCS_YCCK) {
    jpeg_abort_decompress(&s.cinfo);
    throw DecodeError(name + ": JPEG colour space " + std::to_string(int(cs)) +
                      " is not one of grayscale, YCbCr, RGB, CMYK, YCCK");
  }
  return {0, 0, static_cast<int>(s.cinfo.image_width), static_cast<int>(s.cinfo.image_height)};
}

ImageView JpegDecoder::decode(int scale_num, Rect region) {
  State& s = *s_;
  jpeg_decompress_struct& c = s.cinfo;
  if (setjmp(s.err.jump)) {
    jpeg_abort_decompress(&c);
    throw DecodeError(s.name + ": corrupt JPEG: " + s.err.message);
  }
  const bool cmyk = c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK;
  c.scale_num = static_cast<unsigned>(scale_num);
  c.scale_denom = 8;
  c.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;  // libjpeg-turbo expands grayscale to RGB itself
  c.dct_method = JDCT_ISLOW;                      // PIL's default, so full-scale output is identical
  c.do_fancy_upsampling = TRUE;
  jpeg_start_decompress(&c);
  const int out_w = static_cast<int>(c.output_width), out_h = static_cast<int>(c.output_height);
  if (region.x < 0 || region.y < 0 || region.width <= 0 || region.height <= 0 || region.x + region.width > out_w ||
      region.y + region.height > out_h) {
    jpeg_abort_decompress(&c);
    throw Error(s.name + ": region " + std::to_string(region.width) + "x" + std::to_string(region.height) + "+" +
                std::to_string(region.x) + "+" + std::to_string(region.y) + " is outside the " +
                std::to_string(out_w) + "x" + std::to_string(out_h) + " image");
  }
  // At the edges of a cropped scanline, fancy chroma upsampling replicates the
  // edge instead of reading the true neighbour. Decoding one iMCU (16 columns)
  // more on each side keeps the pixels we return equal to a full decode's.
  const int x0 = std::max(0, region.x - 16);
  JDIMENSION xoff = static_cast<JDIMENSION>(x0);
  JDIMENSION width = static_cast<JDIMENSION>(std::min(out_w, region.x + region.width + 16) - x0);
  if (static_cast<int>(width) < out_w) jpeg_crop_scanline(&c, &xoff, &width);
  const int comps = c.output_components;
  const std::size_t stride = std::size_t(width) * comps;
  s.rows.resize(stride * region.height + kSlack);
  s.row_ptrs.resize(region.height);
  for (int y = 0; y < region.height; ++y) s.row_ptrs[y] = s.rows.data() + y * stride;
  if (region.y > 0) jpeg_skip_scanlines(&c, static_cast<JDIMENSION>(region.y));
  const JDIMENSION end = static_cast<JDIMENSION>(region.y + region.height);
  while (c.output_scanline < end) {
    const JDIMENSION done = c.output_scanline - static_cast<JDIMENSION>(region.y);
    jpeg_read_scanlines(&c, s.row_ptrs.data() + done, end - c.output_scanline);
  }
  const bool inverted = cmyk && c.saw_Adobe_marker;  // Adobe writes CMYK inverted (PIL's "CMYK;I")
  jpeg_abort_decompress(&c);

  const int dx = region.x - static_cast<int>(xoff);
  if (!cmyk) return {s.rows.data() + dx * 3, region.width, region.height, 3, std::ptrdiff_t(stride), kSlack};
  s.rgb.resize(std::size_t(region.width) * region.height * 3 + kSlack);
  for (int y = 0; y < region.height; ++y) {
    const std::uint8_t* in = s.rows.data() + y * stride + dx * 4;
    std::uint8_t* out = s.rgb.data() + std::size_t(y) * region.width * 3;
    for (int x = 0; x < region.width; ++x, in += 4, out += 3) {
      const int k = inverted ? 255 - in[3] : in[3];
      const int nk = 255 - k;
      for (int ch = 0; ch < 3; ++ch) {
        const int v = inverted ? 255 - in[ch] : in[ch];
        out[ch] = static_cast<std::uint8_t>(nk - muldiv255(v, nk));
      }
    }
  }
  return {s.rgb.data(), region.width, region.height, 3, std::ptrdiff_t(region.width) * 3, kSlack};
}

Image decode_jpeg(const std::uint8_t* data, std::size_t size, const std::string& name) {
  JpegDecoder decoder;
  const Rect full = decoder.open(data, size, name);
  const ImageView v = decoder.decode(8, full);
  Image out;
  out.resize(v.width, v.height, 3);
  for (int y = 0; y < v.height; ++y)
    std::copy_n(v.row(y), std::size_t(v.width) * 3, out.pixels.data() + std::size_t(y) * v.width * 3);
  return out;
}

}  // namespace convnets::codec
