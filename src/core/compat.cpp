#include "core/compat.h"

#include <ATen/detail/CUDAHooksInterface.h>

namespace convnets::compat {

std::string engine_versions() {
  // Torch's own build: the hooks report libtorch_cuda's compile-time
  // versions, and answer without a GPU.
  const auto& hooks = at::detail::getCUDAHooks();
  const long cudart = hooks.versionCUDART();  // e.g. 13000
  const long cudnn = hooks.versionCuDNN();     // e.g. 92400: major*10000 + minor*100 + patch
  std::string out = "LibTorch " TORCH_VERSION ", CUDA " + std::to_string(cudart / 1000) + "." +
                    std::to_string(cudart % 1000 / 10);
  if (cudnn > 0) {
    out += ", cuDNN " + std::to_string(cudnn / 10000) + "." + std::to_string(cudnn % 10000 / 100) + "." +
           std::to_string(cudnn % 100);
  }
  return out;
}

}  // namespace convnets::compat
