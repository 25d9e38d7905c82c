// Differences between the LibTorch versions convnets builds against (Debian's 1.13 CPU, CUDA 2.x).
#pragma once

#include <torch/version.h>

#include <string>

#define CONVNETS_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

static_assert(CONVNETS_TORCH_AT_LEAST(1, 13), "convnets needs LibTorch 1.13 or newer");

#if CONVNETS_TORCH_AT_LEAST(2, 1)
#include <variant>
#else
#include <c10/util/variant.h>
#endif

namespace convnets::compat {

inline std::string torch_version() { return TORCH_VERSION; }

// LibTorch's option variants (e.g. Conv2dOptions::padding) are c10::variant up to
// 2.0 and std::variant from 2.1 on.
template <typename T, typename Variant>
const T* variant_get_if(const Variant& v) {
#if CONVNETS_TORCH_AT_LEAST(2, 1)
  return std::get_if<T>(&v);
#else
  return c10::get_if<T>(&v);
#endif
}

}  // namespace convnets::compat
