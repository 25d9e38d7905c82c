// The training step that `bench train` times (bench::TimedTrainStep), made here on the training floor from the optimizer, loss scaler, gradient all-reduce and step runner that `train` uses.
#pragma once

#include "bench/train_bench.h"

#include <memory>

namespace convnets::train {

// DLE's ResNet-50 step as `train` runs it: SGD with the options' momentum and
// weight decay, label smoothing, a dynamic loss scale under amp, the
// options' group all-reducing the gradients in buckets, replayed as a CUDA
// graph where the device allows it (options.cuda_graph). A bench::TrainStepFactory.
std::unique_ptr<bench::TimedTrainStep> make_bench_step(NetworkImpl& model, const runtime::Runtime& rt,
                                                       const bench::TrainBenchOptions& options);

}  // namespace convnets::train
