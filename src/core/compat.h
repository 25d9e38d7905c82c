// Differences between the LibTorch versions convnets builds against (Debian's 1.13 CPU, CUDA 2.x).
#pragma once

#include <torch/version.h>

#include <string>
#include <variant>

#define CONVNETS_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

static_assert(CONVNETS_TORCH_AT_LEAST(1, 13), "convnets needs LibTorch 1.13 or newer");

namespace convnets::compat {

inline std::string torch_version() { return TORCH_VERSION; }

// LibTorch's option variants (e.g. Conv2dOptions::padding) are c10::variant in
// 1.13 and std::variant in 2.x; the release that switched is not pinned down
// here, so no version test: argument-dependent lookup finds c10::get_if for a
// c10::variant, and std::get_if drops out of overload resolution for it.
template <typename T, typename Variant>
const T* variant_get_if(const Variant& v) {
  using std::get_if;
  return get_if<T>(&v);
}

}  // namespace convnets::compat
