// Mixed-precision autocast for a scope: torch.autocast(device_type, dtype) in C++.
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace convnets {

// With kFloat it does nothing. On the CPU only bf16 reaches here
// (resolve_runtime refuses the rest), as torch.autocast("cpu", torch.bfloat16).
class AutocastGuard {
 public:
  AutocastGuard(c10::Device device, c10::ScalarType dtype)
      : type_(device.type()), active_(dtype != c10::kFloat && (device.is_cuda() || device.is_cpu())) {
    if (!active_) return;
    previous_ = at::autocast::get_autocast_dtype(type_);
    at::autocast::set_autocast_dtype(type_, dtype);
    at::autocast::set_autocast_enabled(type_, true);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!active_) return;
    // As torch.autocast's __exit__: the cast cache lives as long as the outermost scope.
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(type_, false);
    at::autocast::set_autocast_dtype(type_, previous_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType type_;
  bool active_;
  c10::ScalarType previous_ = c10::kHalf;
};

}  // namespace convnets
