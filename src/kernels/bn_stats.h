// The per-channel arithmetic of a ResNet bottleneck whose BN statistics come from its convolutions (MLPerf's NormConv, Paddle's fused_resunit): a BN finalised from a conv's sums, the block's closing scale+bias+add+ReLU, its backward reductions and BN's backward applied; per-element functions the CUDA kernels and their CPU loops share; no torch headers.
#pragma once

#include "kernels/host_device.h"

#include <cmath>
#include <cstdint>

namespace convnets::kernels::bn {

// Activations are NHWC: `rows` = N*H*W rows of `channels` values, channels a multiple of 8 (one 16-byte vector of
// fp16/bf16 per thread). Per-channel values are fp32.
enum class Storage : std::int32_t { Float32 = 0, Float16 = 1, BFloat16 = 2 };

// ---- finalize: a BN's batch statistics from the sum and sum of squares of its input, as cuDNN's genstats +
// bn_finalize give them. nn.BatchNorm2d's semantics: normalised by the biased variance, the running variance
// updated with the unbiased one (count / (count - 1)), momentum as PyTorch's (running = (1 - m) running + m batch).
struct Finalized {
  float mean, invstd;  // of the batch
  float scale, bias;   // the normalisation as one affine map: bn(y) = y * scale + bias
  float running_mean, running_var;
};

CONVNETS_HD Finalized finalize_channel(float sum, float sumsq, float gamma, float beta, float running_mean,
                                       float running_var, float count, float momentum, float eps) {
  Finalized f;
  f.mean = sum / count;
  // E[y^2] - E[y]^2 in fp32, as the conv epilogue's statistics allow; clamped: rounding can take it below 0.
  float var = sumsq / count - f.mean * f.mean;
  var = var > 0.f ? var : 0.f;
  f.invstd = 1.f / sqrtf(var + eps);
  f.scale = gamma * f.invstd;
  f.bias = beta - f.mean * f.scale;
  const float unbiased = count > 1.f ? var * count / (count - 1.f) : var;
  f.running_mean = (1.f - momentum) * running_mean + momentum * f.mean;
  f.running_var = (1.f - momentum) * running_var + momentum * unbiased;
  return f;
}

struct FinalizeArgs {
  const float *sum = nullptr, *sumsq = nullptr, *gamma = nullptr, *beta = nullptr;
  float *running_mean = nullptr, *running_var = nullptr;  // updated in place
  float *mean = nullptr, *invstd = nullptr, *scale = nullptr, *bias = nullptr;
  // The scale and bias again in the activations' storage, for the next convolution's prologue (null: not wanted).
  void *scale_lowp = nullptr, *bias_lowp = nullptr;
  Storage lowp = Storage::Float16;
  std::int64_t channels = 0;
  float count = 0, momentum = 0.1f, eps = 1e-5f;
};

// ---- The block's end: out = relu(y * scale + bias + residual), the residual either the block's input
// (res_scale null) or the downsample conv's output through its own BN (res_scale, res_bias); with no residual at
// all, relu(y * scale + bias): a BN and its ReLU applied, where a convolution cannot take them as its prologue.
CONVNETS_HD float scale_bias_add_relu(float y, float scale, float bias, float r, float r_scale, float r_bias) {
  const float v = y * scale + bias + r * r_scale + r_bias;
  return v > 0.f ? v : 0.f;
}

struct AddReluArgs {
  const void* y = nullptr;
  const float *scale = nullptr, *bias = nullptr;
  const void* residual = nullptr;                         // null: none
  const float *res_scale = nullptr, *res_bias = nullptr;  // null: the residual is added as it is
  void* out = nullptr;
  Storage storage = Storage::Float16;
  std::int64_t rows = 0, channels = 0;
};

// ---- Its backward: dz = dout where out > 0 (the ReLU's mask, read from its output), and per channel the sums
// BN's backward needs: sum(dz), sum(dz * xhat) with xhat = (y - mean) * invstd, and the same xhat-weighted sum for
// the downsample branch's BN, which receives the same dz. With out null the mask is recomputed from y instead,
// where y * mask_scale + mask_bias > 0 (a BN+ReLU inside the branch, whose output was never stored).
struct ReluBackwardArgs {
  const void *dout = nullptr, *out = nullptr, *y = nullptr;
  const float *mask_scale = nullptr, *mask_bias = nullptr;
  const float *mean = nullptr, *invstd = nullptr;
  const void* y_res = nullptr;  // null: no second BN on the residual
  const float *mean_res = nullptr, *invstd_res = nullptr;
  void* dz = nullptr;
  float *dsum = nullptr, *dsum_xhat = nullptr, *dsum_xhat_res = nullptr;  // accumulated into: zero them first
  Storage storage = Storage::Float16;
  std::int64_t rows = 0, channels = 0;
};

// ---- BN's backward through its batch statistics, applied: dy = gamma * invstd * (dz - sum(dz) / n
// - xhat * sum(dz * xhat) / n), written as dy = a * dz + b * y + c with per-channel a, b, c (Ioffe & Szegedy 2015,
// the gradient of the normalisation; the form cuDNN's dbn_weight gives its coefficients in).
struct DbnCoefficients {
  float a, b, c;
};

CONVNETS_HD DbnCoefficients dbn_coefficients(float gamma, float mean, float invstd, float dsum, float dsum_xhat,
                                             float count) {
  DbnCoefficients k;
  k.a = gamma * invstd;
  k.b = -k.a * invstd * dsum_xhat / count;
  k.c = -k.a * dsum / count - k.b * mean;
  return k;
}

struct DbnApplyArgs {
  const void *dz = nullptr, *y = nullptr;
  const float *gamma = nullptr, *mean = nullptr, *invstd = nullptr, *dsum = nullptr, *dsum_xhat = nullptr;
  void* dy = nullptr;
  Storage storage = Storage::Float16;
  std::int64_t rows = 0, channels = 0;
  float count = 0;
};

// The CUDA kernels, enqueued on `stream` (a cudaStream_t); each returns the launch's CUDA error code (0: success).
int launch_finalize(const FinalizeArgs& a, void* stream);
int launch_scale_bias_add_relu(const AddReluArgs& a, void* stream);
int launch_relu_backward_reduce(const ReluBackwardArgs& a, void* stream);
int launch_dbn_apply(const DbnApplyArgs& a, void* stream);

// The same on the CPU, for fp32 storage only: what the tests check the arithmetic with (bn_stats_cpu.cpp).
void finalize_cpu(const FinalizeArgs& a);
void scale_bias_add_relu_cpu(const AddReluArgs& a);
void relu_backward_reduce_cpu(const ReluBackwardArgs& a);
void dbn_apply_cpu(const DbnApplyArgs& a);

}  // namespace convnets::kernels::bn
