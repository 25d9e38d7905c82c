// Fuzz target: JPEG/PNG headers, region decode and the transforms behind them
// (RandomResizedCrop + resize, eval resize + centre crop, augmentation), on
// arbitrary bytes with arbitrary crop parameters, the way the loader calls them.
#include "codec/jpeg.h"
#include "codec/png.h"
#include "data/transforms.h"
#include "fuzz_input.h"

#include <algorithm>
#include <vector>

using namespace convnets;

// The first kParams bytes are parameters, the rest the file: seeds are a
// fixed header followed by a real image.
constexpr std::size_t kParams = 16;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Params p(data, std::min(size, kParams));
  const int mode = p.byte() % 4;
  const int out = 1 + p.byte() % 64;  // output side: small keeps each run fast
  data::SampleData s;
  s.name = "fuzz";
  if (size > kParams) s.bytes.assign(data + kParams, data + size);
  // 8 Mpixels: the limit keeps a header that claims gigapixels (every run of
  // the fuzzer would otherwise be an allocation failure) out of the decoders,
  // as --max-image-pixels does for the CLI.
  constexpr std::int64_t kLimit = 8'000'000;
  try {
    if (mode == 0 || mode == 1) {
      auto o = mode == 0 ? data::TransformOptions::train(out) : data::TransformOptions::eval(out, 0.1 + 0.9 * p.unit());
      o.max_pixels = kLimit;
      if (mode == 0) {
        o.crop.scale_min = 0.01 + 0.99 * p.unit();
        o.random_filter = p.byte() & 1;
        o.dct_scaling = p.byte() & 1;
        const int policy = p.byte() % 4;
        o.augment = policy == 1 ? "rand-m9-mstd0.5-inc1" : policy == 2 ? "autoaugment" : "";
      } else {
        o.filter = p.byte() & 1 ? data::Filter::Bicubic : data::Filter::Bilinear;
      }
      data::Transform t(o);
      data::Workspace ws;
      data::Rng rng(p.u16(), p.byte(), p.u16());
      std::vector<std::uint8_t> dst(std::size_t(out) * out * 3);
      t.apply(s, rng, ws, dst.data(), nullptr);
    } else if (mode == 2) {
      // Region decode with any scale and rectangle, including invalid ones the
      // decoder must refuse rather than read outside its buffers.
      codec::JpegDecoder dec;
      const codec::Rect full = dec.open(s.bytes.data(), s.bytes.size(), s.name);
      codec::check_image_size(full, kLimit, s.name);
      const int num = 1 + p.byte() % 16;
      const int w = codec::JpegDecoder::scaled_size(full.width, num), h = codec::JpegDecoder::scaled_size(full.height, num);
      codec::Rect r{int(p.u16()) % (w + 2) - 1, int(p.u16()) % (h + 2) - 1, int(p.u16()) % (w + 2), int(p.u16()) % (h + 2)};
      const codec::ImageView v = dec.decode(num, r);
      volatile std::uint8_t sink = 0;
      for (int y = 0; y < v.height; ++y) sink = sink + v.row(y)[std::size_t(v.width) * v.channels - 1];
    } else {
      codec::check_image_size(codec::png_size(s.bytes.data(), s.bytes.size(), s.name), kLimit, s.name);
      codec::Image img;
      codec::decode_png(s.bytes.data(), s.bytes.size(), s.name, img);
    }
  } catch (const Error&) {
    // A refusal with a message is the expected outcome for most inputs.
  }
  return 0;
}
