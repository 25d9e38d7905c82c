// JPEG decoding through libjpeg-turbo: DCT-domain downscaling and region-of-interest decode to RGB.
#pragma once

#include "codec/image.h"

#include <memory>
#include <cstdint>
#include <string>
#include <vector>

namespace convnets::codec {

// A component's quantised DCT coefficients as entropy decoding leaves them.
struct JpegComponent {
  int h_samp = 1, v_samp = 1;
  int width_in_blocks = 0, height_in_blocks = 0;  // blocks that hold image data
  int array_width = 0, array_height = 0;          // blocks stored (whole MCUs)
  const std::uint16_t* quant = nullptr;           // 64 quantisation steps, natural order
};

struct JpegCoefficients {
  int width = 0, height = 0;  // full-scale image size
  int max_h = 1, max_v = 1;   // largest sampling factors (the MCU is 8*max_h x 8*max_v)
  bool ycc = false;           // components are Y, Cb, Cr (else gray, or R, G, B as stored)
  std::vector<JpegComponent> components;
};

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

  // Entropy-decodes the whole image opened by open() without any IDCT, for
  // decoders that do the rest elsewhere (the device decoder). Returns false,
  // having read nothing, for colour spaces other than gray, YCbCr and RGB
  // (CMYK, YCCK), which take decode() instead. Valid until the next open().
  bool read_coefficients(JpegCoefficients& out);
  // Copies `rows` x `cols` blocks of component `c` from block (bx, by), as
  // 64 int16 in natural order each, row by row. The range must lie within
  // the component's array_width x array_height.
  void copy_blocks(int c, int bx, int by, int cols, int rows, std::int16_t* dst) const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Decodes a whole JPEG at full scale to a packed RGB image (convenience for
// one-off uses: classify, tests).
Image decode_jpeg(const std::uint8_t* data, std::size_t size, const std::string& name);

}  // namespace convnets::codec
