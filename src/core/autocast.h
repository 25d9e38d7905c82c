// Mixed-precision autocast for a scope: torch.autocast("cuda", dtype) in C++.
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace convnets {

// On the CPU, or with kFloat, it does nothing: convnets trains fp32 on the CPU.
class AutocastGuard {
 public:
  AutocastGuard(c10::Device device, c10::ScalarType dtype) : active_(device.is_cuda() && dtype != c10::kFloat) {
    if (!active_) return;
    previous_ = at::autocast::get_autocast_dtype(c10::DeviceType::CUDA);
    at::autocast::set_autocast_dtype(c10::DeviceType::CUDA, dtype);
    at::autocast::set_autocast_enabled(c10::DeviceType::CUDA, true);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!active_) return;
    // As torch.autocast's __exit__: the cast cache lives as long as the outermost scope.
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(c10::DeviceType::CUDA, false);
    at::autocast::set_autocast_dtype(c10::DeviceType::CUDA, previous_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_;
  c10::ScalarType previous_ = c10::kHalf;
};

}  // namespace convnets
