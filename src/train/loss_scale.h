// Dynamic loss scaling for fp16 training, kept on the device: no host synchronisation per step.
#pragma once

#include "io/safetensors.h"

#include <ATen/core/Tensor.h>

#include <vector>

namespace convnets::train {

// torch.cuda.amp.GradScaler's policy (Micikevicius et al. 2018, "Mixed
// Precision Training"): start at 2^16, halve on an overflow (and skip that
// step), double after 2000 clean steps. Scale, overflow flag and growth counter
// are device tensors, so the optimizer can skip a step without reading them.
class LossScaler {
 public:
  explicit LossScaler(at::Device device, double init_scale = 65536.0, double growth = 2.0, double backoff = 0.5,
                      std::int64_t interval = 2000);

  at::Tensor scale(const at::Tensor& loss) const { return loss * scale_; }
  // Divides every defined gradient by the scale; returns a 0-dim bool that is
  // true when any gradient holds an inf or NaN.
  at::Tensor unscale(const std::vector<at::Tensor>& grads);
  // Backs off or grows the scale after a step, from the flag unscale() returned.
  void update(const at::Tensor& found_inf);

  double value() const;  // reads the device (logging only)
  NamedTensors state() const;
  void load_state(const TensorFile& file, const std::string& source);

 private:
  at::Tensor scale_;    // float32 [1]
  at::Tensor tracker_;  // int32 [1]: clean steps since the last change
  double growth_, backoff_;
  std::int64_t interval_;
};

}  // namespace convnets::train
