// Pillow's operations on 8-bit images that the augmentation policies apply (affine and rotate, the ImageOps and ImageEnhance ops), reproduced bit for bit from Pillow's C and Python sources.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace convnets::data {

// A contiguous uint8 image, channels interleaved (HWC), 1 or 3 channels.
struct ImageRef {
  std::uint8_t* data = nullptr;
  int width = 0, height = 0, channels = 3;
  std::size_t bytes() const { return std::size_t(width) * height * channels; }
};

using Fill = std::array<std::uint8_t, 3>;

// Pillow's Image.transform filters (Geometry.c). Their BICUBIC is the a = -1
// cubic, not resize's a = -0.5.
enum class Resample { Nearest, Bilinear, Bicubic };

// Pillow 13's operations on 8-bit images, reproduced from its C and Python
// sources (Geometry.c, Blend.c, Filter.c, Convert.c, ImageOps.py,
// ImageEnhance.py): the same double/float32 arithmetic, truncations and
// borders, so results equal Pillow's exactly. `scratch` is reused storage.
namespace pil {
// Image.transform(size, AFFINE, a, resample, fillcolor): a maps output pixel
// centres to source coordinates; points outside the source get `fill`.
void affine(ImageRef img, const std::array<double, 6>& a, Resample r, const Fill& fill,
            std::vector<std::uint8_t>& scratch);
// Image.rotate(degrees, resample, fillcolor=fill): counter-clockwise about the centre, no expand.
void rotate(ImageRef img, double degrees, Resample r, const Fill& fill, std::vector<std::uint8_t>& scratch);
void auto_contrast(ImageRef img);              // ImageOps.autocontrast(img)
void equalize(ImageRef img);                   // ImageOps.equalize(img)
void invert(ImageRef img);                     // ImageOps.invert(img)
void posterize(ImageRef img, int bits);        // ImageOps.posterize; 0 bits gives black, as Pillow <= 9.5
void solarize(ImageRef img, double threshold); // ImageOps.solarize(img, threshold)
void solarize_add(ImageRef img, int add, int threshold = 128);  // timm's solarize_add
// ImageEnhance.{Color, Contrast, Brightness, Sharpness}(img).enhance(factor).
void color(ImageRef img, double factor, std::vector<std::uint8_t>& scratch);
void contrast(ImageRef img, double factor, std::vector<std::uint8_t>& scratch);
void brightness(ImageRef img, double factor, std::vector<std::uint8_t>& scratch);
void sharpness(ImageRef img, double factor, std::vector<std::uint8_t>& scratch);
}  // namespace pil

}  // namespace convnets::data
