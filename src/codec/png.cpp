#include "codec/png.h"

#include <png.h>

#include <cstring>
#include <stdexcept>
#include <vector>

namespace convnets::codec {
namespace {

struct Reader {
  const std::uint8_t* data;
  std::size_t size, pos;
  char message[256];
};

void on_read(png_structp png, png_bytep out, png_size_t n) {
  auto* r = static_cast<Reader*>(png_get_io_ptr(png));
  if (r->size - r->pos < n) png_error(png, "file ends inside a chunk (truncated)");
  std::memcpy(out, r->data + r->pos, n);
  r->pos += n;
}

[[noreturn]] void on_error(png_structp png, png_const_charp msg) {
  auto* r = static_cast<Reader*>(png_get_error_ptr(png));
  std::snprintf(r->message, sizeof r->message, "%s", msg);
  png_longjmp(png, 1);
}

void on_warning(png_structp, png_const_charp) {}  // ancillary-chunk trouble does not spoil the pixels

void on_write(png_structp png, png_bytep data, png_size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<const char*>(data), n);
}

void on_flush(png_structp) {}

}  // namespace

std::string encode_png(const std::uint8_t* pixels, int width, int height, int channels) {
  Reader errors{nullptr, 0, 0, {}};
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &errors, on_error, on_warning);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!info) {
    png_destroy_write_struct(&png, nullptr);
    throw std::runtime_error("encode_png: out of memory");
  }
  std::string out;
  std::vector<png_const_bytep> rows(static_cast<std::size_t>(height));
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw std::runtime_error(std::string("encode_png: ") + errors.message);
  }
  png_set_write_fn(png, &out, on_write, on_flush);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8,
               channels == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  for (int y = 0; y < height; ++y) {
    rows[static_cast<std::size_t>(y)] = pixels + static_cast<std::size_t>(y) * static_cast<std::size_t>(width) * channels;
  }
  png_write_info(png, info);
  png_write_image(png, const_cast<png_bytepp>(rows.data()));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

Rect png_size(const std::uint8_t* data, std::size_t size, const std::string& name) {
  if (size < 24 || sniff_format(data, size) != ImageFormat::Png || std::memcmp(data + 12, "IHDR", 4) != 0)
    throw DecodeError(name + ": not a PNG (no IHDR chunk at the start)");
  auto be32 = [&](std::size_t at) {
    return (std::uint32_t(data[at]) << 24) | (std::uint32_t(data[at + 1]) << 16) | (std::uint32_t(data[at + 2]) << 8) |
           data[at + 3];
  };
  const std::uint32_t w = be32(16), h = be32(20);
  // The PNG specification's range (1 .. 2^31 - 1): anything else is a damaged header.
  if (w == 0 || h == 0 || w > 0x7fffffffu || h > 0x7fffffffu) {
    throw DecodeError(name + ": IHDR gives " + std::to_string(w) + "x" + std::to_string(h) +
                      " pixels; expected each side in 1 .. 2^31-1");
  }
  return {0, 0, int(w), int(h)};
}

void decode_png(const std::uint8_t* data, std::size_t size, const std::string& name, Image& out) {
  png_size(data, size, name);  // validates the signature and IHDR position
  Reader reader{data, size, 0, {}};
  // Freed on every way out: libpng's errors (longjmp, then a throw) and a
  // C++ exception such as bad_alloc from the buffers below.
  struct Structs {
    png_structp png = nullptr;
    png_infop info = nullptr;
    ~Structs() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
  } s;
  s.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &reader, on_error, on_warning);
  if (!s.png) throw Error("libpng initialisation failed");
  png_structp png = s.png;
  png_infop info = s.info = png_create_info_struct(png);
  std::vector<png_bytep> rows;
  std::vector<std::uint8_t> raw;
  if (!info) throw Error("libpng initialisation failed");
  if (setjmp(png_jmpbuf(png))) throw DecodeError(name + ": corrupt PNG: " + reader.message);
  png_set_read_fn(png, &reader, on_read);
  png_read_info(png, info);
  const int color = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
  // PIL keeps the high byte of 16-bit samples and ignores gAMA/tRNS when
  // converting to RGB; the same transforms here keep decodes identical.
  if (depth == 16) png_set_strip_16(png);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if ((color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) && depth < 8)
    png_set_expand_gray_1_2_4_to_8(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const int w = static_cast<int>(png_get_image_width(png, info));
  const int h = static_cast<int>(png_get_image_height(png, info));
  const int channels = png_get_channels(png, info);
  const std::size_t rowbytes = png_get_rowbytes(png, info);
  if (png_get_bit_depth(png, info) != 8 || channels < 1 || channels > 4 || rowbytes != std::size_t(w) * channels)
    png_error(png, "unsupported sample layout after expansion");
  raw.resize(rowbytes * h);
  rows.resize(h);
  for (int y = 0; y < h; ++y) rows[y] = raw.data() + y * rowbytes;
  png_read_image(png, rows.data());

  // Gray replicates to RGB; an alpha channel (including palette tRNS that
  // libpng expanded) is dropped, as PIL's convert("RGB") does.
  out.resize(w, h, 3);
  const std::size_t n = std::size_t(w) * h;
  const std::uint8_t* in = raw.data();
  std::uint8_t* o = out.pixels.data();
  switch (channels) {
    case 1:
      for (std::size_t i = 0; i < n; ++i, o += 3) o[0] = o[1] = o[2] = in[i];
      break;
    case 2:
      for (std::size_t i = 0; i < n; ++i, o += 3) o[0] = o[1] = o[2] = in[2 * i];
      break;
    case 3:
      std::memcpy(o, in, n * 3);
      break;
    default:
      for (std::size_t i = 0; i < n; ++i, o += 3, in += 4) o[0] = in[0], o[1] = in[1], o[2] = in[2];
  }
}

}  // namespace convnets::codec
