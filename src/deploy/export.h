// `convnets export` as a library call: a checkpoint's network as ONNX (float or INT8 QDQ), as a Triton model repository entry, or its weights as safetensors with the reference implementation's key names.
#pragma once

#include "codec/image.h"
#include "deploy/triton_repo.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace convnets::deploy {

// The export command's flags, one field each (`--key-style` is key_style).
struct ExportOptions {
  std::string checkpoint, output, format = "safetensors", key_style = "reference", dtype = "fp32", arch;
  std::string key_layout = "auto";  // how a plain weights file names its tensors (options::key_layout)
  bool ema = false, dynamic_batch = false, fold_bn = false;
  int image_size = 0, opset = 13;
  std::int64_t batch_size = 1;
  // INT8
  bool int8 = false, reduce_range = false;
  std::string calibration, device = "cpu";
  // Unset: percentile, uint8 and ops, or a QAT checkpoint's own, which
  // refuses any that is set.
  std::optional<std::string> calibration_method, activations, silu;
  std::int64_t calibration_images = 512, calibration_batch = 32, max_image_pixels = codec::kDefaultMaxImagePixels;
  int workers = 2;
  // --format triton: -o is the repository folder; the entry is OUTPUT/NAME/{config.pbtxt,labels.txt,1/model.onnx}
  // (name empty: the arch's).
  TritonSettings triton;
};

// Writes `o.output` (atomically) and returns the line that says what was
// written. `say` hears progress (the calibration set); nothing when empty.
// Throws Error naming the flag or file for a request that cannot be met,
// before anything is written.
std::string export_checkpoint(const ExportOptions& o, const std::function<void(const std::string&)>& say = {});

}  // namespace convnets::deploy
