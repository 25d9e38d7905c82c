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
  jvirt_barray_ptr* coefficients = nullptr;  // from jpeg_read_coefficients, until the next open()
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
  s.coefficients = nullptr;
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

bool JpegDecoder::read_coefficients(JpegCoefficients& out) {
  State& s = *s_;
  jpeg_decompress_struct& c = s.cinfo;
  const auto cs = c.jpeg_color_space;
  const bool gray = cs == JCS_GRAYSCALE && c.num_components == 1;
  const bool three = (cs == JCS_YCbCr || cs == JCS_RGB) && c.num_components == 3;
  if (!gray && !three) return false;
  if (setjmp(s.err.jump)) {
    s.coefficients = nullptr;
    jpeg_abort_decompress(&c);
    throw DecodeError(s.name + ": corrupt JPEG: " + s.err.message);
  }
  s.coefficients = jpeg_read_coefficients(&c);
  out.width = static_cast<int>(c.image_width);
  out.height = static_cast<int>(c.image_height);
  out.max_h = c.max_h_samp_factor;
  out.max_v = c.max_v_samp_factor;
  out.ycc = cs == JCS_YCbCr;
  out.components.resize(c.num_components);
  for (int i = 0; i < c.num_components; ++i) {
    const jpeg_component_info& ci = c.comp_info[i];
    JpegComponent& o = out.components[i];
    o.h_samp = ci.h_samp_factor;
    o.v_samp = ci.v_samp_factor;
    o.width_in_blocks = static_cast<int>(ci.width_in_blocks);
    o.height_in_blocks = static_cast<int>(ci.height_in_blocks);
    // libjpeg stores whole MCUs (jdcoefct.c rounds up to the sampling factors).
    o.array_width = (o.width_in_blocks + ci.h_samp_factor - 1) / ci.h_samp_factor * ci.h_samp_factor;
    o.array_height = (o.height_in_blocks + ci.v_samp_factor - 1) / ci.v_samp_factor * ci.v_samp_factor;
    if (!ci.quant_table) throw DecodeError(s.name + ": component " + std::to_string(i) + " has no quantisation table");
    o.quant = ci.quant_table->quantval;
  }
  return true;
}

void JpegDecoder::copy_blocks(int comp, int bx, int by, int cols, int rows, std::int16_t* dst) const {
  State& s = *s_;
  jpeg_decompress_struct& c = s.cinfo;
  if (!s.coefficients) throw Error(s.name + ": copy_blocks() before read_coefficients()");
  const jpeg_component_info& ci = c.comp_info[comp];
  const int aw = (static_cast<int>(ci.width_in_blocks) + ci.h_samp_factor - 1) / ci.h_samp_factor * ci.h_samp_factor;
  const int ah = (static_cast<int>(ci.height_in_blocks) + ci.v_samp_factor - 1) / ci.v_samp_factor * ci.v_samp_factor;
  if (bx < 0 || by < 0 || cols < 0 || rows < 0 || bx + cols > aw || by + rows > ah)
    throw Error(s.name + ": blocks " + std::to_string(cols) + "x" + std::to_string(rows) + "+" + std::to_string(bx) +
                "+" + std::to_string(by) + " are outside component " + std::to_string(comp) + "'s " +
                std::to_string(aw) + "x" + std::to_string(ah) + " blocks");
  // The arrays were realised in memory by jpeg_read_coefficients; libjpeg
  // allows access to at most v_samp rows at once, so one row at a time.
  for (int r = 0; r < rows; ++r) {
    JBLOCKARRAY row = (*c.mem->access_virt_barray)(reinterpret_cast<j_common_ptr>(&c), s.coefficients[comp],
                                                   static_cast<JDIMENSION>(by + r), 1, FALSE);
    static_assert(sizeof(JCOEF) == sizeof(std::int16_t) && sizeof(JBLOCK) == 64 * sizeof(JCOEF));
    std::copy_n(reinterpret_cast<const std::int16_t*>(row[0] + bx), std::size_t(cols) * 64,
                dst + std::size_t(r) * cols * 64);
  }
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
