#include "train/bench_step.h"

#include "io/state_dict.h"
#include "models/fusion.h"
#include "runtime/fusion_setup.h"
#include "train/graph_step.h"
#include "train/loss_scale.h"
#include "train/sgd.h"
#include "train/step.h"

#include <torch/torch.h>

#include <optional>
#include <vector>

namespace convnets::train {
namespace {

class BenchStep : public bench::TimedTrainStep {
 public:
  BenchStep(NetworkImpl& model, const runtime::Runtime& rt, const bench::TrainBenchOptions& o)
      : model_(model), rt_(rt), mode_(models::parse_fusion_mode(o.fusion)), tuning_cache_(o.tuning_cache),
        sgd_(model, {o.momentum, false, o.weight_decay, false}) {
    runtime::set_fusion(model, rt, mode_);
    if (rt.loss_scaling) scaler_.emplace(rt.device);
    StepOptions so;
    so.label_smoothing = o.label_smoothing;
    so.autocast = rt.autocast;
    so.random_layers = model.random_in_training();
    if (o.group) {
      reducer_ = std::make_unique<distributed::GradientReducer>(*o.group, sgd_.flat(), o.bucket_mb, true);
      so.sync = reducer_.get();
    }
    runner_.emplace(model, sgd_, scaler_ ? &*scaler_ : nullptr, nullptr, so, rt.device, o.cuda_graph);
  }

  void run(const at::Tensor& input, const at::Tensor& labels) override {
    // As `train` does before its first step: each block's path tuned for this batch's shape.
    if (!tuned_) {
      tuning_ = runtime::tune_fusion(model_, rt_, mode_, input.sizes().vec(), tuning_cache_);
      tuned_ = true;
    }
    // The LR is a constant: a schedule changes a scalar, not the step's cost.
    const std::vector<MicroBatch> micro{{input, labels, {}}};
    runner_->run(micro, 0.1, 0);
  }
  bool graphed() const override { return runner_->graphed(); }
  std::string fused_bn() const override { return runtime::describe_fusion(model_, rt_, mode_); }
  std::string tuning() const override { return tuning_.describe(); }
  double tuning_seconds() const override { return tuning_.seconds; }
  const distributed::ReducerStats* sync_stats() const override { return reducer_ ? &reducer_->stats() : nullptr; }
  NamedTensors state() const override {
    NamedTensors tensors;
    for (auto& [k, t] : state_dict(model_)) tensors.emplace_back("model." + k, t);
    for (auto& e : sgd_.state()) tensors.push_back(e);
    return tensors;
  }

 private:
  NetworkImpl& model_;
  runtime::Runtime rt_;
  models::FusionMode mode_;
  std::string tuning_cache_;
  bool tuned_ = false;
  runtime::TuneReport tuning_;
  Sgd sgd_;
  std::optional<LossScaler> scaler_;
  std::unique_ptr<distributed::GradientReducer> reducer_;
  std::optional<StepRunner> runner_;  // last: it holds the optimizer, scaler and reducer above
};

}  // namespace

std::unique_ptr<bench::TimedTrainStep> make_bench_step(NetworkImpl& model, const runtime::Runtime& rt,
                                                       const bench::TrainBenchOptions& options) {
  return std::make_unique<BenchStep>(model, rt, options);
}

}  // namespace convnets::train
