// The LibTorch versions convnets builds against (2.11, the GPU machine's, up to the pinned 2.14) and what differs between them.
#pragma once

#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#include <string>
#include <utility>

#define CONVNETS_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

static_assert(CONVNETS_TORCH_AT_LEAST(2, 11), "convnets needs LibTorch 2.11 or newer");

namespace convnets::compat {

// An owning handle of an autograd Node (e.g. a parameter's AccumulateGrad):
// std::shared_ptr<Node> in 2.11, c10::intrusive_ptr<Node> in 2.14.
using NodePtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

// What this binary was built with, e.g. "LibTorch 2.14.1, CUDA 13.0, cuDNN 9.24.0".
std::string engine_versions();

}  // namespace convnets::compat
