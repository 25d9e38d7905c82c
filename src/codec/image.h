// Decoded-image buffers, regions and format sniffing shared by the JPEG and PNG decoders.
#pragma once

#include "core/error.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace convnets::codec {

// An integer pixel rectangle [x, x + width) x [y, y + height).
struct Rect {
  int x = 0, y = 0, width = 0, height = 0;
};

// A read-only window onto interleaved 8-bit pixels (HWC); rows may be padded.
struct ImageView {
  const std::uint8_t* data = nullptr;
  int width = 0, height = 0, channels = 0;
  std::ptrdiff_t stride = 0;  // bytes from one row to the next
  int slack = 0;              // bytes readable past the end of the last row (for SIMD gathers)
  const std::uint8_t* row(int y) const { return data + y * stride; }
};

// An owned, tightly packed HWC 8-bit image.
struct Image {
  int width = 0, height = 0, channels = 0;
  std::vector<std::uint8_t> pixels;
  void resize(int w, int h, int c) {
    width = w, height = h, channels = c;
    pixels.resize(static_cast<std::size_t>(w) * h * c);
  }
  ImageView view() const { return {pixels.data(), width, height, channels, std::ptrdiff_t(width) * channels}; }
};

enum class ImageFormat { Jpeg, Png, Unknown };

// PIL's decompression-bomb rule, the convention users know: Image.MAX_IMAGE_PIXELS
// (89,478,485, 0.25 GiB of RGBA) draws a warning, twice that an error.
constexpr std::int64_t kPilMaxImagePixels = 89'478'485;
constexpr std::int64_t kDefaultMaxImagePixels = 2 * kPilMaxImagePixels;
// --max-image-pixels, the same on every command that reads images.
constexpr const char* kMaxImagePixelsHelp =
    "refuse images above N pixels, read from the header before decoding (PIL's decompression-bomb rule: "
    "178956970; 0: no limit)";

// Checks a size read from a file's header before anything is allocated for
// its pixels: throws DecodeError naming `name` when a side is not positive or
// width x height exceeds `max_pixels` (0: no limit), and warns on stderr, once
// per file, above half of it.
void check_image_size(const Rect& full, std::int64_t max_pixels, const std::string& name);

// By magic bytes, not by file extension: a .jpg that is really a PNG still decodes.
ImageFormat sniff_format(const std::uint8_t* data, std::size_t size);

// A file that cannot be decoded (corrupt, truncated, not an image). The loader
// catches exactly this type to apply its bad-image policy; other errors stop the run.
// `too_large`: refused by the pixel limit (PIL's DecompressionBombError), not damaged.
class DecodeError : public Error {
 public:
  explicit DecodeError(const std::string& what, std::string hint = {}, bool too_large = false)
      : Error(what, std::move(hint)), too_large_(too_large) {}
  bool too_large() const { return too_large_; }

 private:
  bool too_large_;
};

}  // namespace convnets::codec
