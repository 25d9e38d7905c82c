#include "deploy/engine.h"

#include "core/autocast.h"
#include "core/error.h"
#include "core/options.h"

#include <torch/torch.h>

namespace convnets::deploy {
namespace {

class TorchEngine final : public Engine {
 public:
  explicit TorchEngine(EngineSpec spec) : s_(std::move(spec)) { s_.model->eval(); }
  std::string name() const override { return "torch"; }

  at::Tensor input(const at::Tensor& pixels) const override {
    return runtime::network_input(pixels, s_.pre, s_.rt);  // checks the [B, H, W, 1|3] shape
  }

  at::Tensor logits_of_input(const at::Tensor& x) const override {
    const auto format = s_.rt.channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
    const auto input = x.to(s_.rt.device, s_.rt.autocast, /*non_blocking=*/false, /*copy=*/false, format);
    // NoGrad, not InferenceMode: the logits reach Python users, who may feed them to autograd.
    torch::NoGradGuard no_grad;
    AutocastGuard autocast(s_.rt.device, s_.rt.autocast);
    return s_.model->forward(input).to(at::kFloat);
  }

 private:
  EngineSpec s_;
};

}  // namespace

std::vector<std::string> engine_names() {
  if (openvino_available()) return {"torch", "openvino"};
  return {"torch"};
}

std::string resolve_engine(const std::string& engine, const runtime::Runtime& rt) {
  options::check(options::engine, engine);
  if (engine == "auto") return !rt.device.is_cuda() && openvino_available() ? "openvino" : "torch";
  if (engine == "openvino") {
    if (!openvino_available()) {
      throw Error(options::setting("engine", "openvino") + ": this convnets was built without OpenVINO's runtime",
                  "install the openvino wheel into .venv (scripts/setup.sh does) and rebuild, or use " +
                      options::setting("engine", "torch"));
    }
    if (rt.device.is_cuda()) {
      throw Error(options::setting("engine", "openvino") + " runs on the CPU, and this run's device is " +
                      rt.device.str(),
                  "add " + options::setting("device", "cpu") + ", or use " + options::setting("engine", "torch") +
                      " on the GPU");
    }
  }
  return engine;
}

std::unique_ptr<Engine> make_engine(const std::string& name, EngineSpec spec) {
  if (name == "openvino") return make_openvino_engine(std::move(spec));
  if (name != "torch") throw Error("engine " + name + ": expected torch or openvino");
  return std::make_unique<TorchEngine>(std::move(spec));
}

}  // namespace convnets::deploy
