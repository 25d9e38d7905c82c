// The whole training step (forward, backward, unscale/inf-check, optimizer, EMA) over static buffers, replayed as one CUDA graph.
#pragma once

#include "train/step.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <vector>

namespace convnets::train {

// PyTorch's "whole network capture" (torch.cuda.graphs docs): inputs are
// copied into static tensors, the learning rate is a device tensor, the loss
// lands in a static tensor, and every replay is one launch instead of
// hundreds. Needs static shapes and no host-side per-step values, so mixup
// (a host draw per step) is excluded. On the CPU the same static-buffer step
// runs eagerly: that path is what the CPU tests compare with train_step.
class GraphedStep {
 public:
  // Why whole-step capture cannot be used for these options, or "" if it can.
  static std::string unsupported_reason(const StepOptions& options);

  // `example` gives the shapes, dtypes and device of the micro-batches.
  GraphedStep(NetworkImpl& model, Optimizer& optimizer, LossScaler* scaler, Ema* ema,
              const std::vector<MicroBatch>& example, const StepOptions& options);
  ~GraphedStep();

  // Copies the batch in and runs (first call on CUDA: warm-up and capture)
  // one step at `lr`. Returns the mean loss, a 0-dim device tensor that the
  // next call overwrites.
  at::Tensor run(const std::vector<MicroBatch>& micro, double lr);

  bool captured() const;

 private:
  void eager_step();

  NetworkImpl& model_;
  Optimizer& optimizer_;
  LossScaler* scaler_;
  Ema* ema_;
  StepOptions options_;
  std::vector<MicroBatch> static_;
  at::Tensor lr_, loss_;
  struct Graph;
  std::unique_ptr<Graph> graph_;
};

// What `train` and `bench train` call once per step: the captured graph where
// it can be used (CUDA, `cuda_graph` asked for, a capturable step), built on
// the first call from that batch's shapes; otherwise train_step.
class StepRunner {
 public:
  StepRunner(NetworkImpl& model, Optimizer& optimizer, LossScaler* scaler, Ema* ema, const StepOptions& options,
             const c10::Device& device, bool cuda_graph);
  // The step's mean loss, a 0-dim device tensor (overwritten by the next call when graphed).
  at::Tensor run(const std::vector<MicroBatch>& micro, double lr, std::int64_t step);
  bool graphed() const { return use_graph_; }

 private:
  NetworkImpl& model_;
  Optimizer& optimizer_;
  LossScaler* scaler_;
  Ema* ema_;
  StepOptions options_;
  bool use_graph_;
  std::unique_ptr<GraphedStep> graph_;
};

}  // namespace convnets::train
