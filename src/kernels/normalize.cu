#include "kernels/normalize.h"

#include "kernels/convert.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace convnets::kernels {
namespace {

struct Affine {
  float scale[3], bias[3];
};

// One thread per output element, walking the output in its memory order so
// the writes (2-4x the bytes of the reads) coalesce; the reads of one pixel's
// channels share a cache line.
template <typename T, bool ChannelsLast>
__global__ void normalize_kernel(const std::uint8_t* __restrict__ src, T* __restrict__ dst, std::int64_t n,
                                 std::int64_t h, std::int64_t w, int channels, Affine a) {
  const std::int64_t hw = h * w, total = n * 3 * hw;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t pixel;  // n * hw + y * w + x
    int c;
    if (ChannelsLast) {
      pixel = i / 3;
      c = static_cast<int>(i - pixel * 3);
    } else {
      const std::int64_t plane = i / hw;  // n * 3 + c
      c = static_cast<int>(plane % 3);
      pixel = (plane / 3) * hw + (i - plane * hw);
    }
    // Grayscale feeds a 3-channel network as R = G = B.
    const float v = static_cast<float>(src[pixel * channels + (channels == 1 ? 0 : c)]);
    dst[i] = convert<T>(v * a.scale[c] + a.bias[c]);
  }
}

template <typename T>
cudaError_t launch(const NormalizeArgs& args, cudaStream_t stream) {
  const std::int64_t total = args.n * 3 * args.h * args.w;
  if (total == 0) return cudaSuccess;
  const int threads = 256;
  const std::int64_t wanted = (total + threads - 1) / threads;
  const int blocks = static_cast<int>(wanted < 65535 * 8 ? wanted : 65535 * 8);
  Affine a{};
  for (int c = 0; c < 3; ++c) a.scale[c] = args.scale[c], a.bias[c] = args.bias[c];
  auto* dst = static_cast<T*>(args.dst);
  if (args.channels_last) {
    normalize_kernel<T, true><<<blocks, threads, 0, stream>>>(args.src, dst, args.n, args.h, args.w, args.channels, a);
  } else {
    normalize_kernel<T, false><<<blocks, threads, 0, stream>>>(args.src, dst, args.n, args.h, args.w, args.channels, a);
  }
  return cudaGetLastError();
}

}  // namespace

int launch_normalize(const NormalizeArgs& args, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (args.dtype) {
    case InputDtype::Float16: return static_cast<int>(launch<__half>(args, s));
    case InputDtype::BFloat16: return static_cast<int>(launch<__nv_bfloat16>(args, s));
    default: return static_cast<int>(launch<float>(args, s));
  }
}

const char* cuda_error_name(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace convnets::kernels
