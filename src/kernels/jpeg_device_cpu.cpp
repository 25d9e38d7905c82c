#include "kernels/jpeg_device.h"

#include <cmath>

namespace convnets::kernels::jpeg {

void run_batch_cpu(std::uint8_t* arena, const BatchArgs& a, void* out) {
  const auto* planes = reinterpret_cast<const PlaneJob*>(arena + a.plane_jobs);
  for (int p = 0; p < a.num_planes; ++p) {
    const std::int64_t blocks = std::int64_t(planes[p].blocks_w) * planes[p].blocks_h;
    for (std::int64_t b = 0; b < blocks; ++b) idct_block(arena, planes[p], b);
  }
  const auto* colour = reinterpret_cast<const ColourJob*>(arena + a.colour_jobs);
  for (int k = 0; k < a.num_colour; ++k) {
    const std::int64_t pixels = std::int64_t(colour[k].width) * colour[k].height;
    for (std::int64_t i = 0; i < pixels; ++i) colour_pixel(arena, colour[k], i);
  }
  const auto* resample = reinterpret_cast<const ResampleJob*>(arena + a.resample_jobs);
  for (std::int64_t img = 0; img < a.num_images; ++img) {
    for (int oy = 0; oy < a.size; ++oy)
      for (int ox = 0; ox < a.size; ++ox) {
        std::uint8_t px[3];
        resample_pixel(arena, resample[img], a.size, ox, oy, px);
        const std::int64_t o = ((img * a.size + oy) * a.size + ox) * 3;
        for (int c = 0; c < 3; ++c) {
          if (a.out_type == OutputType::Uint8) {
            static_cast<std::uint8_t*>(out)[o + c] = px[c];
          } else {
            static_cast<float*>(out)[o + c] = px[c] * a.scale[c] + a.bias[c];
          }
        }
      }
  }
}

}  // namespace convnets::kernels::jpeg
