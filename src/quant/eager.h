// The network's graph evaluated with LibTorch ops: INT8 calibration, and the fake-quantized network that quantization-aware training trains.
#pragma once

#include "data/loader.h"
#include "models/network.h"
#include "quant/qdq.h"
#include "runtime/runtime.h"

#include <memory>
#include <string>

namespace convnets::quant {

// The calibration pass of post-training quantization: every quantized
// tensor's range over the images of `loader` (eval transform), the network
// in eval mode with float weights, BN folded as the export folds it. Method
// percentile and entropy read the images twice (extremes, then histograms).
// `progress`: the phase named on stdout (empty: silent).
Plan calibrate(NetworkImpl& model, data::Loader& loader, const runtime::Runtime& rt, const Preprocessing& pre,
               Activations activations, Method method, bool reduce_range, Silu silu, const std::string& progress);

// Quantization-aware training's network (Jacob et al. 2018, "Quantization
// and Training of Neural Networks for Efficient Integer-Arithmetic-Only
// Inference", sec. 3): `inner`'s graph with the export's fake quantization
// at every point of `plan` (fixed calibrated ranges, as NVIDIA's
// pytorch-quantization keeps them) and per-channel fake-quantized weights,
// gradients passing straight through inside the range (STE). BatchNorm is
// folded into each conv with its running statistics frozen (the paper's
// sec. 3.2 after BN freezing): the conv weights, gamma and beta train, the
// statistics stay those the model was calibrated with. Dropout and
// drop-path are off (the eval graph). The parameters and buffers are
// `inner`'s own, under the same names: the optimizer, EMA and checkpoints
// see the plain network.
class FakeQuantNetworkImpl : public NetworkImpl {
 public:
  FakeQuantNetworkImpl(Network inner, std::shared_ptr<const Plan> plan);
  torch::Tensor forward(torch::Tensor x) override;
  std::string emit(GraphEmitter& g, const std::string& input) override { return inner_->emit(g, input); }
  const Plan& plan() const { return *plan_; }
  NetworkImpl& inner() { return *inner_; }

 private:
  Network inner_;
  std::shared_ptr<const Plan> plan_;
};

// `inner` evaluated through its graph without quantization: the eager
// interpreter's reference (tests compare it with forward()).
torch::Tensor graph_forward(NetworkImpl& inner, const torch::Tensor& x);

}  // namespace convnets::quant
