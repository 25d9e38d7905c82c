// OpenVINO's CPU runtime as a convnets engine: the exporter's ONNX graph, read from memory and compiled for the CPU.
#include "deploy/engine.h"

#include "core/cpu_features.h"
#include "core/error.h"
#include "data/loader.h"
#include "export/onnx_export.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <openvino/openvino.hpp>

#include <mutex>

namespace convnets::deploy {
namespace {

class OpenVinoEngine final : public Engine {
 public:
  explicit OpenVinoEngine(EngineSpec spec) : s_(std::move(spec)) {
    const auto& precision = s_.rt.precision;
    if (precision != "fp32" && precision != "bf16") {
      throw Error("--engine openvino: --precision " + precision + " is a GPU mode; the OpenVINO engine runs fp32 "
                  "or bf16 on the CPU (INT8 networks run as INT8 in either)",
                  "use --precision fp32 or bf16");
    }
    if (precision == "bf16") require_cpu_bf16("--engine openvino --precision");
    // The graph the exporter writes: BN folded (OpenVINO would fuse it
    // anyway), dynamic batch, and for a quantized network the QDQ graph of
    // its plan, which OpenVINO's low-precision passes turn into INT8 kernels.
    std::string bytes = std::move(s_.onnx);
    if (bytes.empty()) {
      OnnxOptions o;
      o.image_size = s_.pre.input_size;
      o.num_classes = s_.num_classes;
      o.dynamic_batch = true;
      o.fold_bn = true;
      o.int8 = s_.int8;
      o.metadata = {{"producer", "convnets engine"}};
      s_.model->eval();
      bytes = onnx_model_bytes(*s_.model, o);
    }
    try {
      auto model = core_.read_model(bytes, ov::Tensor());
      // Any batch (a file exported with a fixed one too), and float32 in and
      // out whatever the graph's dtype (an fp16 export converts inside).
      const auto side = static_cast<std::int64_t>(s_.pre.input_size);
      model->reshape(ov::PartialShape{-1, 3, side, side});
      ov::preprocess::PrePostProcessor ppp(model);
      ppp.input().tensor().set_element_type(ov::element::f32);
      ppp.output().tensor().set_element_type(ov::element::f32);
      model = ppp.build();
      // The precision is pinned, never left to the plugin: on a CPU with
      // native bf16 OpenVINO would otherwise run an "fp32" request in bf16.
      compiled_ = core_.compile_model(
          model, "CPU", ov::hint::inference_precision(precision == "bf16" ? ov::element::bf16 : ov::element::f32),
          ov::hint::performance_mode(ov::hint::PerformanceMode::LATENCY),
          ov::inference_num_threads(static_cast<std::int32_t>(at::get_num_threads())));
      request_ = compiled_.create_infer_request();
    } catch (const ov::Exception& e) {
      throw Error("--engine openvino could not compile " + s_.arch + " for the CPU: " + first_line(e.what()),
                  "use --engine torch for this network, or report the layer above");
    }
  }

  std::string name() const override { return "openvino"; }

  at::Tensor input(const at::Tensor& pixels) const override {
    // NCHW float, the graph's input, on this thread: LibTorch's parallel
    // normalisation would leave its pool spinning on OpenVINO's cores
    // (ResNet-50 batch 1 on 2 cores: 45 img/s, 55 with the pool asleep).
    return data::normalize_batch_serial(pixels, s_.pre.mean, s_.pre.std);
  }

  at::Tensor logits_of_input(const at::Tensor& input) const override {
    return run(input.to(c10::kCPU, at::kFloat).contiguous());
  }

 private:
  static std::string first_line(const std::string& s) {
    const auto end = s.find('\n');
    return end == std::string::npos ? s : s.substr(0, end);
  }

  at::Tensor run(const at::Tensor& x) const {
    const auto side = s_.pre.input_size;
    if (x.dim() != 4 || x.size(1) != 3 || x.size(2) != side || x.size(3) != side) {
      throw Error("--engine openvino: the graph was compiled for [B, 3, " + std::to_string(side) + ", " +
                  std::to_string(side) + "] input, got " + c10::str(x.sizes()));
    }
    const std::size_t batch = static_cast<std::size_t>(x.size(0));
    ov::Tensor in(ov::element::f32, ov::Shape{batch, 3, std::size_t(side), std::size_t(side)},
                  const_cast<float*>(x.data_ptr<float>()));  // borrowed: OpenVINO only reads it
    at::Tensor out = at::empty({x.size(0), s_.num_classes}, at::TensorOptions().dtype(at::kFloat));
    // One request per engine; a second caller (another Python thread) waits.
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      request_.set_input_tensor(in);
      request_.set_output_tensor(ov::Tensor(ov::element::f32, ov::Shape{batch, std::size_t(s_.num_classes)},
                                            out.data_ptr<float>()));
      request_.infer();
    } catch (const ov::Exception& e) {
      throw Error("--engine openvino: inference failed: " + first_line(e.what()));
    }
    return out;
  }

  EngineSpec s_;
  ov::Core core_;
  ov::CompiledModel compiled_;
  mutable ov::InferRequest request_;
  mutable std::mutex mutex_;
};

}  // namespace

bool openvino_available() { return true; }

std::string openvino_version() {
  // "2026.4.1-22982-e213a147257-releases/2026/4": the release is enough.
  const std::string build = ov::get_openvino_version().buildNumber;
  return build.substr(0, build.find('-'));
}

std::unique_ptr<Engine> make_openvino_engine(EngineSpec spec) { return std::make_unique<OpenVinoEngine>(std::move(spec)); }

}  // namespace convnets::deploy
