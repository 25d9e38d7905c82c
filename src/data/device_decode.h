// Hybrid JPEG decoding for batches: entropy decoding (libjpeg-turbo's coefficient API) on the loader's threads, IDCT, colour and the crop-resize-flip-normalise on the device.
#pragma once

#include "data/transforms.h"
#include "kernels/jpeg_device.h"

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <vector>

namespace convnets::data {

// A batch as a worker hands it over: one byte arena with every job and its
// inputs (pinned when CUDA is present, so it crosses in one asynchronous copy)
// and how large the device arena must be (the planes and RGB the kernels write
// come after the host part).
struct EncodedBatch {
  at::Tensor host;
  std::int64_t device_bytes = 0;
  kernels::jpeg::BatchArgs args;
  std::int64_t device_images = 0;    // decoded from coefficients on the device
  std::int64_t fallback_images = 0;  // rendered on the CPU (PNG, CMYK, 4:4:0, raw pixels)
};

// Builds one EncodedBatch from samples; one per loader thread, reused.
class EncodedBatchBuilder {
 public:
  EncodedBatchBuilder(const Transform& transform, int channels) : transform_(transform), channels_(channels) {}

  void reset() { count_ = 0; }
  // Makes the transform's random choices exactly as Transform::apply does
  // (same crop box and flip for the same Rng), then keeps the coefficient
  // blocks that the crop's region needs. `times->decode_s` counts the entropy
  // decoding (or the whole CPU render of a fallback sample).
  void add(const SampleData& sample, Rng& rng, Workspace& ws, TransformTimes* times);
  // The same for a plan made by the caller (Transform::plan_crop: tests).
  void add(const SampleData& sample, const SamplePlan& plan, Workspace& ws, TransformTimes* times);
  EncodedBatch finish(bool pinned);

 private:
  struct Plane {
    std::vector<std::int16_t> coef;
    std::array<std::uint16_t, 64> quant{};
    int blocks_w = 0, blocks_h = 0, s = 8;
  };
  struct Item {
    bool device = false;
    Plane planes[3];
    int num_planes = 0;
    kernels::jpeg::ColourJob colour;  // offsets filled by finish()
    std::vector<std::int32_t> xfirst, xweights, yfirst, yweights;
    int xtaps = 0, ytaps = 0;
    bool flip = false;
    std::vector<std::uint8_t> rgb;  // fallback: the CPU's S x S x 3 output
  };
  bool add_coefficients(const SampleData& sample, const SamplePlan& plan, Workspace& ws, Item& item);

  const Transform& transform_;
  int channels_;
  std::vector<Item> items_;
  std::size_t count_ = 0;
  codec::JpegCoefficients coefs_;
  std::vector<std::uint8_t> gray_;  // a 1-channel fallback render before widening to RGB
};

// Runs the device half on `device` (CUDA kernels, or the same code as host
// loops on the CPU) and returns the batch as `dtype` [B, 3, S, S] in
// channels-last memory, normalised as (x / 255 - mean) / std; or, with
// dtype uint8, the raw pixels as [B, S, S, 3] (what Loader's CPU path yields).
at::Tensor decode_on_device(const EncodedBatch& batch, at::Device device, at::ScalarType dtype,
                            const std::array<double, 3>& mean = {0, 0, 0}, const std::array<double, 3>& std = {1, 1, 1});

}  // namespace convnets::data
