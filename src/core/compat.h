// Differences between the LibTorch versions convnets builds against (Debian's 1.13 CPU, CUDA 2.x).
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
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

// Mixed-precision autocast on CUDA for a scope (torch.autocast("cuda", dtype)).
// 1.13 has CUDA-only setters; 2.4 made them per device type. On CPU, or with
// kFloat, it does nothing: convnets trains fp32 on CPU.
class AutocastGuard {
 public:
  AutocastGuard(c10::Device device, c10::ScalarType dtype) : active_(device.is_cuda() && dtype != c10::kFloat) {
    if (!active_) return;
#if CONVNETS_TORCH_AT_LEAST(2, 4)
    previous_ = at::autocast::get_autocast_dtype(c10::DeviceType::CUDA);
    at::autocast::set_autocast_dtype(c10::DeviceType::CUDA, dtype);
    at::autocast::set_autocast_enabled(c10::DeviceType::CUDA, true);
#else
    previous_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(true);
#endif
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!active_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if CONVNETS_TORCH_AT_LEAST(2, 4)
    at::autocast::set_autocast_enabled(c10::DeviceType::CUDA, false);
    at::autocast::set_autocast_dtype(c10::DeviceType::CUDA, previous_);
#else
    at::autocast::set_enabled(false);
    at::autocast::set_autocast_gpu_dtype(previous_);
#endif
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_;
  c10::ScalarType previous_ = c10::kHalf;
};

}  // namespace convnets::compat
