#include "kernels/jpeg_device.h"

#include "kernels/convert.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace convnets::kernels::jpeg {
namespace {

constexpr int kThreads = 256;

int blocks_for(std::int64_t n) {
  const std::int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 16 ? b : 65535 * 16);
}

// Which job an element belongs to: jobs are laid out by ascending first index.
template <typename Job, typename First>
__device__ int find_job(const Job* jobs, int n, std::int64_t i, First first) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first(jobs[mid]) <= i) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// One thread per 8x8 (or scaled) block: the islow IDCT keeps its 64 values in registers.
__global__ void idct_kernel(std::uint8_t* arena, BatchArgs a) {
  const auto* planes = reinterpret_cast<const PlaneJob*>(arena + a.plane_jobs);
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < a.total_blocks;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const int p = find_job(planes, a.num_planes, i, [](const PlaneJob& j) { return j.first_block; });
    idct_block(arena, planes[p], i - planes[p].first_block);
  }
}

__global__ void colour_kernel(std::uint8_t* arena, BatchArgs a) {
  const auto* jobs = reinterpret_cast<const ColourJob*>(arena + a.colour_jobs);
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < a.total_colour_pixels;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const int k = find_job(jobs, a.num_colour, i, [](const ColourJob& j) { return j.first_pixel; });
    colour_pixel(arena, jobs[k], i - jobs[k].first_pixel);
  }
}

// One thread per output pixel, in output memory order (NHWC: channels-last
// NCHW), so neighbouring threads write neighbouring bytes.
template <typename T>
__global__ void resample_kernel(const std::uint8_t* arena, BatchArgs a, T* out) {
  const auto* jobs = reinterpret_cast<const ResampleJob*>(arena + a.resample_jobs);
  const std::int64_t hw = std::int64_t(a.size) * a.size, total = hw * a.num_images;
  const bool raw = a.out_type == OutputType::Uint8;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t img = i / hw;
    const int oy = static_cast<int>((i - img * hw) / a.size), ox = static_cast<int>(i - img * hw - std::int64_t(oy) * a.size);
    std::uint8_t px[3];
    resample_pixel(arena, jobs[img], a.size, ox, oy, px);
    for (int c = 0; c < 3; ++c) out[i * 3 + c] = convert<T>(raw ? float(px[c]) : px[c] * a.scale[c] + a.bias[c]);
  }
}

}  // namespace

int launch_batch(std::uint8_t* arena, const BatchArgs& a, void* out, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.total_blocks > 0) idct_kernel<<<blocks_for(a.total_blocks), kThreads, 0, s>>>(arena, a);
  if (a.total_colour_pixels > 0) colour_kernel<<<blocks_for(a.total_colour_pixels), kThreads, 0, s>>>(arena, a);
  const std::int64_t pixels = std::int64_t(a.size) * a.size * a.num_images;
  if (pixels > 0) {
    const int g = blocks_for(pixels);
    switch (a.out_type) {
      case OutputType::Uint8: resample_kernel<<<g, kThreads, 0, s>>>(arena, a, static_cast<std::uint8_t*>(out)); break;
      case OutputType::Float32: resample_kernel<<<g, kThreads, 0, s>>>(arena, a, static_cast<float*>(out)); break;
      case OutputType::Float16: resample_kernel<<<g, kThreads, 0, s>>>(arena, a, static_cast<__half*>(out)); break;
      case OutputType::BFloat16:
        resample_kernel<<<g, kThreads, 0, s>>>(arena, a, static_cast<__nv_bfloat16*>(out));
        break;
    }
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace convnets::kernels::jpeg
