// CONVNETS_HD: a function the CUDA kernels and their CPU loops share (host and device under nvcc, inline elsewhere).
#pragma once

#if defined(__CUDACC__)
#define CONVNETS_HD __host__ __device__ __forceinline__
#else
#define CONVNETS_HD inline
#endif
