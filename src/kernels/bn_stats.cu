#include "kernels/bn_stats.h"

#include "kernels/convert.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace convnets::kernels::bn {
namespace {

// Eight values of T as one 16-byte load or store: NHWC rows are channels-contiguous and channels % 8 == 0.
template <typename T>
struct alignas(16) Vec8 {
  T v[8];
};

template <typename T>
__device__ inline float to_float(T v) {
  return static_cast<float>(v);
}
template <>
__device__ inline float to_float<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ inline float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

__global__ void finalize_kernel(FinalizeArgs a) {
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= a.channels) return;
  const Finalized f = finalize_channel(a.sum[c], a.sumsq[c], a.gamma[c], a.beta[c], a.running_mean[c],
                                       a.running_var[c], a.count, a.momentum, a.eps);
  a.mean[c] = f.mean, a.invstd[c] = f.invstd, a.scale[c] = f.scale, a.bias[c] = f.bias;
  a.running_mean[c] = f.running_mean, a.running_var[c] = f.running_var;
  if (a.scale_lowp) {
    if (a.lowp == Storage::Float32) {
      static_cast<float*>(a.scale_lowp)[c] = f.scale;
      static_cast<float*>(a.bias_lowp)[c] = f.bias;
    } else if (a.lowp == Storage::BFloat16) {
      static_cast<__nv_bfloat16*>(a.scale_lowp)[c] = __float2bfloat16_rn(f.scale);
      static_cast<__nv_bfloat16*>(a.bias_lowp)[c] = __float2bfloat16_rn(f.bias);
    } else {
      static_cast<__half*>(a.scale_lowp)[c] = __float2half_rn(f.scale);
      static_cast<__half*>(a.bias_lowp)[c] = __float2half_rn(f.bias);
    }
  }
}

// The elementwise kernels below share relu_backward_kernel's layout (rows x channel groups; see there): a thread's 8
// channels are fixed, so their per-channel factors are loaded once into registers. Indexed by the flat vector with
// a 64-bit modulo to find its channels and the factors reloaded per vector, dbn_apply ran at about a third of the
// H100's bandwidth (12.3 ms of a 49.6 ms ResNet-50 step at batch 256, 2026-11-27) and add_relu at about 60 %.
template <typename T>
__global__ void add_relu_kernel(AddReluArgs a) {
  const std::int64_t groups = a.channels / 8;
  const std::int64_t g = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (g >= groups) return;
  const std::int64_t c0 = g * 8;
  float scale[8], bias[8], rs[8], rb[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    scale[k] = a.scale[c0 + k], bias[k] = a.bias[c0 + k];
    rs[k] = a.res_scale ? a.res_scale[c0 + k] : 1.f, rb[k] = a.res_bias ? a.res_bias[c0 + k] : 0.f;
  }
  const auto* y = static_cast<const Vec8<T>*>(a.y);
  const auto* r = static_cast<const Vec8<T>*>(a.residual);
  auto* out = static_cast<Vec8<T>*>(a.out);
  for (std::int64_t row = blockIdx.y * static_cast<std::int64_t>(blockDim.y) + threadIdx.y; row < a.rows;
       row += static_cast<std::int64_t>(gridDim.y) * blockDim.y) {
    const std::int64_t i = row * groups + g;
    const Vec8<T> yv = y[i];
    Vec8<T> rv{};
    if (r) rv = r[i];
    Vec8<T> o;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float rk = r ? to_float(rv.v[k]) : 0.f;
      o.v[k] = convert<T>(scale_bias_add_relu(to_float(yv.v[k]), scale[k], bias[k], rk, rs[k], rb[k]));
    }
    out[i] = o;
  }
}

// Rows x channel groups: threadIdx.x picks a group of 8 channels within the block's tile, threadIdx.y and
// blockIdx.y stride over the rows. Each thread sums its rows in registers, the block adds its threads' sums in
// shared memory, and one atomic per channel and block adds that to the output.
template <typename T>
__global__ void relu_backward_kernel(ReluBackwardArgs a) {
  const std::int64_t groups = a.channels / 8;
  const std::int64_t g = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const bool with_res = a.y_res != nullptr;
  float s[8] = {}, sx[8] = {}, sr[8] = {};
  if (g < groups) {
    const std::int64_t c0 = g * 8;
    float mean[8], invstd[8], mean_r[8], invstd_r[8], ms[8], mb[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      mean[k] = a.mean[c0 + k], invstd[k] = a.invstd[c0 + k];
      mean_r[k] = with_res ? a.mean_res[c0 + k] : 0.f, invstd_r[k] = with_res ? a.invstd_res[c0 + k] : 0.f;
      ms[k] = a.out ? 0.f : a.mask_scale[c0 + k], mb[k] = a.out ? 0.f : a.mask_bias[c0 + k];
    }
    const auto* dout = static_cast<const Vec8<T>*>(a.dout);
    const auto* out = static_cast<const Vec8<T>*>(a.out);
    const auto* y = static_cast<const Vec8<T>*>(a.y);
    const auto* yr = static_cast<const Vec8<T>*>(a.y_res);
    auto* dz = static_cast<Vec8<T>*>(a.dz);
    for (std::int64_t row = blockIdx.y * static_cast<std::int64_t>(blockDim.y) + threadIdx.y; row < a.rows;
         row += static_cast<std::int64_t>(gridDim.y) * blockDim.y) {
      const std::int64_t i = row * groups + g;
      const Vec8<T> d = dout[i], yv = y[i];
      Vec8<T> o{}, r{};
      if (out) o = out[i];
      if (with_res) r = yr[i];
      Vec8<T> z;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float pre = out ? to_float(o.v[k]) : to_float(yv.v[k]) * ms[k] + mb[k];
        const float dzk = pre > 0.f ? to_float(d.v[k]) : 0.f;
        z.v[k] = convert<T>(dzk);
        s[k] += dzk;
        sx[k] += dzk * (to_float(yv.v[k]) - mean[k]) * invstd[k];
        if (with_res) sr[k] += dzk * (to_float(r.v[k]) - mean_r[k]) * invstd_r[k];
      }
      dz[i] = z;
    }
  }
  // The block's sums per channel group: threadIdx.y-major in shared memory, then added by the y == 0 threads.
  extern __shared__ float shared[];
  const int lanes = blockDim.x, depth = blockDim.y;
  float* acc = shared + (threadIdx.y * lanes + threadIdx.x) * 24;
#pragma unroll
  for (int k = 0; k < 8; ++k) acc[k] = s[k], acc[8 + k] = sx[k], acc[16 + k] = sr[k];
  __syncthreads();
  if (threadIdx.y != 0 || g >= groups) return;
  for (int t = 1; t < depth; ++t) {
    const float* other = shared + (t * lanes + threadIdx.x) * 24;
#pragma unroll
    for (int k = 0; k < 24; ++k) acc[k] += other[k];
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    atomicAdd(a.dsum + g * 8 + k, acc[k]);
    atomicAdd(a.dsum_xhat + g * 8 + k, acc[8 + k]);
    if (with_res) atomicAdd(a.dsum_xhat_res + g * 8 + k, acc[16 + k]);
  }
}

template <typename T>
__global__ void dbn_apply_kernel(DbnApplyArgs a) {
  const std::int64_t groups = a.channels / 8;
  const std::int64_t g = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (g >= groups) return;
  const std::int64_t c0 = g * 8;
  DbnCoefficients q[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const std::int64_t c = c0 + k;
    q[k] = dbn_coefficients(a.gamma[c], a.mean[c], a.invstd[c], a.dsum[c], a.dsum_xhat[c], a.count);
  }
  const auto* dz = static_cast<const Vec8<T>*>(a.dz);
  const auto* y = static_cast<const Vec8<T>*>(a.y);
  auto* dy = static_cast<Vec8<T>*>(a.dy);
  for (std::int64_t row = blockIdx.y * static_cast<std::int64_t>(blockDim.y) + threadIdx.y; row < a.rows;
       row += static_cast<std::int64_t>(gridDim.y) * blockDim.y) {
    const std::int64_t i = row * groups + g;
    const Vec8<T> d = dz[i], yv = y[i];
    Vec8<T> o;
#pragma unroll
    for (int k = 0; k < 8; ++k) o.v[k] = convert<T>(q[k].a * to_float(d.v[k]) + q[k].b * to_float(yv.v[k]) + q[k].c);
    dy[i] = o;
  }
}

// `launch` called with a value of the storage type (fp16, bf16 or fp32), then the launch's error code.
template <typename Launch>
int by_storage(Storage storage, Launch&& launch) {
  if (storage == Storage::Float16) launch(__half{});
  else if (storage == Storage::BFloat16) launch(__nv_bfloat16{});
  else launch(float{});
  return static_cast<int>(cudaGetLastError());
}

// The rows x channel-groups launch every kernel but finalize takes: up to 32 groups of 8 channels across a block's
// x (a warp reads 32 consecutive 16-byte vectors of a row, or whole short rows), 256 threads a block, and about
// `blocks` blocks in all, a few per SM on a 132-SM H100, each striding over its rows.
struct Tiling {
  dim3 grid, block;
};

Tiling row_tiling(std::int64_t rows, std::int64_t channels, std::int64_t blocks) {
  const std::int64_t groups = channels / 8;
  const int lanes = static_cast<int>(groups < 32 ? groups : 32);
  const int depth = 256 / lanes;
  const int tiles = static_cast<int>((groups + lanes - 1) / lanes);
  std::int64_t slices = blocks / tiles;
  const std::int64_t row_blocks = (rows + depth - 1) / depth;
  if (slices > row_blocks) slices = row_blocks;
  if (slices < 1) slices = 1;
  return {dim3(tiles, static_cast<unsigned>(slices)), dim3(lanes, depth)};
}

// An elementwise kernel over `a`'s rows, launched with row_tiling.
template <typename Args, typename Launch>
int elementwise(const Args& a, Launch&& launch) {
  if (a.rows * a.channels == 0) return 0;
  const Tiling t = row_tiling(a.rows, a.channels, 2048);
  return by_storage(a.storage, [&](auto tag) { launch(tag, t.grid, t.block); });
}

}  // namespace

int launch_finalize(const FinalizeArgs& a, void* stream) {
  if (a.channels == 0) return 0;
  const int threads = 128;
  finalize_kernel<<<static_cast<int>((a.channels + threads - 1) / threads), threads, 0,
                    static_cast<cudaStream_t>(stream)>>>(a);
  return static_cast<int>(cudaGetLastError());
}

int launch_scale_bias_add_relu(const AddReluArgs& a, void* stream) {
  return elementwise(a, [&](auto tag, dim3 grid, dim3 block) {
    add_relu_kernel<decltype(tag)><<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(a);
  });
}

int launch_relu_backward_reduce(const ReluBackwardArgs& a, void* stream) {
  if (a.rows * a.channels == 0) return 0;
  // About 1024 blocks: each block's rows many enough that its atomics (one per channel and block) are few.
  const Tiling t = row_tiling(a.rows, a.channels, 1024);
  const std::size_t shared = static_cast<std::size_t>(t.block.x) * t.block.y * 24 * sizeof(float);
  return by_storage(a.storage, [&](auto tag) {
    relu_backward_kernel<decltype(tag)><<<t.grid, t.block, shared, static_cast<cudaStream_t>(stream)>>>(a);
  });
}

int launch_dbn_apply(const DbnApplyArgs& a, void* stream) {
  return elementwise(a, [&](auto tag, dim3 grid, dim3 block) {
    dbn_apply_kernel<decltype(tag)><<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(a);
  });
}

}  // namespace convnets::kernels::bn
