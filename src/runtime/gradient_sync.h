// The data-parallel hooks a training step calls (distributed::GradientReducer implements them): an interface on the
// runtime floor, so the step and the reducer need not include each other.
#pragma once

#include "models/network.h"

namespace convnets::runtime {

// Data-parallel hooks around a step's micro-batches (distributed::GradientReducer):
// gradients are all-reduced during the last micro-batch's backward only.
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // Once per step, before the first forward (e.g. BN buffers from rank 0, as DDP broadcasts them).
  virtual void begin_step(NetworkImpl& model) = 0;
  virtual void before_backward(bool last_micro) = 0;
  // Returns when this rank's gradients are the average over ranks (last micro-batch).
  virtual void after_backward(bool last_micro) = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
};

}  // namespace convnets::runtime
