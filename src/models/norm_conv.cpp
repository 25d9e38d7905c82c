#include "models/norm_conv.h"

#include "core/error.h"
#include "kernels/bn_stats.h"
#include "models/cudnn_graphs.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/torch.h>

#include <memory>
#include <tuple>

namespace convnets::models::norm_conv {
namespace {

// ---- The primitives ---------------------------------------------------------------------------------------------

struct ConvArgs {
  std::int64_t stride = 1, pad = 0;
};

// One BN finalised from its input's sums: the batch statistics and the normalisation as one affine map (fp32), and
// that map again in the activations' dtype for the next convolution's prologue.
struct Stats {
  at::Tensor mean, invstd, scale, bias, scale_lowp, bias_lowp;
};

struct Reduced {
  at::Tensor dz, dsum, dsum_xhat, dsum_xhat_res;
};

class Ops {
 public:
  virtual ~Ops() = default;
  // y = conv(prologue ? relu(x * scale + bias) : x, w), with sum(y) and sum(y^2) per channel (fp32).
  virtual std::tuple<at::Tensor, at::Tensor, at::Tensor> conv_stats(const at::Tensor& x, const at::Tensor& w,
                                                                    const ConvArgs& c, const Stats* prologue) = 0;
  // The batch statistics of `count` values per channel; the BN's running statistics updated in place.
  virtual Stats finalize(const at::Tensor& sum, const at::Tensor& sumsq, double count, BatchNorm2dImpl& bn,
                         at::ScalarType lowp) = 0;
  // relu(y * s.scale + s.bias + (res ? r * res.scale + res.bias : r)).
  virtual at::Tensor add_relu(const at::Tensor& y, const Stats& s, const at::Tensor& r, const Stats* res) = 0;
  // dz = dout where out > 0; sum(dz), sum(dz * xhat(y)) and, with a second BN on the residual, sum(dz * xhat(y_res)).
  virtual Reduced relu_backward(const at::Tensor& dout, const at::Tensor& out, const at::Tensor& y, const Stats& s,
                                const at::Tensor& y_res, const Stats* res) = 0;
  // BN's backward through its batch statistics: dy from dz.
  virtual at::Tensor dbn_apply(const at::Tensor& dz, const at::Tensor& y, const Stats& s, const at::Tensor& gamma,
                               const at::Tensor& dsum, const at::Tensor& dsum_xhat, double count) = 0;
  // The conv's dgrad of dy (its input is relu(bn(y))), through that ReLU: dz, and BN's two sums over y.
  virtual Reduced dgrad_drelu_dbn(const at::Tensor& dy, const at::Tensor& w, const ConvArgs& c, const at::Tensor& y,
                                  const Stats& s, const at::Tensor& gamma, const at::Tensor& beta) = 0;
  // The conv's dgrad of dy, shaped as `input`.
  virtual at::Tensor dgrad(const at::Tensor& dy, const at::Tensor& w, const ConvArgs& c, const at::Tensor& input) = 0;
  // The filters' gradient (the weight's dtype), the conv's input being relu(x * scale + bias) or x itself.
  virtual at::Tensor wgrad(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const ConvArgs& c,
                           const Stats* prologue) = 0;
};

at::Tensor per_channel(const at::Tensor& v) { return v.view({1, -1, 1, 1}); }

at::Tensor convolution_grad(const at::Tensor& dy, const at::Tensor& input, const at::Tensor& w, const ConvArgs& c,
                            bool input_grad) {
  auto grads = at::convolution_backward(dy, input, w, std::nullopt, {c.stride, c.stride}, {c.pad, c.pad}, {1, 1}, false,
                                        {0, 0}, 1, {input_grad, !input_grad, false});
  return input_grad ? std::get<0>(grads) : std::get<1>(grads);
}

// ATen's ops, in the tensors' own dtype: the arithmetic of the decomposition, checked on the CPU in fp64 against
// autograd through the plain modules (tests/test_models.cpp).
class AtenOps : public Ops {
 public:
  std::tuple<at::Tensor, at::Tensor, at::Tensor> conv_stats(const at::Tensor& x, const at::Tensor& w,
                                                            const ConvArgs& c, const Stats* p) override {
    const auto in = p ? at::relu(x * per_channel(p->scale).to(x.scalar_type()) + per_channel(p->bias).to(x.scalar_type())) : x;
    auto y = at::conv2d(in, w.to(x.scalar_type()), {}, {c.stride, c.stride}, {c.pad, c.pad});
    // Statistics in fp32 (fp64 for fp64 activations), as the conv epilogue keeps them.
    const auto yf = y.to(x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
    return {y, yf.sum({0, 2, 3}), yf.square().sum({0, 2, 3})};
  }

  Stats finalize(const at::Tensor& sum, const at::Tensor& sumsq, double count, BatchNorm2dImpl& bn,
                 at::ScalarType lowp) override {
    torch::NoGradGuard no_grad;
    const double m = bn.options.momentum().value_or(0.1), eps = bn.options.eps();
    Stats s;
    s.mean = sum / count;
    const auto var = (sumsq / count - s.mean.square()).clamp_min(0);
    s.invstd = (var + eps).rsqrt();
    const auto gamma = bn.weight.to(sum.scalar_type()), beta = bn.bias.to(sum.scalar_type());
    s.scale = gamma * s.invstd;
    s.bias = beta - s.mean * s.scale;
    bn.running_mean.mul_(1 - m).add_(s.mean.to(bn.running_mean.scalar_type()), m);
    bn.running_var.mul_(1 - m).add_((var * (count > 1 ? count / (count - 1) : 1.0)).to(bn.running_var.scalar_type()), m);
    s.scale_lowp = s.scale.to(lowp);
    s.bias_lowp = s.bias.to(lowp);
    return s;
  }

  at::Tensor add_relu(const at::Tensor& y, const Stats& s, const at::Tensor& r, const Stats* res) override {
    const auto t = y.scalar_type();
    auto v = y * per_channel(s.scale).to(t) + per_channel(s.bias).to(t);
    v = res ? v + r * per_channel(res->scale).to(t) + per_channel(res->bias).to(t) : v + r;
    return at::relu(v);
  }

  Reduced relu_backward(const at::Tensor& dout, const at::Tensor& out, const at::Tensor& y, const Stats& s,
                        const at::Tensor& y_res, const Stats* res) override {
    Reduced r;
    r.dz = dout * (out > 0).to(dout.scalar_type());
    const auto dz = r.dz.to(s.mean.scalar_type());
    r.dsum = dz.sum({0, 2, 3});
    r.dsum_xhat = (dz * xhat(y, s)).sum({0, 2, 3});
    if (res) r.dsum_xhat_res = (dz * xhat(y_res, *res)).sum({0, 2, 3});
    return r;
  }

  at::Tensor dbn_apply(const at::Tensor& dz, const at::Tensor& y, const Stats& s, const at::Tensor& gamma,
                       const at::Tensor& dsum, const at::Tensor& dsum_xhat, double count) override {
    const auto g = gamma.to(s.mean.scalar_type());
    const auto dy = per_channel(g * s.invstd) *
                    (dz.to(s.mean.scalar_type()) - per_channel(dsum) / count - xhat(y, s) * per_channel(dsum_xhat) / count);
    return dy.to(dz.scalar_type());
  }

  Reduced dgrad_drelu_dbn(const at::Tensor& dy, const at::Tensor& w, const ConvArgs& c, const at::Tensor& y,
                          const Stats& s, const at::Tensor& gamma, const at::Tensor& beta) override {
    const auto da = dgrad(dy, w, c, y);
    // The ReLU's mask, recomputed as the cuDNN graph recomputes it: gamma * xhat + beta > 0.
    const auto z = xhat(y, s) * per_channel(gamma.to(s.mean.scalar_type())) + per_channel(beta.to(s.mean.scalar_type()));
    Reduced r;
    r.dz = da * (z > 0).to(da.scalar_type());
    const auto dz = r.dz.to(s.mean.scalar_type());
    r.dsum = dz.sum({0, 2, 3});
    r.dsum_xhat = (dz * xhat(y, s)).sum({0, 2, 3});
    return r;
  }

  at::Tensor dgrad(const at::Tensor& dy, const at::Tensor& w, const ConvArgs& c, const at::Tensor& input) override {
    return convolution_grad(dy, input, w.to(dy.scalar_type()), c, true);
  }

  at::Tensor wgrad(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const ConvArgs& c,
                   const Stats* p) override {
    const auto t = x.scalar_type();
    const auto in = p ? at::relu(x * per_channel(p->scale).to(t) + per_channel(p->bias).to(t)) : x;
    return convolution_grad(dy, in, w.to(t), c, false).to(w.scalar_type());
  }

 private:
  static at::Tensor xhat(const at::Tensor& y, const Stats& s) {
    return (y.to(s.mean.scalar_type()) - per_channel(s.mean)) * per_channel(s.invstd);
  }
};

kernels::bn::Storage storage_of(at::ScalarType t) {
  return t == at::kBFloat16 ? kernels::bn::Storage::BFloat16
         : t == at::kHalf  ? kernels::bn::Storage::Float16
                           : kernels::bn::Storage::Float32;
}

void launched(int code, const char* what) {
  if (code != 0) {
    throw Error(std::string("norm_conv: the ") + what + " kernel did not launch: " +
                cudaGetErrorString(static_cast<cudaError_t>(code)));
  }
}

void* stream() { return at::cuda::getCurrentCUDAStream().stream(); }

ConvGeometry geometry(const at::Tensor& x, const at::Tensor& w, const ConvArgs& c) {
  return ConvGeometry::of(x.sizes(), w.sizes(), c.stride, c.pad, x.scalar_type());
}

std::int64_t rows(const at::Tensor& t) { return t.size(0) * t.size(2) * t.size(3); }

// cuDNN's graphs for the convolutions (cudnn_graphs.h), the project's kernels for the per-channel arithmetic
// (kernels/bn_stats.h), ATen (cuDNN underneath) for the plain dgrad and wgrad of the block's first convolutions.
class CudnnOps : public Ops {
 public:
  std::tuple<at::Tensor, at::Tensor, at::Tensor> conv_stats(const at::Tensor& x, const at::Tensor& w,
                                                            const ConvArgs& c, const Stats* p) override {
    const auto wl = lowp_weight(w, x.scalar_type());
    const auto g = geometry(x, wl, c);
    auto y = at::empty({g.n, g.k, g.out_h(), g.out_w()}, x.options(), at::MemoryFormat::ChannelsLast);
    auto sum = at::empty({g.k}, x.options().dtype(at::kFloat)), sumsq = at::empty_like(sum);
    conv_genstats(g, p != nullptr, x, wl, p ? p->scale_lowp : at::Tensor(), p ? p->bias_lowp : at::Tensor(), y, sum,
                  sumsq);
    return {y, sum, sumsq};
  }

  Stats finalize(const at::Tensor& sum, const at::Tensor& sumsq, double count, BatchNorm2dImpl& bn,
                 at::ScalarType lowp) override {
    Stats s;
    s.mean = at::empty_like(sum), s.invstd = at::empty_like(sum), s.scale = at::empty_like(sum);
    s.bias = at::empty_like(sum);
    s.scale_lowp = at::empty_like(sum, sum.options().dtype(lowp)), s.bias_lowp = at::empty_like(s.scale_lowp);
    kernels::bn::FinalizeArgs a;
    a.sum = sum.data_ptr<float>(), a.sumsq = sumsq.data_ptr<float>();
    a.gamma = bn.weight.data_ptr<float>(), a.beta = bn.bias.data_ptr<float>();
    a.running_mean = bn.running_mean.data_ptr<float>(), a.running_var = bn.running_var.data_ptr<float>();
    a.mean = s.mean.data_ptr<float>(), a.invstd = s.invstd.data_ptr<float>();
    a.scale = s.scale.data_ptr<float>(), a.bias = s.bias.data_ptr<float>();
    a.scale_lowp = s.scale_lowp.data_ptr(), a.bias_lowp = s.bias_lowp.data_ptr(), a.lowp = storage_of(lowp);
    a.channels = sum.numel();
    a.count = static_cast<float>(count);
    a.momentum = static_cast<float>(bn.options.momentum().value_or(0.1));
    a.eps = static_cast<float>(bn.options.eps());
    launched(kernels::bn::launch_finalize(a, stream()), "finalize");
    return s;
  }

  at::Tensor add_relu(const at::Tensor& y, const Stats& s, const at::Tensor& r, const Stats* res) override {
    auto out = at::empty_like(y, at::MemoryFormat::ChannelsLast);
    kernels::bn::AddReluArgs a;
    a.y = y.data_ptr(), a.scale = s.scale.data_ptr<float>(), a.bias = s.bias.data_ptr<float>();
    a.residual = r.defined() ? r.data_ptr() : nullptr;
    if (res) a.res_scale = res->scale.data_ptr<float>(), a.res_bias = res->bias.data_ptr<float>();
    a.out = out.data_ptr(), a.storage = storage_of(y.scalar_type()), a.rows = rows(y), a.channels = y.size(1);
    launched(kernels::bn::launch_scale_bias_add_relu(a, stream()), "scale-bias-add-ReLU");
    return out;
  }

  Reduced relu_backward(const at::Tensor& dout, const at::Tensor& out, const at::Tensor& y, const Stats& s,
                        const at::Tensor& y_res, const Stats* res) override {
    const auto d = dout.to(y.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
    Reduced r;
    r.dz = at::empty_like(y, at::MemoryFormat::ChannelsLast);
    auto sums = at::zeros({3, y.size(1)}, s.mean.options());  // one memset for the three accumulators
    r.dsum = sums[0], r.dsum_xhat = sums[1];
    kernels::bn::ReluBackwardArgs a;
    a.dout = d.data_ptr(), a.out = out.data_ptr(), a.y = y.data_ptr();
    a.mean = s.mean.data_ptr<float>(), a.invstd = s.invstd.data_ptr<float>();
    if (res) {
      r.dsum_xhat_res = sums[2];
      a.y_res = y_res.data_ptr(), a.mean_res = res->mean.data_ptr<float>(), a.invstd_res = res->invstd.data_ptr<float>();
      a.dsum_xhat_res = r.dsum_xhat_res.data_ptr<float>();
    }
    a.dz = r.dz.data_ptr(), a.dsum = r.dsum.data_ptr<float>(), a.dsum_xhat = r.dsum_xhat.data_ptr<float>();
    a.storage = storage_of(y.scalar_type()), a.rows = rows(y), a.channels = y.size(1);
    launched(kernels::bn::launch_relu_backward_reduce(a, stream()), "ReLU-backward reduction");
    return r;
  }

  at::Tensor dbn_apply(const at::Tensor& dz, const at::Tensor& y, const Stats& s, const at::Tensor& gamma,
                       const at::Tensor& dsum, const at::Tensor& dsum_xhat, double count) override {
    auto dy = at::empty_like(y, at::MemoryFormat::ChannelsLast);
    const auto g = gamma.contiguous();
    kernels::bn::DbnApplyArgs a;
    a.dz = dz.data_ptr(), a.y = y.data_ptr(), a.gamma = g.data_ptr<float>(), a.mean = s.mean.data_ptr<float>();
    a.invstd = s.invstd.data_ptr<float>(), a.dsum = dsum.data_ptr<float>(), a.dsum_xhat = dsum_xhat.data_ptr<float>();
    a.dy = dy.data_ptr(), a.storage = storage_of(y.scalar_type()), a.rows = rows(y), a.channels = y.size(1);
    a.count = static_cast<float>(count);
    launched(kernels::bn::launch_dbn_apply(a, stream()), "BN-backward");
    return dy;
  }

  Reduced dgrad_drelu_dbn(const at::Tensor& dy, const at::Tensor& w, const ConvArgs& c, const at::Tensor& y,
                          const Stats& s, const at::Tensor& gamma, const at::Tensor& beta) override {
    const auto wl = lowp_weight(w, y.scalar_type());
    const auto g = geometry(y, wl, c);
    if (!fused_dgrad(g)) {
      // No engine for the fused graph (a strided dgrad, say): ATen's dgrad, then the ReLU's mask recomputed from y
      // and BN's reductions in one kernel.
      const auto da = convolution_grad(dy.to(y.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast), y, wl, c, true);
      return relu_backward_from(da.contiguous(at::MemoryFormat::ChannelsLast), y, s);
    }
    Reduced r;
    r.dz = at::empty_like(y, at::MemoryFormat::ChannelsLast);
    auto sums = at::empty({2, y.size(1)}, s.mean.options());
    r.dsum = sums[0], r.dsum_xhat = sums[1];
    dgrad_drelu_dbn_graph(g, dy, wl, y, s, gamma.contiguous(), beta.contiguous(), r);
    return r;
  }

  at::Tensor dgrad(const at::Tensor& dy, const at::Tensor& w, const ConvArgs& c, const at::Tensor& input) override {
    return convolution_grad(dy, input, lowp_weight(w, dy.scalar_type()), c, true);
  }

  at::Tensor wgrad(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const ConvArgs& c,
                   const Stats* p) override {
    const auto wl = lowp_weight(w, x.scalar_type());
    const auto d = dy.to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
    if (!p) return convolution_grad(d, x, wl, c, false).to(w.scalar_type());
    const auto g = geometry(x, wl, c);
    if (!fused_wgrad(g)) {
      // No engine for the fused graph: the conv's input relu(x * scale + bias) made once, then ATen's wgrad.
      return convolution_grad(d, add_relu(x, *p, at::Tensor(), nullptr), wl, c, false).to(w.scalar_type());
    }
    auto dw = at::empty_like(wl, at::MemoryFormat::ChannelsLast);
    wgrad_prologue(g, d, x, p->scale_lowp, p->bias_lowp, dw);
    return dw.to(w.scalar_type());
  }

 private:
  // dz = da where y * scale + bias > 0, and BN's two sums over y: the unfused dgrad's second half.
  static Reduced relu_backward_from(const at::Tensor& da, const at::Tensor& y, const Stats& s) {
    Reduced r;
    r.dz = at::empty_like(y, at::MemoryFormat::ChannelsLast);
    auto sums = at::zeros({2, y.size(1)}, s.mean.options());
    r.dsum = sums[0], r.dsum_xhat = sums[1];
    kernels::bn::ReluBackwardArgs a;
    a.dout = da.data_ptr(), a.y = y.data_ptr(), a.mask_scale = s.scale.data_ptr<float>();
    a.mask_bias = s.bias.data_ptr<float>(), a.mean = s.mean.data_ptr<float>(), a.invstd = s.invstd.data_ptr<float>();
    a.dz = r.dz.data_ptr(), a.dsum = r.dsum.data_ptr<float>(), a.dsum_xhat = r.dsum_xhat.data_ptr<float>();
    a.storage = storage_of(y.scalar_type()), a.rows = rows(y), a.channels = y.size(1);
    launched(kernels::bn::launch_relu_backward_reduce(a, stream()), "ReLU-backward reduction");
    return r;
  }

  // autocast's cast of a conv weight, done here: channels-last in the activations' dtype (a cast kernel per step,
  // which a replayed CUDA graph repeats; a cached copy would go stale under the optimizer).
  static at::Tensor lowp_weight(const at::Tensor& w, at::ScalarType t) {
    return w.to(t).contiguous(at::MemoryFormat::ChannelsLast);
  }

  static void dgrad_drelu_dbn_graph(const ConvGeometry& g_next, const at::Tensor& dy, const at::Tensor& w,
                                    const at::Tensor& y, const Stats& s, const at::Tensor& gamma, const at::Tensor& beta,
                                    Reduced& r) {
    norm_conv::dgrad_drelu_dbn(g_next, dy.to(y.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast), w, y, s.mean,
                               s.invstd, gamma, beta, r.dz, r.dsum, r.dsum_xhat);
  }
};

Ops& ops(Backend b) {
  static AtenOps aten;
  static CudnnOps cudnn;
  return b == Backend::Cudnn ? static_cast<Ops&>(cudnn) : static_cast<Ops&>(aten);
}

ConvArgs conv_args(const Conv2dImpl& conv) {
  return {(*conv.options.stride())[0], std::get<torch::ExpandingArray<2>>(conv.options.padding())->at(0)};
}

double count_of(const at::Tensor& y) { return static_cast<double>(rows(y)); }

// ---- The block as one autograd function ------------------------------------------------------------------------
//
// Forward (L = the branch's convolutions, 2 or 3):
//   y_1 = conv_1(x)                       with sum, sum of squares -> BN_1 finalised: scale_1, bias_1
//   y_i = conv_i(relu(y_{i-1} s_{i-1} + b_{i-1}))  with its sums  -> BN_i finalised            (i = 2..L)
//   [y_d = conv_d(x) with its sums -> BN_d]
//   out = relu(y_L s_L + b_L + (y_d s_d + b_d | x))
// Backward: dz = dout * (out > 0); BN_L's gradient from dz; then for i = L..2 the conv's wgrad (its prologue
// recomputed from y_{i-1}) and its dgrad through the ReLU's mask and BN_{i-1}'s reductions; conv_1's dgrad and
// wgrad; the shortcut's (dz through BN_d and conv_d, or dz itself) added to dx. Only x, the y_i, y_d, out and the
// per-channel statistics are kept: the activations between BN and conv are recomputed, never stored.
struct BlockFunction : public torch::autograd::Function<BlockFunction> {
  // params: the branch's weights w_1..w_L, then [w_d], then each BN's gamma and beta in the same order.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, at::TensorList params,
                            std::int64_t block_address, std::int64_t backend) {
    const auto& block = *reinterpret_cast<const Block*>(block_address);
    auto& o = ops(static_cast<Backend>(backend));
    const auto lowp = x.scalar_type();
    const std::size_t L = block.branch.size();
    const bool down = block.downsample.conv != nullptr;
    std::vector<at::Tensor> ys, saved{x};
    std::vector<Stats> stats;
    std::vector<std::int64_t> strides, pads;
    at::Tensor in = x;
    for (std::size_t i = 0; i < L; ++i) {
      const auto& cb = block.branch[i];
      const ConvArgs c = conv_args(*cb.conv);
      auto [y, sum, sumsq] = o.conv_stats(in, cb.conv->weight, c, i == 0 ? nullptr : &stats.back());
      stats.push_back(o.finalize(sum, sumsq, count_of(y), *cb.bn, lowp));
      ys.push_back(y);
      in = y;
      strides.push_back(c.stride), pads.push_back(c.pad);
    }
    at::Tensor yd;
    Stats sd;
    if (down) {
      const ConvArgs c = conv_args(*block.downsample.conv);
      auto [y, sum, sumsq] = o.conv_stats(x, block.downsample.conv->weight, c, nullptr);
      sd = o.finalize(sum, sumsq, count_of(y), *block.downsample.bn, lowp);
      yd = y;
      strides.push_back(c.stride), pads.push_back(c.pad);
    }
    auto out = o.add_relu(ys.back(), stats.back(), down ? yd : x, down ? &sd : nullptr);
    // Saved: x, y_1..y_L, [y_d], out, the parameters, then each BN's mean, invstd, scale, bias, scale_lowp, bias_lowp.
    for (auto& y : ys) saved.push_back(y);
    if (down) saved.push_back(yd);
    saved.push_back(out);
    for (const auto& p : params) saved.push_back(p);
    if (down) stats.push_back(sd);
    for (const auto& s : stats) {
      for (const auto* t : {&s.mean, &s.invstd, &s.scale, &s.bias, &s.scale_lowp, &s.bias_lowp}) saved.push_back(*t);
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["layers"] = static_cast<std::int64_t>(L);
    ctx->saved_data["downsample"] = down;
    ctx->saved_data["strides"] = strides;
    ctx->saved_data["pads"] = pads;
    ctx->saved_data["backend"] = backend;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto L = static_cast<std::size_t>(ctx->saved_data["layers"].toInt());
    const bool down = ctx->saved_data["downsample"].toBool();
    const auto strides = ctx->saved_data["strides"].toIntVector(), pads = ctx->saved_data["pads"].toIntVector();
    auto& o = ops(static_cast<Backend>(ctx->saved_data["backend"].toInt()));
    std::size_t k = 0;
    const auto x = saved[k++];
    std::vector<at::Tensor> ys;
    for (std::size_t i = 0; i < L; ++i) ys.push_back(saved[k++]);
    const at::Tensor yd = down ? saved[k++] : at::Tensor();
    const auto out = saved[k++];
    const std::size_t convs = L + (down ? 1 : 0);
    std::vector<at::Tensor> w, gamma, beta;
    for (std::size_t i = 0; i < convs; ++i) w.push_back(saved[k++]);
    for (std::size_t i = 0; i < convs; ++i) gamma.push_back(saved[k++]), beta.push_back(saved[k++]);
    std::vector<Stats> st(convs);
    for (auto& s : st) {
      s.mean = saved[k++], s.invstd = saved[k++], s.scale = saved[k++], s.bias = saved[k++];
      s.scale_lowp = saved[k++], s.bias_lowp = saved[k++];
    }
    std::vector<ConvArgs> c(convs);
    for (std::size_t i = 0; i < convs; ++i) c[i] = {strides[i], pads[i]};
    std::vector<at::Tensor> dw(convs), dgamma(convs), dbeta(convs);

    // The block's end: the ReLU's mask, BN_L's (and BN_d's) reductions in one pass.
    const auto dout = grads[0].to(out.scalar_type()).contiguous(out.suggest_memory_format());
    auto r = o.relu_backward(dout, out, ys[L - 1], st[L - 1], yd, down ? &st[L] : nullptr);
    dgamma[L - 1] = r.dsum_xhat, dbeta[L - 1] = r.dsum;
    auto dy = o.dbn_apply(r.dz, ys[L - 1], st[L - 1], gamma[L - 1], r.dsum, r.dsum_xhat, count_of(ys[L - 1]));
    for (std::size_t i = L - 1; i >= 1; --i) {
      dw[i] = o.wgrad(dy, ys[i - 1], w[i], c[i], &st[i - 1]);
      auto ri = o.dgrad_drelu_dbn(dy, w[i], c[i], ys[i - 1], st[i - 1], gamma[i - 1], beta[i - 1]);
      dgamma[i - 1] = ri.dsum_xhat, dbeta[i - 1] = ri.dsum;
      dy = o.dbn_apply(ri.dz, ys[i - 1], st[i - 1], gamma[i - 1], ri.dsum, ri.dsum_xhat, count_of(ys[i - 1]));
    }
    dw[0] = o.wgrad(dy, x, w[0], c[0], nullptr);
    auto dx = o.dgrad(dy, w[0], c[0], x);
    if (down) {
      dgamma[L] = r.dsum_xhat_res, dbeta[L] = r.dsum;
      const auto dyd = o.dbn_apply(r.dz, yd, st[L], gamma[L], r.dsum, r.dsum_xhat_res, count_of(yd));
      dw[L] = o.wgrad(dyd, x, w[L], c[L], nullptr);
      dx = dx + o.dgrad(dyd, w[L], c[L], x);
    } else {
      dx = dx + r.dz;
    }
    torch::autograd::variable_list out_grads{dx};
    for (auto& g : dw) out_grads.push_back(g);
    for (std::size_t i = 0; i < convs; ++i) {
      out_grads.push_back(dgamma[i].to(gamma[i].scalar_type()));
      out_grads.push_back(dbeta[i].to(beta[i].scalar_type()));
    }
    out_grads.emplace_back();  // block_address
    out_grads.emplace_back();  // backend
    return out_grads;
  }
};


}  // namespace

at::Tensor forward(const Block& block, const at::Tensor& x, Backend backend) {
  TORCH_CHECK(!block.branch.empty(), "norm_conv::forward: a block with no convolution");
  std::vector<at::Tensor> params;
  std::vector<const ConvBn*> all;
  for (const auto& cb : block.branch) all.push_back(&cb);
  if (block.downsample.conv) all.push_back(&block.downsample);
  for (const auto* cb : all) params.push_back(cb->conv->weight);
  for (const auto* cb : all) {
    params.push_back(cb->bn->weight);
    params.push_back(cb->bn->bias);
    torch::NoGradGuard no_grad;
    cb->bn->num_batches_tracked.add_(1);
  }
  // The function's own ops pick their dtypes; autocast around it must not recast what they hand each other.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  auto out = BlockFunction::apply(x, at::TensorList(params), reinterpret_cast<std::int64_t>(&block),
                                  static_cast<std::int64_t>(backend));
  if (backend == Backend::Cudnn) note_fused_run(FusedRun::NormConv);
  return out;
}

std::string refusal(const FusedBnContext& context, const Block& block) {
  if (block.branch.empty()) return "no convolutions";
  const auto& last = *block.branch.back().bn;
  if (last.fusion() != BnFusion::AddRelu) return "its last BN is not followed by the residual add (an SE gate)";
  if (context.mode == FusionMode::Bn) return "--fusion bn";
  // The fused BN path's rules, but not its probe: these blocks run cuDNN's graph API, not the BN kernels the probe
  // asked for.
  FusedBnContext c = context;
  c.cudnn_refusal.clear();
  if (const auto why = fused_bn_refusal(c, BnFusion::AddRelu, last.options.num_features(), last.synchronized());
      !why.empty()) {
    return why;
  }
  // cuDNN 9.24's heuristics offer no sm90 engine for these graphs in bfloat16 (HALF only: its dgrad+dbn_weight,
  // scale-bias-relu+wgrad and fused conv engines), asked without a GPU for an H100 (2026-11-27).
  if (context.dtype == at::kBFloat16) {
    return "bfloat16 (cuDNN's fused convolution engines take fp16)";
  }
  std::vector<const ConvBn*> all;
  for (const auto& cb : block.branch) all.push_back(&cb);
  if (block.downsample.conv) all.push_back(&block.downsample);
  for (const auto* cb : all) {
    const auto& o = cb->conv->options;
    if (o.groups() != 1) return "a grouped convolution (ResNeXt): cuDNN's fused convolution graphs take groups = 1";
    if (auto why = conv_shape_refusal(*cb->conv); !why.empty()) return why;
    if (o.bias()) return "a convolution with a bias (its BN follows it)";
    if (o.in_channels() % 8 != 0 || o.out_channels() % 8 != 0) {
      return std::to_string(o.in_channels()) + "->" + std::to_string(o.out_channels()) +
             " channels (cuDNN's fused graphs need multiples of 8)";
    }
    if (cb->bn->synchronized()) return "synchronized BN (--sync-bn) keeps its own path";
  }
  return "";
}

std::vector<ConvGeometry> geometries(const Block& block, const at::Tensor& x) {
  std::vector<ConvGeometry> out;
  std::int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  auto add = [&](const Conv2dImpl& conv, std::int64_t in_c, std::int64_t in_h, std::int64_t in_w) {
    const ConvArgs a = conv_args(conv);
    out.push_back(ConvGeometry::of({n, in_c, in_h, in_w}, conv.weight.sizes(), a.stride, a.pad, x.scalar_type()));
    return out.back();
  };
  for (const auto& cb : block.branch) {
    const auto g = add(*cb.conv, c, h, w);
    c = g.k, h = g.out_h(), w = g.out_w();
  }
  if (block.downsample.conv) add(*block.downsample.conv, x.size(1), x.size(2), x.size(3));
  return out;
}

std::string prepare(const Block& block, const at::Tensor& x) {
  const c10::cuda::CUDAGuard guard(x.device());
  const auto gs = geometries(block, x);
  try {
    for (std::size_t i = 0; i < gs.size(); ++i) {
      // The branch's first convolution and the downsample read x as it is; the others apply the previous BN.
      const bool prologue = i > 0 && i < block.branch.size();
      norm_conv::prepare(gs[i], prologue);
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool takes(const at::Tensor& x, const Block& block) {
  if (!x.is_cuda() || x.dim() != 4 || (x.scalar_type() != at::kHalf && x.scalar_type() != at::kBFloat16) ||
      !x.is_contiguous(at::MemoryFormat::ChannelsLast) || x.size(1) != block.branch.front().conv->options.in_channels()) {
    return false;
  }
  for (const auto& cb : block.branch) {
    if (cb.bn->weight.scalar_type() != at::kFloat) return false;
  }
  return true;
}

}  // namespace convnets::models::norm_conv
