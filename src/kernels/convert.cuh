// Device-side float -> storage-type conversion shared by the input kernels (round to nearest for fp16/bf16).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace convnets::kernels {

template <typename T>
__device__ T convert(float v);
template <>
__device__ inline float convert<float>(float v) { return v; }
template <>
__device__ inline std::uint8_t convert<std::uint8_t>(float v) { return static_cast<std::uint8_t>(v); }
template <>
__device__ inline __half convert<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ inline __nv_bfloat16 convert<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

}  // namespace convnets::kernels
