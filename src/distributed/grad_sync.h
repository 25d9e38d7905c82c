// Gradient all-reduce in buckets of the flat gradient buffer, launched from autograd hooks while backward runs (DDP's Reducer).
#pragma once

#include "core/compat.h"
#include "distributed/group.h"
#include "runtime/flat_params.h"
#include "runtime/gradient_sync.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace convnets::distributed {

struct ReducerStats {
  std::int64_t buckets = 0;
  std::int64_t bytes_per_step = 0;   // gradient bytes all-reduced per optimizer step
  double exposed_wait_s = 0;         // summed time waiting for all-reduces after backward
  std::int64_t steps = 0;
};

// PyTorch DDP's bucketing (Li et al., VLDB 2020): the flat gradient buffer
// (runtime::FlatParameters, in backward order within each group) is cut into
// contiguous buckets of about `bucket_mb` MiB (the first one smaller, so
// communication starts early). An AccumulateGrad post-hook counts each
// parameter's gradient in; a full bucket is divided by the world size and
// all-reduced at once, in bucket order on every rank, while backward goes on
// with the layers below. Buffers (BN running statistics) are broadcast from
// rank 0 before each step, as DDP's broadcast_buffers does, unless
// synchronized BN already keeps them equal.
class GradientReducer : public runtime::GradientSync {
 public:
  GradientReducer(Group& group, runtime::FlatParameters& flat, double bucket_mb, bool broadcast_buffers);
  ~GradientReducer() override;

  // Parameters and buffers from rank 0 (every rank starts equal).
  void broadcast_state(torch::nn::Module& model);

  void begin_step(NetworkImpl& model) override;
  void before_backward(bool last_micro) override;
  void after_backward(bool last_micro) override;
  int rank() const override { return group_.rank(); }
  int world_size() const override { return group_.world_size(); }

  const ReducerStats& stats() const { return stats_; }

 private:
  struct Bucket {
    std::int64_t begin = 0, end = 0;  // range of the flat gradient buffer
    int params = 0;
    int pending = 0;
    std::shared_ptr<Group::Pending> work;
  };
  void on_gradient(std::size_t bucket);
  // One broadcast from rank 0 for tensors of one dtype, copied back in place.
  void broadcast_packed(const std::vector<at::Tensor>& tensors);
  void launch_ready();

  Group& group_;
  runtime::FlatParameters& flat_;
  bool broadcast_buffers_;
  std::vector<Bucket> buckets_;
  std::vector<compat::NodePtr> accumulators_;  // keeps the hooked AccumulateGrad nodes alive
  std::mutex mutex_;
  bool armed_ = false;
  std::size_t next_launch_ = 0;
  ReducerStats stats_;
};

}  // namespace convnets::distributed
