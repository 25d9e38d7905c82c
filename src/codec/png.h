// PNG decoding through libpng to 8-bit RGB with PIL's conversions (high byte of 16-bit, palette expanded, alpha dropped).
#pragma once

#include "codec/image.h"

#include <string>

namespace convnets::codec {

// Full decode into `out` (reused across calls). PNG has no region decode: the
// transform crops afterwards. Throws DecodeError naming `name`.
void decode_png(const std::uint8_t* data, std::size_t size, const std::string& name, Image& out);

// 8-bit grey (channels 1) or RGB (3) rows, tightly packed, as a PNG file (for
// image summaries). Throws std::runtime_error if libpng fails.
std::string encode_png(const std::uint8_t* pixels, int width, int height, int channels);

// Width and height from the IHDR chunk, without decoding.
Rect png_size(const std::uint8_t* data, std::size_t size, const std::string& name);

}  // namespace convnets::codec
