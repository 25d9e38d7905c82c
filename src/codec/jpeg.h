// JPEG decoding through libjpeg-turbo: DCT-domain downscaling and region-of-interest decode to RGB.
#pragma once

#include "codec/image.h"

#include <memory>
#include <string>

namespace convnets::codec {

// One decoder per thread, reused across images so libjpeg's allocations are
// made once. Usage: open() reads the header, decode() produces a region.
class JpegDecoder {
 public:
  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // Parses the headers of `data` (which must outlive decode()); returns the
  // full-scale size. `name` (the file path) goes into every error message.
  // Throws DecodeError for a corrupt or truncated file.
  Rect open(const std::uint8_t* data, std::size_t size, const std::string& name);

  // Size of the whole image when decoded at scale num/8 (libjpeg rounds up).
  static int scaled_size(int full, int num) { return static_cast<int>((static_cast<long>(full) * num + 7) / 8); }

  // Decodes `region`, given in the coordinates of the image scaled by num/8
  // (num in 1..16), to RGB. Only the iMCU columns and the rows the region
  // covers go through the IDCT; rows below it are never entropy-decoded.
  // The view points into this decoder and is valid until the next call.
  ImageView decode(int scale_num, Rect region);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Decodes a whole JPEG at full scale to a packed RGB image (convenience for
// one-off uses: classify, tests).
Image decode_jpeg(const std::uint8_t* data, std::size_t size, const std::string& name);

}  // namespace convnets::codec
