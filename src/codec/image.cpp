#include "codec/image.h"

#include <cstring>

namespace convnets::codec {

ImageFormat sniff_format(const std::uint8_t* data, std::size_t size) {
  static const std::uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) return ImageFormat::Jpeg;
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) return ImageFormat::Png;
  return ImageFormat::Unknown;
}

}  // namespace convnets::codec
