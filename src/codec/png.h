// PNG decoding through libpng to 8-bit RGB with PIL's conversions (high byte of 16-bit, palette expanded, alpha dropped).
#pragma once

#include "codec/image.h"

#include <string>

namespace convnets::codec {

// Full decode into `out` (reused across calls). PNG has no region decode: the
// transform crops afterwards. Throws DecodeError naming `name`.
void decode_png(const std::uint8_t* data, std::size_t size, const std::string& name, Image& out);

// Width and height from the IHDR chunk, without decoding.
Rect png_size(const std::uint8_t* data, std::size_t size, const std::string& name);

}  // namespace convnets::codec
