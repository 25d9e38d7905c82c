#include "runtime/flat_params.h"

#include "core/error.h"

#include <torch/torch.h>

#include <algorithm>

namespace convnets::runtime {
namespace {

// 256-byte aligned slices: per-parameter kernels (cuDNN, vectorised loads) see
// the alignment a fresh allocation would have.
constexpr std::int64_t kAlignBytes = 256;

std::int64_t round_up(std::int64_t n, std::int64_t m) { return (n + m - 1) / m * m; }

}  // namespace

FlatParameters::FlatParameters(torch::nn::Module& model, int groups,
                               const std::function<int(const std::string&, const at::Tensor&)>& group_of) {
  std::vector<std::vector<Entry>> by_group(static_cast<size_t>(groups));
  at::TensorOptions options;
  bool first = true;
  for (const auto& p : model.named_parameters()) {
    if (!p.value().requires_grad()) continue;
    const at::Tensor& v = p.value();
    if (first) {
      if (!v.is_floating_point()) throw Error("parameter '" + p.key() + "' is not floating point");
      options = v.options();
      first = false;
    } else if (v.device() != options.device() || v.scalar_type() != options.dtype().toScalarType()) {
      throw Error("parameter '" + p.key() + "' is " + std::string(c10::toString(v.scalar_type())) + " on " +
                  v.device().str() + ", the others " + std::string(c10::toString(options.dtype().toScalarType())) +
                  " on " + options.device().str() + "; one flat buffer needs one dtype and device");
    }
    const int g = group_of(p.key(), v);
    if (g < 0 || g >= groups) throw Error("parameter '" + p.key() + "' was put in group " + std::to_string(g));
    by_group[static_cast<size_t>(g)].push_back({p.key(), v, 0, v.numel(), g});
  }
  const std::int64_t align = std::max<std::int64_t>(1, kAlignBytes / static_cast<std::int64_t>(options.dtype().itemsize()));
  std::int64_t offset = 0;
  for (auto& group : by_group) {
    std::reverse(group.begin(), group.end());
    Range r{offset, offset};
    for (auto& e : group) {
      e.offset = offset;
      offset = round_up(offset + e.numel, align);
      entries_.push_back(e);
    }
    r.end = offset;
    groups_.push_back(r);
  }
  torch::NoGradGuard no_grad;
  // Zeros: the alignment padding stays 0 under SGD (zero gradient, zero decay).
  values_ = torch::zeros({offset}, options);
  grads_ = torch::zeros({offset}, options);
  for (auto& e : entries_) {
    auto value = view(values_, e);
    value.copy_(e.value);
    auto grad = view(grads_, e);
    if (e.value.grad().defined()) grad.copy_(e.value.grad());
    e.value.set_data(value);
    e.value.mutable_grad() = grad;
  }
}

at::Tensor FlatParameters::make_buffer() const { return torch::zeros_like(values_); }

at::Tensor FlatParameters::view(const at::Tensor& buffer, const Entry& e) const {
  // The parameter's own strides when they are a permutation of a dense
  // layout (NCHW or NHWC); anything else gets row-major strides.
  std::vector<std::int64_t> strides = e.value.strides().vec();
  if (!e.value.is_non_overlapping_and_dense()) {
    std::int64_t stride = 1;
    for (auto d = e.value.dim() - 1; d >= 0; --d) {
      strides[static_cast<size_t>(d)] = stride;
      stride *= e.value.size(d);
    }
  }
  return buffer.narrow(0, e.offset, e.numel).as_strided(e.value.sizes(), strides);
}

void FlatParameters::zero_grad() { grads_.zero_(); }

void FlatParameters::for_each_slice(const std::function<void(std::int64_t, std::int64_t, int)>& fn) const {
  const bool cuda = values_.is_cuda();
  for (int g = 0; g < groups(); ++g) {
    const auto r = group(g);
    const std::int64_t chunk = cuda ? std::max<std::int64_t>(r.end - r.begin, 1) : std::int64_t{1} << 18;
    for (std::int64_t begin = r.begin; begin < r.end; begin += chunk) fn(begin, std::min(r.end, begin + chunk), g);
  }
}

}  // namespace convnets::runtime
