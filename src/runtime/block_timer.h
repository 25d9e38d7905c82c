// The step tuner's measurements on the run's device: a residual block's forward and backward timed alone on each path (CUDA events on a GPU), its output and gradients checked against the unfused path's on the same input, and the forward that shows each block the shape it will train on.
#pragma once

#include "models/network.h"
#include "runtime/runtime.h"
#include "runtime/tuner.h"

#include <cstdint>
#include <vector>

namespace convnets::runtime {

// The fixed part of how far a path's output and gradients may be from fp32's unfused ones on the same block and
// input, in relative L2 (the check also allows 1.5x the unfused path's own distance in the same precision): 2e-2 in
// fp16 (the fused BN op's gradient bound, Gpu.FusedBnReluMatchesAtenOps), twice that in bfloat16, whose mantissa
// has 3 bits fewer; 1e-4 in fp32, where every path computes the same sums.
double numerics_bound(at::ScalarType dtype);

// The worst relative L2 distance of `got` from `want`, tensor by tensor (fp32 arithmetic), and which tensor it was.
std::pair<double, std::size_t> worst_distance(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want);

// Times on the block's device: CUDA events around the repeats on a GPU, the steady clock on the CPU (the tests). The
// input is a fixed pattern, not random numbers, so that a seeded run's generators do not move. Each path's output and
// gradients are first checked against the unfused path's in fp32 (numerics_bound). Paths are timed in
// `rounds` interleaved rounds of `repeats` forward+backward passes each, after one pass that checks the numerics and
// one that warms up (cuDNN's plans are built then), and each keeps its best round. The block's buffers (BN running
// statistics) are put back afterwards, and its parameters' gradients are never touched.
class DeviceBlockTimer : public BlockTimer {
 public:
  DeviceBlockTimer(bool channels_last, int rounds = 3, int repeats = 4)
      : channels_last_(channels_last), rounds_(rounds), repeats_(repeats) {}
  std::vector<Candidate> time(torch::nn::Module& block, models::FusionTunable& tunable,
                              const std::vector<models::FusionPath>& paths, const std::vector<std::int64_t>& sizes,
                              at::ScalarType dtype) override;

 private:
  bool channels_last_;
  int rounds_, repeats_;
};

// One training forward of `model` on a batch of `sizes` (NCHW order) in the run's precision and memory format,
// without gradients, every buffer put back after: each tunable block records the shape of its input.
void record_block_inputs(NetworkImpl& model, const Runtime& rt, const std::vector<std::int64_t>& sizes);

// The device the run's measurements are true of (TuningDevice), on CUDA.
TuningDevice tuning_device(const Runtime& rt);

}  // namespace convnets::runtime
