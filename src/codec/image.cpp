#include "codec/image.h"

#include "core/json.h"

#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>

namespace convnets::codec {

ImageFormat sniff_format(const std::uint8_t* data, std::size_t size) {
  static const std::uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) return ImageFormat::Jpeg;
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) return ImageFormat::Png;
  return ImageFormat::Unknown;
}

void check_image_size(const Rect& full, std::int64_t max_pixels, const std::string& name) {
  if (full.width <= 0 || full.height <= 0) {
    throw DecodeError(name + ": the header gives " + std::to_string(full.width) + "x" + std::to_string(full.height) +
                      " pixels; expected a positive width and height");
  }
  const std::int64_t pixels = std::int64_t(full.width) * full.height;
  const auto mpix = [](std::int64_t n) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f Mpixels", double(n) / 1e6);
    return std::string(text);
  };
  const std::string size = std::to_string(full.width) + "x" + std::to_string(full.height);
  if (max_pixels > 0 && pixels > max_pixels) {
    throw DecodeError(name + ": " + size + " = " + mpix(pixels) + " exceeds the limit of " + mpix(max_pixels) +
                      " (--max-image-pixels " + std::to_string(max_pixels) +
                      "); refused before decoding, as a decompression bomb or a damaged header",
                      {}, /*too_large=*/true);
  }
  if (max_pixels > 0 && pixels > max_pixels / 2) {
    // Each epoch meets the file again; one line per file is enough.
    static std::mutex mutex;
    static std::set<std::string> warned;
    std::lock_guard<std::mutex> lock(mutex);
    if (warned.size() < 1000 && warned.insert(name).second) {
      std::fprintf(stderr, "convnets: warning: %s: %s = %s, above half of --max-image-pixels %lld: decoding it takes %lld MB\n",
                   utf8_escaped(name).c_str(), size.c_str(), mpix(pixels).c_str(), static_cast<long long>(max_pixels),
                   static_cast<long long>(pixels * 3 / 1000000));
    }
  }
}

}  // namespace convnets::codec
