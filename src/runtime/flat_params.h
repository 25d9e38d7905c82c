// Trainable parameters and their gradients rebound as views of two flat buffers, so optimizer, loss scaling and gradient all-reduce run over a few large tensors.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <string>
#include <vector>

namespace convnets::runtime {

// Apex's flat master weights and DDP's gradient_as_bucket_view in one place:
// each parameter's storage becomes a slice of `values()` and its .grad() a
// slice of `grads()` with the same strides (channels-last weights stay
// channels-last), and autograd accumulates into those slices in place. An
// optimizer step is then a handful of kernels instead of several per tensor.
//
// Parameters are grouped (e.g. decayed / not decayed) and each group is one
// contiguous range; inside a group they lie in reverse registration order,
// the order backward produces their gradients, so ranges of the buffer become
// ready for communication front to back.
class FlatParameters {
 public:
  struct Entry {
    std::string name;
    at::Tensor value;  // the module's parameter, now a view of values()
    std::int64_t offset = 0, numel = 0;
    int group = 0;
  };
  struct Range {
    std::int64_t begin = 0, end = 0;
  };

  // `group_of` maps each trainable parameter to 0 .. groups-1. All of them
  // must share one device and floating-point dtype (fp32 master weights);
  // otherwise Error names the parameter. Call after the model is on its
  // device and in its memory format: moving it later undoes the binding.
  FlatParameters(torch::nn::Module& model, int groups,
                 const std::function<int(const std::string&, const at::Tensor&)>& group_of);

  const at::Tensor& values() const { return values_; }
  const at::Tensor& grads() const { return grads_; }
  const std::vector<Entry>& entries() const { return entries_; }
  Range group(int g) const { return groups_.at(static_cast<size_t>(g)); }
  int groups() const { return static_cast<int>(groups_.size()); }

  // A buffer laid out like values() (same numel, dtype, device), e.g. momentum.
  at::Tensor make_buffer() const;
  // Entry e's slice of such a buffer, shaped and strided like the parameter.
  at::Tensor view(const at::Tensor& buffer, const Entry& e) const;

  // Calls fn(begin, end, group) over every group's range in slices sized for
  // elementwise optimizer passes: one slice per group on CUDA (a few
  // launches); 1 MiB (2^18 fp32) slices on the CPU, which keep the passes in cache
  // and the temporaries on the malloc heap (over ResNet-50's whole 100 MB the
  // same ops ran 1.6x slower than per tensor; docs/PERFORMANCE.md).
  void for_each_slice(const std::function<void(std::int64_t, std::int64_t, int)>& fn) const;

  // One kernel; the gradients stay bound (module.zero_grad() in PyTorch 2.x
  // sets them to None, which would unbind them).
  void zero_grad();

 private:
  at::Tensor values_, grads_;
  std::vector<Entry> entries_;
  std::vector<Range> groups_;
};

}  // namespace convnets::runtime
