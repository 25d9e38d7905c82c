#include "train/graph_step.h"

#include "core/error.h"
#include "io/state_dict.h"

#include <torch/torch.h>
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

namespace convnets::train {

struct GraphedStep::Graph {
  // Made only for CUDA steps: constructing one touches the CUDA runtime,
  // which a CPU-only machine does not have.
  std::optional<at::cuda::CUDAGraph> graph;
  bool warmed_up = false;
};

std::string GraphedStep::unsupported_reason(const StepOptions& options) {
  if (options.mix.mixup > 0 || options.mix.cutmix > 0) return "mixup/cutmix draw lambda and a permutation on the host every step";
  if (!options.erase_mode.empty()) return "random erasing draws its boxes and noise every step";
  if (options.sync) return "the gradient all-reduce of a data-parallel run is launched from autograd hooks";
  // Replays would need the CUDA generator's offset advanced per replay; that
  // path has not been validated on a GPU here, so such models run eagerly.
  if (options.random_layers) return "the model draws dropout/drop-path masks";
  return "";
}

GraphedStep::GraphedStep(NetworkImpl& model, Optimizer& optimizer, LossScaler* scaler, Ema* ema,
                         const std::vector<MicroBatch>& example, const StepOptions& options)
    : model_(model), optimizer_(optimizer), scaler_(scaler), ema_(ema), options_(options), graph_(new Graph) {
  const auto why = unsupported_reason(options);
  if (!why.empty()) throw Error("CUDA graph capture of the training step is not possible: " + why,
                                "use --no-cuda-graph");
  if (example.empty()) throw Error("GraphedStep: no micro-batches to take shapes from");
  for (const auto& m : example) {
    static_.push_back({torch::empty_like(m.images), torch::empty_like(m.labels), {}});
  }
  lr_ = torch::zeros({}, torch::dtype(torch::kFloat).device(example[0].images.device()));
}

GraphedStep::~GraphedStep() = default;

bool GraphedStep::captured() const { return graph_->graph.has_value(); }

void GraphedStep::eager_step() {
  // Step number 0: only mixup reads it, and mixup is not capturable.
  loss_ = train_step(model_, optimizer_, scaler_, ema_, static_, lr_, 0, options_).loss;
}

at::Tensor GraphedStep::run(const std::vector<MicroBatch>& micro, double lr) {
  if (micro.size() != static_.size()) {
    throw Error("GraphedStep: " + std::to_string(micro.size()) + " micro-batches, captured with " +
                std::to_string(static_.size()));
  }
  for (size_t i = 0; i < micro.size(); ++i) {
    if (micro[i].images.sizes() != static_[i].images.sizes()) {
      throw Error("GraphedStep: batch shape " + c10::str(micro[i].images.sizes()) + " differs from the static " +
                  c10::str(static_[i].images.sizes()));
    }
    static_[i].images.copy_(micro[i].images, /*non_blocking=*/true);
    static_[i].labels.copy_(micro[i].labels, /*non_blocking=*/true);
  }
  lr_.fill_(lr);
  if (!graph_->warmed_up) {
    // The warm-up steps (cuDNN autotuning, lazy allocations, and on CUDA the
    // capture) must not change the run: every piece of state is put back.
    std::vector<at::Tensor> state{optimizer_.flat().values()};
    for (const auto& t : optimizer_.state()) state.push_back(t.second);
    for (const auto& b : model_.buffers()) state.push_back(b);
    if (scaler_) {
      for (const auto& t : scaler_->state()) state.push_back(t.second);
    }
    if (ema_) {
      for (const auto& t : state_dict(*ema_->model())) state.push_back(t.second);
    }
    std::vector<at::Tensor> saved;
    for (const auto& t : state) saved.push_back(t.detach().clone());
    const bool cuda = static_[0].images.is_cuda();
    if (cuda) {
      torch::cuda::synchronize();
      // Capture happens on a side stream, never the legacy default one.
      auto side = c10::cuda::getStreamFromPool(false, static_[0].images.device().index());
      c10::cuda::CUDAStreamGuard guard(side);
      for (int i = 0; i < 3; ++i) eager_step();
      // A cached fp16 copy of a weight made outside the graph would be stale inside it.
      const bool cache = at::autocast::is_autocast_cache_enabled();
      at::autocast::set_autocast_cache_enabled(false);
      graph_->graph.emplace();
      graph_->graph->capture_begin();
      eager_step();  // recorded, not executed: loss_ now names the graph's output
      graph_->graph->capture_end();
      at::autocast::set_autocast_cache_enabled(cache);
      torch::cuda::synchronize();
    }
    if (!cuda) eager_step();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < state.size(); ++i) state[i].copy_(saved[i]);
    graph_->warmed_up = true;
  }
  if (graph_->graph) {
    graph_->graph->replay();
    return loss_;
  }
  eager_step();
  return loss_;
}

StepRunner::StepRunner(NetworkImpl& model, Optimizer& optimizer, LossScaler* scaler, Ema* ema, const StepOptions& options,
                       const c10::Device& device, bool cuda_graph)
    : model_(model),
      optimizer_(optimizer),
      scaler_(scaler),
      ema_(ema),
      options_(options),
      use_graph_(cuda_graph && device.is_cuda() && GraphedStep::unsupported_reason(options).empty()) {}

at::Tensor StepRunner::run(const std::vector<MicroBatch>& micro, double lr, std::int64_t step) {
  if (ema_) ema_->set_step(step);
  if (!use_graph_) return train_step(model_, optimizer_, scaler_, ema_, micro, lr, step, options_).loss;
  // Static shapes hold: train's loader drops the last partial batch, bench's batch is fixed.
  if (!graph_) graph_ = std::make_unique<GraphedStep>(model_, optimizer_, scaler_, ema_, micro, options_);
  return graph_->run(micro, lr);
}

}  // namespace convnets::train
