// One-pass CUDA conversion of a uint8 NHWC image batch to the network's normalised input (dtype, layout); no torch headers, so nvcc builds it alone.
#pragma once

#include <cstdint>

namespace convnets::kernels {

enum class InputDtype { Float32, Float16, BFloat16 };

struct NormalizeArgs {
  const std::uint8_t* src = nullptr;  // [n, h, w, channels] contiguous, channels 1 or 3
  void* dst = nullptr;                // [n, 3, h, w]: NHWC memory if channels_last, else NCHW
  std::int64_t n = 0, h = 0, w = 0;
  int channels = 3;
  bool channels_last = true;
  InputDtype dtype = InputDtype::Float32;
  float scale[3] = {1, 1, 1};  // out = in * scale[c] + bias[c]
  float bias[3] = {0, 0, 0};
};

// Enqueues the kernel on `stream` (a cudaStream_t). Returns the CUDA error
// code of the launch (0: cudaSuccess).
int launch_normalize(const NormalizeArgs& args, void* stream);
const char* cuda_error_name(int code);

}  // namespace convnets::kernels
