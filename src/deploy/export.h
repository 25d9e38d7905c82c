// `convnets export` as a library call: a checkpoint's network as ONNX (float or INT8 QDQ), or its weights as safetensors with the reference implementation's key names.
#pragma once

#include "codec/image.h"

#include <cstdint>
#include <functional>
#include <string>

namespace convnets::deploy {

// The export command's flags, one field each (`--key-style` is key_style).
struct ExportOptions {
  std::string checkpoint, output, format = "safetensors", key_style = "reference", dtype = "fp32", arch;
  bool ema = false, dynamic_batch = false, fold_bn = false;
  int image_size = 0, opset = 13;
  std::int64_t batch_size = 1;
  // INT8
  bool int8 = false, reduce_range = false;
  std::string calibration, calibration_method = "percentile", activations = "uint8", silu = "ops", device = "cpu";
  std::int64_t calibration_images = 512, calibration_batch = 32, max_image_pixels = codec::kDefaultMaxImagePixels;
  int workers = 2;
  // Whether --calibration-method / --int8-activations / --int8-silu were
  // given rather than left at their defaults: a QAT checkpoint refuses them.
  bool method_given = false, activations_given = false, silu_given = false;
};

// Writes `o.output` (atomically) and returns the line that says what was
// written. `say` hears progress (the calibration set); nothing when empty.
// Throws Error naming the flag or file for a request that cannot be met,
// before anything is written.
std::string export_checkpoint(const ExportOptions& o, const std::function<void(const std::string&)>& say = {});

}  // namespace convnets::deploy
