#include "kernels/bn_stats.h"

#include <stdexcept>
#include <vector>

namespace convnets::kernels::bn {
namespace {

void require_fp32(Storage s) {
  if (s != Storage::Float32) throw std::invalid_argument("the CPU loops of kernels/bn_stats.h take fp32 storage only");
}

}  // namespace

void finalize_cpu(const FinalizeArgs& a) {
  for (std::int64_t c = 0; c < a.channels; ++c) {
    const Finalized f = finalize_channel(a.sum[c], a.sumsq[c], a.gamma[c], a.beta[c], a.running_mean[c],
                                         a.running_var[c], a.count, a.momentum, a.eps);
    a.mean[c] = f.mean, a.invstd[c] = f.invstd, a.scale[c] = f.scale, a.bias[c] = f.bias;
    a.running_mean[c] = f.running_mean, a.running_var[c] = f.running_var;
    if (a.scale_lowp) {
      require_fp32(a.lowp);
      static_cast<float*>(a.scale_lowp)[c] = f.scale, static_cast<float*>(a.bias_lowp)[c] = f.bias;
    }
  }
}

void scale_bias_add_relu_cpu(const AddReluArgs& a) {
  require_fp32(a.storage);
  const auto* y = static_cast<const float*>(a.y);
  const auto* r = static_cast<const float*>(a.residual);
  auto* out = static_cast<float*>(a.out);
  for (std::int64_t i = 0; i < a.rows * a.channels; ++i) {
    const std::int64_t c = i % a.channels;
    out[i] = scale_bias_add_relu(y[i], a.scale[c], a.bias[c], r ? r[i] : 0.f, a.res_scale ? a.res_scale[c] : 1.f,
                                 a.res_bias ? a.res_bias[c] : 0.f);
  }
}

void relu_backward_reduce_cpu(const ReluBackwardArgs& a) {
  require_fp32(a.storage);
  const auto* dout = static_cast<const float*>(a.dout);
  const auto* out = static_cast<const float*>(a.out);
  const auto* y = static_cast<const float*>(a.y);
  const auto* yr = static_cast<const float*>(a.y_res);
  auto* dz = static_cast<float*>(a.dz);
  for (std::int64_t i = 0; i < a.rows * a.channels; ++i) {
    const std::int64_t c = i % a.channels;
    const float pre = out ? out[i] : y[i] * a.mask_scale[c] + a.mask_bias[c];
    const float d = pre > 0.f ? dout[i] : 0.f;
    dz[i] = d;
    a.dsum[c] += d;
    a.dsum_xhat[c] += d * (y[i] - a.mean[c]) * a.invstd[c];
    if (yr) a.dsum_xhat_res[c] += d * (yr[i] - a.mean_res[c]) * a.invstd_res[c];
  }
}

void dbn_apply_cpu(const DbnApplyArgs& a) {
  require_fp32(a.storage);
  std::vector<DbnCoefficients> k(static_cast<std::size_t>(a.channels));
  for (std::int64_t c = 0; c < a.channels; ++c) {
    k[static_cast<std::size_t>(c)] =
        dbn_coefficients(a.gamma[c], a.mean[c], a.invstd[c], a.dsum[c], a.dsum_xhat[c], a.count);
  }
  const auto* dz = static_cast<const float*>(a.dz);
  const auto* y = static_cast<const float*>(a.y);
  auto* dy = static_cast<float*>(a.dy);
  for (std::int64_t i = 0; i < a.rows * a.channels; ++i) {
    const auto& q = k[static_cast<std::size_t>(i % a.channels)];
    dy[i] = q.a * dz[i] + q.b * y[i] + q.c;
  }
}

}  // namespace convnets::kernels::bn
